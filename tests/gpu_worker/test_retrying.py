"""The one retry policy (gpu_worker.retrying): its delays, Retry-After and when it gives up.
Its users' own tests (providers/test_http.py, test_transfer.py, test_supervisor.py) check what
they retry."""

from __future__ import annotations

import pytest

from gpu_worker.retrying import RetryPolicy


class Busy(Exception):
    def __init__(self, retry_after: float | None = None) -> None:
        super().__init__("busy")
        self.retry_after = retry_after


class Broken(Exception):
    pass


def failing(*failures: Exception, result: str = "done") -> list[object]:
    """Calls of a function that raises ``failures`` in turn, then returns ``result``."""
    return [*failures, result]


def run(policy: RetryPolicy, outcomes: list[object]) -> tuple[object, list[float], int]:
    sleeps: list[float] = []
    calls = 0

    def attempt() -> object:
        nonlocal calls
        outcome = outcomes[min(calls, len(outcomes) - 1)]
        calls += 1
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    def retry_if(exc: BaseException) -> bool:
        return isinstance(exc, Busy)

    try:
        result: object = policy.call(attempt, retry_if=retry_if, sleep=sleeps.append)
    except Exception as exc:
        result = exc
    return result, sleeps, calls


def test_the_backoff_doubles_up_to_its_cap_with_jitter_between_half_and_whole() -> None:
    policy = RetryPolicy(backoff_seconds=0.5, backoff_max_seconds=30.0)
    for attempt, full in [(1, 0.5), (2, 1.0), (3, 2.0), (7, 30.0), (12, 30.0)]:
        for _ in range(20):
            assert full * 0.5 <= policy.backoff(attempt) <= full
    exact = RetryPolicy(backoff_seconds=2.0, jitter=False)
    assert [exact.backoff(n) for n in (1, 2, 3)] == [2.0, 4.0, 8.0]


def test_failures_are_retried_with_the_backoff_until_one_succeeds() -> None:
    policy = RetryPolicy(attempts=5, backoff_seconds=2.0, jitter=False)
    result, sleeps, calls = run(policy, failing(Busy(), Busy()))
    assert result == "done" and sleeps == [2.0, 4.0] and calls == 3


def test_a_retry_after_replaces_the_backoff_with_a_little_jitter() -> None:
    result, sleeps, _ = run(RetryPolicy(), failing(Busy(retry_after=2.0)))
    assert result == "done" and len(sleeps) == 1 and 2.0 <= sleeps[0] <= 2.25


def test_a_retry_after_past_the_policy_is_raised_at_once() -> None:
    policy = RetryPolicy(retry_after_max_seconds=60.0)
    result, sleeps, calls = run(policy, failing(Busy(retry_after=61.0)))
    assert isinstance(result, Busy) and result.retry_after == 61.0
    assert sleeps == [] and calls == 1


def test_a_failure_not_worth_retrying_is_raised_at_once() -> None:
    result, sleeps, calls = run(RetryPolicy(), failing(Broken()))
    assert isinstance(result, Broken) and sleeps == [] and calls == 1


def test_the_last_failure_itself_is_raised_after_the_attempts() -> None:
    last = Busy()
    result, sleeps, calls = run(
        RetryPolicy(attempts=3, jitter=False), failing(Busy(), Busy(), last)
    )
    assert result is last and calls == 3 and sleeps == [0.5, 1.0]


@pytest.mark.parametrize("attempts", [1, 2])
def test_the_attempts_count_the_first_try(attempts: int) -> None:
    _, sleeps, calls = run(RetryPolicy(attempts=attempts), failing(Busy(), Busy(), Busy()))
    assert calls == attempts and len(sleeps) == attempts - 1
