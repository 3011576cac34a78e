"""A per-provider, per-account rate limiter shared by every worker process, kept in Redis.

A sliding window per (provider, account, bucket): at most ``limit`` calls in any ``window``
seconds, counted across all processes and machines that share the Redis. Providers limit each
account (API key) on its own (Lambda's launch 1 per 12 s, Vast's per-identity intervals), so
two projects with their own keys do not share, or eat into, one budget; the account is a hash
of the key, never the key. One Lua script does the check
and the booking atomically, on Redis's own clock, so workers with skewed clocks agree.
A caller that would wait longer than ``max_wait_seconds`` gets RateLimited instead (a Celery
task then retries later rather than holding a worker).
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from providers.errors import RateLimited

# Returns 0 when a call was booked, else how many milliseconds until the oldest one leaves.
_BOOK = """
local now = redis.call('TIME')
now = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local limit, window = tonumber(ARGV[1]), tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
if redis.call('ZCARD', KEYS[1]) < limit then
  redis.call('ZADD', KEYS[1], now, ARGV[3])
  redis.call('PEXPIRE', KEYS[1], window)
  return 0
end
local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return math.max(1, tonumber(oldest[2]) + window - now)
"""


class RateLimiter:
    """``limits``: bucket -> (calls, window seconds), e.g. RunPod serverless
    ``{"run": (1000, 10), "status": (2000, 10), "cancel": (100, 10)}``. A bucket without a
    limit (and no ``"default"``) is not limited."""

    def __init__(
        self,
        redis_client: Any,
        *,
        provider: str,
        limits: Mapping[str, tuple[int, float]],
        account: str = "",
        max_wait_seconds: float = 30.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._book = redis_client.register_script(_BOOK)
        self.provider = provider
        self.account = account  # account_tag(key); '' shares one set of buckets per provider
        self.limits = dict(limits)
        self.max_wait_seconds = max_wait_seconds
        self._sleep = sleep

    def acquire(self, bucket: str = "default") -> None:
        """Book one call in ``bucket``, sleeping until the window allows it."""
        limit = self.limits.get(bucket, self.limits.get("default"))
        if limit is None:
            return
        calls, window = limit
        scope = f"{self.provider}:{self.account}" if self.account else self.provider
        key = f"trainhub:ratelimit:{scope}:{bucket}"
        waited = 0.0
        while True:
            wait_ms = int(
                self._book(keys=[key], args=[calls, int(window * 1000), uuid.uuid4().hex])
            )
            if wait_ms == 0:
                return
            if waited + wait_ms / 1000 > self.max_wait_seconds:
                raise RateLimited(
                    f"{self.provider} {bucket}: trainhub's own limit of {calls} calls per "
                    f"{window:g} s is reached; try again in {wait_ms / 1000:.1f} s",
                    provider=self.provider,
                    retry_after=wait_ms / 1000,
                )
            self._sleep(wait_ms / 1000)
            waited += wait_ms / 1000


def account_tag(api_key: str) -> str:
    """The account an API key stands for, as a limiter key part: a hash, never the key."""
    return hashlib.sha256(api_key.encode()).hexdigest()[:16] if api_key else ""


def shared_limiter(
    provider: str, limits: Mapping[str, tuple[int, float]], *, api_key: str = ""
) -> RateLimiter:
    """The limiter every process of this installation shares (the lock Redis); with
    ``api_key``, the buckets of that account only."""
    from trainhub.shared_redis import redis_client  # lazy: the control plane's Redis settings

    return RateLimiter(
        redis_client(), provider=provider, limits=limits, account=account_tag(api_key)
    )
