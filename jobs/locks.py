"""Short Redis locks shared by all worker processes (per-target polling, beat singleton)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from functools import cache

import redis
from django.conf import settings


@cache
def redis_client() -> redis.Redis:
    url = settings.TRAINHUB_LOCK_REDIS_URL
    if url.startswith("redis+socket://"):  # kombu's spelling of a unix socket URL
        url = "unix://" + url.removeprefix("redis+socket://")
    return redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)


@contextlib.contextmanager
def try_lock(name: str, ttl_seconds: int) -> Iterator[bool]:
    """Yield True if this process got the lock; never blocks. The TTL bounds a crashed holder."""
    lock = redis_client().lock(f"trainhub:lock:{name}", timeout=ttl_seconds, blocking=False)
    acquired = lock.acquire(blocking=False)
    try:
        yield acquired
    finally:
        if acquired:
            with contextlib.suppress(redis.exceptions.LockError):
                lock.release()
