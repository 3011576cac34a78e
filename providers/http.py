"""HTTP for provider adapters: ``requests`` directly, the API key passed per call (never a
process-global like the runpod SDK's), a timeout on every call, and our own retries.

- 429 is retried after ``Retry-After`` (seconds or an HTTP date), else with exponential backoff
  and jitter; a wait longer than the policy allows fails at once as RateLimited, so a Celery
  task can reschedule instead of sleeping (``gpu_worker.retrying.RetryPolicy``, shared with the
  executor's transfers and the node's claim).
- 5xx, timeouts and dropped connections are retried only for idempotent calls. A call that
  spends money (a launch) is retried only when the provider surely did not act on it (a 429, a
  connection that never opened); anything else raises TransientProviderError with
  ``maybe_applied=True``, and the adapter looks before it launches again.
- Other 4xx are never retried. Failures become the provider error family with a message built
  from the body (RFC 9457 ``title``/``detail``, ``message``, ``error``/``msg``, or the text of an
  HTML page), the method and the path: no key, no query string (some providers take the key
  there).
- An optional shared RateLimiter is asked before every attempt.
"""

from __future__ import annotations

import email.utils
import re
import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, Protocol

import requests
from urllib3.exceptions import ConnectTimeoutError, NewConnectionError

from gpu_worker.retrying import RetryPolicy as RetryPolicy  # the one policy; re-exported here
from providers.errors import (
    InstanceNotFound,
    InvalidCredentials,
    PermanentProviderError,
    ProviderError,
    RateLimited,
    TransientProviderError,
)
from providers.ratelimit import shared_limiter

IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE"})
DEFAULT_RETRY = RetryPolicy()
_TAG = re.compile(r"<[^>]+>")
_SPACE = re.compile(r"\s+")


class Limiter(Protocol):
    def acquire(self, bucket: str) -> None: ...


class ProviderHTTP:
    """One provider's HTTP API at ``base_url`` (a setting: proxies, regions, tests)."""

    def __init__(
        self,
        *,
        provider: str,
        base_url: str,
        timeout: tuple[float, float] = (5.0, 30.0),  # connect, read
        retry: RetryPolicy = DEFAULT_RETRY,
        limiter: Limiter | None = None,
        auth_headers: Callable[[str], Mapping[str, str]] = lambda key: {
            "Authorization": f"Bearer {key}"
        },
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.provider = provider
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.retry = retry
        self.limiter = limiter
        self._auth_headers = auth_headers
        self._sleep = sleep
        self._local = threading.local()

    def _session(self) -> requests.Session:
        """One keep-alive session per thread: a poll cycle makes thousands of calls, and a
        fresh connection for each would cost more CPU than the call (Session is not
        thread-safe, so pollers running calls in parallel each get their own)."""
        session = getattr(self._local, "session", None)
        if session is None:
            session = self._local.session = requests.Session()
        return session

    def call(
        self,
        method: str,
        path: str,
        *,
        key: str,
        json: object = None,
        params: Mapping[str, Any] | None = None,
        idempotent: bool | None = None,
        bucket: str = "default",
    ) -> Any:
        """The decoded JSON body (None when empty). Raises a ProviderError subclass."""
        method = method.upper()
        safe = method in IDEMPOTENT_METHODS if idempotent is None else idempotent
        what = f"{self.provider} {method} {path}"
        headers = {"Accept": "application/json", **self._auth_headers(key)}

        def attempt() -> Any:
            if self.limiter is not None:
                self.limiter.acquire(bucket)
            try:
                response = self._session().request(
                    method,
                    self.base_url + path,
                    headers=headers,
                    json=json,
                    params=params,
                    timeout=self.timeout,
                )
            except requests.RequestException as exc:
                raise _connection_failure(exc, what) from None
            if response.ok:
                try:
                    return response.json() if response.content.strip() else None
                except ValueError:  # a proxy's page, a truncated body: not the API's answer
                    failure: ProviderError = TransientProviderError(
                        f"{what} returned HTTP {response.status_code} with a body that is "
                        f"not JSON: {describe_body(response, 120)}",
                        provider=self.provider,
                        status=response.status_code,
                    )
            else:
                failure = self._failure(response, what)
            if isinstance(failure, TransientProviderError) and not safe:
                failure.maybe_applied = True  # a 5xx after the provider may have acted
            raise failure

        def worth_retrying(failure: BaseException) -> bool:
            # A call that spends money is never repeated once the provider may have acted.
            maybe_applied = isinstance(failure, TransientProviderError) and failure.maybe_applied
            return (
                isinstance(failure, ProviderError)
                and failure.retryable
                and (safe or not maybe_applied)
            )

        return self.retry.call(attempt, retry_if=worth_retrying, sleep=self._sleep)

    def _failure(self, response: requests.Response, what: str) -> ProviderError:
        status = response.status_code
        message = f"{what} returned HTTP {status}"
        detail = describe_body(response)
        if detail:
            message += f": {detail}"
        body = _json_or_none(response)
        kwargs: dict[str, Any] = {
            "provider": self.provider,
            "status": status,
            "code": error_code(body),
            "body": body,
        }
        if status in (401, 403):
            return InvalidCredentials(message, **kwargs)
        if status in (404, 410):
            return InstanceNotFound(message, **kwargs)
        if status == 429:
            return RateLimited(message, retry_after=parse_retry_after(response), **kwargs)
        if status >= 500:
            return TransientProviderError(message, **kwargs)
        return PermanentProviderError(message, **kwargs)


def _connection_failure(exc: requests.RequestException, what: str) -> TransientProviderError:
    """A request that got no HTTP answer. It reached the provider unless the connection never
    opened (refused, unresolvable, connect timeout)."""
    reason = exc.args[0] if exc.args else None
    reason = getattr(reason, "reason", reason)
    never_sent = isinstance(exc, requests.ConnectTimeout) or isinstance(
        reason, NewConnectionError | ConnectTimeoutError
    )
    kind = type(exc).__name__
    return TransientProviderError(
        f"{what} failed: {kind} ({'no connection' if never_sent else 'no answer'})",
        maybe_applied=not never_sent,
    )


def _json_or_none(response: requests.Response) -> object:
    try:
        return response.json()
    except ValueError:
        return None


def error_code(body: object) -> str:
    """The machine-readable code of an error body: Lambda's ``{"error": {"code"}}``, Vast's
    ``{"error": "no_such_ask"}``, or a top-level ``code``; '' when there is none."""
    if not isinstance(body, dict):
        return ""
    error = body.get("error")
    if isinstance(error, dict):
        return str(error.get("code") or "")
    if isinstance(error, str) and error and " " not in error:
        return error
    code = body.get("code")
    return str(code) if isinstance(code, str | int) else ""


def describe_body(response: requests.Response, limit: int = 300) -> str:
    """What the provider said, whatever its error shape; '' for an empty body."""
    try:
        body = response.json()
    except ValueError:
        text = _SPACE.sub(" ", _TAG.sub(" ", response.text)).strip()
        return text[:limit]
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict):  # {"error": {"message": …}}
            body = {**body, **error}
        parts = [
            str(body[k])
            for k in ("title", "code", "detail", "message", "msg")
            if isinstance(body.get(k), str | int) and body.get(k) != ""
        ]
        if isinstance(error, str) and error:
            parts.insert(0, error)
        errors = body.get("errors")
        if isinstance(errors, list) and errors:
            first = errors[0]
            parts.append(
                str(first.get("detail") or first.get("message") or first)
                if isinstance(first, dict)
                else str(first)
            )
        return "; ".join(dict.fromkeys(parts))[:limit] or str(body)[:limit]
    return str(body)[:limit]


def parse_retry_after(response: requests.Response) -> float | None:
    """``Retry-After`` as seconds from now: an integer, or an HTTP date (RFC 9110)."""
    value = response.headers.get("Retry-After", "").strip()
    if not value:
        return None
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


def shared_http(
    provider: str, base_url: str, limits: Mapping[str, tuple[int, float]]
) -> ProviderHTTP:
    """The client of an adapter built from settings: paced by the installation's shared limiter."""
    return ProviderHTTP(
        provider=provider, base_url=base_url, limiter=shared_limiter(provider, limits)
    )
