"""Bearer API keys, which project a request acts in, and how often a key may call."""

from __future__ import annotations

import time

from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import ImproperlyConfigured
from rest_framework import authentication, exceptions, throttling
from rest_framework.request import Request

from jobs.models import ApiKey, Project
from jobs.services.accounts.audit import Actor
from jobs.services.accounts.projects import api_key_authenticate, project_default_for_user
from trainhub.shared_redis import redis_client


class ApiKeyAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[object, ApiKey] | None:
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        scheme, _, raw = header.partition(" ")
        if scheme.lower() != "bearer":
            return None
        key = api_key_authenticate(raw=raw.strip())
        if key is None:
            raise exceptions.AuthenticationFailed("Invalid or revoked API key.")
        if not key.is_member:  # type: ignore[attr-defined]  # see pyproject [tool.mypy]
            raise exceptions.AuthenticationFailed(
                f"This API key's user is no longer a member of project '{key.project.slug}'."
            )
        return key.user, key

    def authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="api"'


def request_user(request: Request) -> User:
    """The signed-in user: every API view but the node and webhook ones requires one."""
    if not isinstance(request.user, User):
        raise exceptions.NotAuthenticated()
    return request.user


def request_project(request: Request) -> Project:
    """An API key acts in its own project; a browser session in the user's default project."""
    if isinstance(request.auth, ApiKey):
        return request.auth.project
    return project_default_for_user(user=request_user(request))


def request_actor(request: Request) -> Actor:
    """Who the audit trail says acted: the bearer key (its user and prefix), else the
    browser session's user."""
    if isinstance(request.auth, ApiKey):
        return Actor.api_key(request.auth)
    return Actor.api_user(request_user(request))


class ApiRateThrottle(throttling.BaseThrottle):
    """At most ``TRAINHUB_API_RATE_LIMIT`` requests ("<n>/<second|minute|hour|day>", or "off")
    per API key, or per user for a browser session, counted in a fixed window in Redis so every
    web worker shares the count. Over it: 429 with Retry-After (errors.exception_handler).
    Requests without a user (webhooks, GPU nodes) are left to their own checks."""

    def __init__(self) -> None:
        self._wait = 0.0

    def allow_request(self, request: Request, view: object) -> bool:
        limit = rate_limit()
        who = _rate_subject(request)
        if limit is None or who is None:
            return True
        count, window = limit
        now = time.time()
        start = int(now // window) * window
        key = f"trainhub:throttle:{who}:{window}:{start}"
        pipe = redis_client().pipeline()
        pipe.incr(key)
        pipe.expire(key, window + 1)
        used = int(pipe.execute()[0])
        if used <= count:
            return True
        self._wait = start + window - now
        return False

    def wait(self) -> float:
        return self._wait


_PERIODS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def rate_limit() -> tuple[int, int] | None:
    """The API rate from settings as (requests, window seconds); None when it is off."""
    raw = str(settings.TRAINHUB_API_RATE_LIMIT).strip().lower()
    if raw == "off":
        return None
    count, _, period = raw.partition("/")
    if not count.isdigit() or not period or period[0] not in _PERIODS:
        raise ImproperlyConfigured(
            f"TRAINHUB_API_RATE_LIMIT={raw!r}: write <requests>/<second|minute|hour|day>, "
            "e.g. 1200/minute, or off."
        )
    return int(count), _PERIODS[period[0]]


def _rate_subject(request: Request) -> str | None:
    if isinstance(request.auth, ApiKey):
        return f"key:{request.auth.pk}"
    user = getattr(request, "user", None)
    if isinstance(user, User):
        return f"user:{user.pk}"
    return None
