"""The shared rate limiter on the machine's real Redis: the window holds across independent
clients (as separate worker processes would be), waits are as long as the window needs, and a
wait longer than allowed is handed back as RateLimited."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
import redis
from django.conf import settings

from providers.errors import RateLimited
from providers.ratelimit import RateLimiter, account_tag


def _redis() -> redis.Redis:
    return redis.Redis.from_url(settings.CELERY_BROKER_URL)


@pytest.fixture
def provider() -> str:
    name = f"test-{uuid.uuid4().hex[:8]}"
    yield name
    client = _redis()
    client.delete(*client.keys(f"trainhub:ratelimit:{name}:*") or ["none"])


def test_calls_within_the_limit_pass_at_once_and_the_next_one_waits(provider: str) -> None:
    waits: list[float] = []

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        time.sleep(seconds)

    limiter = RateLimiter(_redis(), provider=provider, limits={"status": (5, 0.5)}, sleep=sleep)
    started = time.monotonic()
    for _ in range(5):
        limiter.acquire("status")
    assert waits == [] and time.monotonic() - started < 0.25

    limiter.acquire("status")  # the sixth waits for the first to leave the window
    assert 0.25 <= time.monotonic() - started <= 1.0
    assert waits and 0 < waits[0] <= 0.5


def test_buckets_and_providers_are_counted_apart(provider: str) -> None:
    limits = {"run": (1, 5.0), "cancel": (1, 5.0)}
    limiter = RateLimiter(_redis(), provider=provider, limits=limits, max_wait_seconds=0)
    limiter.acquire("run")
    limiter.acquire("cancel")
    with pytest.raises(RateLimited, match="1 calls per 5 s") as info:
        limiter.acquire("run")
    assert 4 < info.value.retry_after <= 5
    # A bucket with no limit (and no "default") is not limited.
    limiter.acquire("status")
    limiter.acquire("status")
    # Another provider has its own window.
    RateLimiter(_redis(), provider=f"{provider}-2", limits=limits, max_wait_seconds=0).acquire(
        "run"
    )
    _redis().delete(f"trainhub:ratelimit:{provider}-2:run")


def test_each_account_has_its_own_buckets(provider: str) -> None:
    """Providers limit each API key: one project's launches do not use up another's."""
    limits = {"launch": (1, 12.5)}
    first = account_tag("key-of-project-a")
    second = account_tag("key-of-project-b")
    assert first != second and len(first) == 16 and "project" not in first

    def limiter(account: str) -> RateLimiter:
        return RateLimiter(
            _redis(), provider=provider, limits=limits, account=account, max_wait_seconds=0
        )

    limiter(first).acquire("launch")
    limiter(second).acquire("launch")  # another account: its own slot, no wait
    with pytest.raises(RateLimited):
        limiter(first).acquire("launch")  # the same account: waits out its 12.5 s
    assert _redis().exists(f"trainhub:ratelimit:{provider}:{first}:launch")
    assert account_tag("") == ""


def test_the_window_holds_across_independent_clients(provider: str) -> None:
    """Four workers with their own Redis connections, 12 calls each, limit 10 per 0.5 s: no
    0.5 s window ever sees more than 10 calls, and all 48 get through."""
    stamps: list[float] = []
    lock = threading.Lock()

    def worker() -> None:
        limiter = RateLimiter(_redis(), provider=provider, limits={"default": (10, 0.5)})
        for _ in range(12):
            limiter.acquire("status")
            with lock:
                stamps.append(time.monotonic())

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(stamps) == 48
    stamps.sort()
    # Redis's clock books in ms; allow 20 ms of scheduling skew between booking and stamping.
    busiest = max(sum(1 for s in stamps if start <= s < start + 0.48) for start in stamps)
    assert busiest <= 10
    assert stamps[-1] - stamps[0] >= 4 * 0.5 - 0.1, "48 calls at 10 per 0.5 s need >= 2 s"
