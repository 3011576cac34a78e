"""Short Redis locks shared by all worker processes (per-target polling, beat singleton)."""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Iterator
from typing import ParamSpec

import redis

from trainhub.shared_redis import redis_client

log = logging.getLogger(__name__)
P = ParamSpec("P")


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


def single_runner(
    name: str | Callable[..., str], ttl_seconds: int
) -> Callable[[Callable[P, object]], Callable[P, None]]:
    """Run the decorated function only where ``try_lock(name)`` is won; elsewhere it is skipped
    (logged). ``name`` may be built from the call's arguments (one poller per target)."""

    def decorate(func: Callable[P, object]) -> Callable[P, None]:
        @functools.wraps(func)
        def guarded(*args: P.args, **kwargs: P.kwargs) -> None:
            lock = name(*args, **kwargs) if callable(name) else name
            with try_lock(lock, ttl_seconds=ttl_seconds) as acquired:
                if acquired:
                    func(*args, **kwargs)
                else:
                    log.info("%s skipped: another run holds the lock", lock)

        return guarded

    return decorate
