"""Service-layer errors. The API turns each into an OpenAI-shaped error with its HTTP status."""

from __future__ import annotations

from typing import Any


class ServiceError(Exception):
    http_status = 400
    error_type = "invalid_request_error"

    def __init__(self, message: str, *, code: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.param = param


class InvalidRequest(ServiceError):
    pass


class NotFound(ServiceError):
    http_status = 404


class Conflict(ServiceError):
    http_status = 409


class PermissionDenied(ServiceError):
    """Authenticated, but not in the way this route takes (a session where a key is needed)."""

    http_status = 403
    error_type = "permission_error"


class Unavailable(ServiceError):
    """The server cannot serve this now (storage lost or unreachable): not the client's fault."""

    http_status = 503
    error_type = "server_error"


class LengthRequired(ServiceError):
    """A body whose size is not declared up front (no Content-Length) where one is needed."""

    http_status = 411


class PayloadTooLarge(ServiceError):
    """The request body, or a file in it, is larger than a limit: refused while it streams."""

    http_status = 413


class QuotaExceeded(ServiceError):
    """Storing this would take the project past one of its storage quotas."""

    http_status = 403
    error_type = "permission_error"


class LimitExceeded(ServiceError):
    http_status = 429
    error_type = "rate_limit_error"


class InvalidTransition(Conflict):
    def __init__(self, current: str, target: str) -> None:
        super().__init__(
            f"A job in status '{current}' cannot move to '{target}'.",
            code="invalid_status_transition",
        )
        self.current = current
        self.target = target


class ProviderUnavailable(ServiceError):
    """A cloud provider's API failed to answer a request made on the client's behalf."""

    http_status = 502
    error_type = "server_error"


def error_body(
    message: str, *, type: str, code: str | None = None, param: str | None = None
) -> dict[str, Any]:
    """The one shape of an error response (OpenAI's): the API and the transfer routes use it."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}
