"""The one retry policy of trainhub's outbound calls: provider APIs (``providers.http``), the
executor's file transfers (``gpu_worker.transfer``) and a GPU node's claim
(``gpu_worker.agent.supervisor``). tenacity runs the loop; this module says how long to wait.

- The n-th retry waits ``backoff_seconds * 2**(n-1)``, capped at ``backoff_max_seconds``; with
  ``jitter`` that is scaled by a random factor in [0.5, 1), so callers failing together spread
  out.
- A failure carrying a server's ``Retry-After`` (a ``retry_after`` attribute, in seconds)
  waits that long plus up to 10% (and 50 ms) instead. One longer than
  ``retry_after_max_seconds`` is raised at once: a Celery task can reschedule itself rather
  than hold a worker asleep.
- After ``attempts`` tries, or on a failure ``retry_if`` refuses, the failure itself is raised.

Django-free, like all of gpu_worker: the control plane's adapters import it from here.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import tenacity

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 5  # tries in all, the first included
    backoff_seconds: float = 0.5  # the first delay; doubles
    backoff_max_seconds: float = 30.0
    retry_after_max_seconds: float = 60.0  # a longer Retry-After is returned to the caller
    jitter: bool = True

    def backoff(self, attempt: int) -> float:
        """The wait after the ``attempt``-th try failed without a Retry-After."""
        delay = min(self.backoff_max_seconds, self.backoff_seconds * 2.0 ** (attempt - 1))
        return delay * random.uniform(0.5, 1.0) if self.jitter else delay  # noqa: S311 - jitter

    def delay(self, attempt: int, failure: BaseException | None) -> float:
        """The wait after the ``attempt``-th try failed with ``failure``."""
        retry_after = retry_after_of(failure)
        if retry_after is not None:
            return retry_after + random.uniform(0, 0.1 * retry_after + 0.05)  # noqa: S311
        return self.backoff(attempt)

    def call(
        self,
        attempt: Callable[[], T],
        *,
        retry_if: Callable[[BaseException], bool],
        sleep: Callable[[float], None] = time.sleep,
    ) -> T:
        """``attempt()``'s result, trying again while it raises a failure ``retry_if`` accepts."""

        def give_up(state: tenacity.RetryCallState) -> bool:
            retry_after = retry_after_of(_failure(state))
            too_long = retry_after is not None and retry_after > self.retry_after_max_seconds
            return too_long or state.attempt_number >= self.attempts

        def wait(state: tenacity.RetryCallState) -> float:
            return self.delay(state.attempt_number, _failure(state))

        retrying = tenacity.Retrying(
            stop=give_up,
            wait=wait,
            retry=tenacity.retry_if_exception(retry_if),
            sleep=sleep,
            reraise=True,
        )
        return retrying(attempt)


def retry_after_of(failure: BaseException | None) -> float | None:
    """The server's Retry-After a failure carries, in seconds; None when it has none."""
    value = getattr(failure, "retry_after", None)
    return float(value) if isinstance(value, int | float) else None


def _failure(state: tenacity.RetryCallState) -> BaseException | None:
    return state.outcome.exception() if state.outcome is not None else None
