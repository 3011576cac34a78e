"""Lambda's error codes mapped to the provider error family, whatever HTTP status they came
with (``{"error": {"code", "message"}}``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from providers.errors import (
    InstanceNotFound,
    InvalidCredentials,
    NoCapacity,
    ProviderError,
    QuotaExceeded,
    TransientProviderError,
)

# Lambda's error code -> what it means to the control plane, whatever the HTTP status.
ERROR_CODES: Mapping[str, type[ProviderError]] = {
    "instance-operations/launch/insufficient-capacity": NoCapacity,
    # The account's quota, not Lambda's stock: every other offer would be refused the same way
    # (each try spending 12.5 s of the launch bucket), so the launch stops here.
    "global/quota-exceeded": QuotaExceeded,
    "global/invalid-api-key": InvalidCredentials,
    "global/account-inactive": InvalidCredentials,
    "global/object-does-not-exist": InstanceNotFound,
}


def translate(exc: ProviderError) -> ProviderError:
    """The family member Lambda's error code stands for; ``exc`` itself when it adds nothing."""
    kind = ERROR_CODES.get(exc.code)
    if kind is None and exc.code.startswith("provider/") and not exc.retryable:
        kind = TransientProviderError  # an upstream failure at Lambda: usually passes
    if kind is None or isinstance(exc, kind):
        return exc  # a 429 or 5xx keeps its Retry-After and maybe_applied
    message = exc.message
    if exc.code == "global/quota-exceeded":
        message += (
            " (the Lambda account's quota is reached, not a shortage at Lambda: ask Lambda to "
            "raise it, or end other instances)"
        )
    fields: dict[str, Any] = {
        "provider": exc.provider,
        "status": exc.status,
        "code": exc.code,
        "body": exc.body,
    }
    if kind is TransientProviderError:
        applied = bool(getattr(exc, "maybe_applied", False))
        return TransientProviderError(message, maybe_applied=applied, **fields)
    return kind(message, **fields)
