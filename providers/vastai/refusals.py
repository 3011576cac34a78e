"""What Vast's error answers mean to the control plane. Vast puts a bare error code in
``error`` or ``msg``, sometimes in a 2xx answer with ``"success": false``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from providers.errors import InstanceNotFound, NoCapacity, PermanentProviderError, ProviderError
from providers.vastai.api import TARGET

# A destroy refused with one of these: the instance is gone already.
GONE_CODES = frozenset({"no_such_instance", "not_found"})


# Refusals that say "not this offer, not at this price, now": the next offer is tried (and the
# job waits when none is left) instead of the attempt failing. ``invalid_price``: a bid below
# the ask's current minimum (the market moved since the offers were listed).
NOT_NOW = {
    "no_such_ask": "is no longer available",
    "invalid_price": "refused the bid as below its current minimum",
}


def create_failure(exc: ProviderError, offer_id: str) -> ProviderError:
    """What a refused ``PUT /asks/{id}/`` means to the caller."""
    code = error_code(exc.body) or exc.code
    if code in NOT_NOW or (isinstance(exc, InstanceNotFound) and not code):
        # 404: the offer is gone; 410: it cannot start now (cancel_unavail).
        why = NOT_NOW.get(code, NOT_NOW["no_such_ask"])
        return NoCapacity(
            f"Vast.ai offer {offer_id} {why} ({exc.message}); choose another",
            provider=TARGET,
            status=exc.status,
            code=code,
            body=exc.body,
        )
    if isinstance(exc, InstanceNotFound):  # a 404/410 that is not about the offer
        return PermanentProviderError(
            exc.message, provider=TARGET, status=exc.status, code=code, body=exc.body
        )
    return exc


def refusal(body: Mapping[str, Any], offer_id: str) -> ProviderError:
    """A create answered 2xx with ``"success": false``."""
    code = error_code(body)
    message = f"Vast.ai refused to rent offer {offer_id}: {said(body)}"
    error = NoCapacity if code in NOT_NOW else PermanentProviderError
    return error(message, provider=TARGET, code=code, body=dict(body))


def error_code(body: object) -> str:
    """Vast's error code: ``error``, or a ``msg`` that is a bare code (some routes put it
    there, e.g. ``{"success": false, "msg": "no_such_ask"}``)."""
    if not isinstance(body, dict):
        return ""
    for key in ("error", "msg"):
        value = body.get(key)
        if isinstance(value, str) and value and " " not in value:
            return value
    return ""


def said(body: Mapping[str, Any]) -> str:
    """What Vast said in an error answer, for a message."""
    parts = [str(body[k]) for k in ("error", "msg", "message") if body.get(k)]
    return "; ".join(dict.fromkeys(parts)) or str(dict(body))[:200]
