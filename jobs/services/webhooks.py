"""Provider webhooks: a per-attempt URL carrying the attempt's signed id and when it was issued.

A call only triggers a poll of that attempt (api.webhook_views), so a forged body moves nothing.
The URL is valid for the attempt's run and a margin, then refused (403): a URL that leaked (a
provider's log, a proxy's) does not let anyone make the control plane poll forever, and calls
for one attempt send at most one poll per ``POLL_GAP_SECONDS``.
"""

from __future__ import annotations

from django.conf import settings
from django.core import signing
from django.urls import reverse

from jobs.errors import NotFound, ServiceError
from jobs.locks import redis_client
from jobs.models import JobAttempt

# v2: tokens carry their issue time (v1 tokens, without one, no longer verify).
WEBHOOK_SALT = "trainhub.provider-webhook.v2"
# The provider calls back when the run ends: within the job's max runtime of the launch, plus
# the time it may sit in the provider's queue first (RunPod's ttl allows 6 h) and a stop.
WEBHOOK_SLACK_SECONDS = 7 * 3600
POLL_GAP_SECONDS = 5


class WebhookExpired(ServiceError):
    http_status = 403
    error_type = "permission_error"


def _signer() -> signing.TimestampSigner:
    return signing.TimestampSigner(salt=WEBHOOK_SALT)


def webhook_url(attempt: JobAttempt) -> str:
    """A per-attempt URL the provider may call on completion ('' without a public address)."""
    if not settings.TRAINHUB_PUBLIC_URL:
        return ""
    token = _signer().sign(str(attempt.pk))
    return settings.TRAINHUB_PUBLIC_URL.rstrip("/") + reverse("provider-webhook", args=[token])


def webhook_attempt(token: str) -> int | None:
    """The live attempt ``token`` names (its pk), or None when that attempt has ended (nothing
    left to poll). Raises NotFound for a token this control plane did not sign (or whose
    attempt is gone) and WebhookExpired once the attempt's max runtime and the slack have
    passed since the token was issued."""
    signer = _signer()
    try:
        attempt_pk = int(signer.unsign(token))
    except (signing.BadSignature, ValueError):
        raise NotFound("No such webhook.", code="not_found") from None
    row = (
        JobAttempt.objects.filter(pk=attempt_pk)
        .values_list("job__max_runtime_seconds", "ended_at")
        .first()
    )
    if row is None:
        raise NotFound("No such webhook.", code="not_found")
    max_runtime, ended_at = row
    valid_for = max_runtime + WEBHOOK_SLACK_SECONDS
    try:
        signer.unsign(token, max_age=valid_for)
    except signing.SignatureExpired:
        raise WebhookExpired(
            f"This webhook URL expired: it is valid for {valid_for} s after its attempt was "
            "launched (the job's max runtime and a margin).",
            code="webhook_expired",
        ) from None
    return None if ended_at is not None else attempt_pk


def webhook_poll_due(attempt_pk: int) -> bool:
    """True for the first call about ``attempt_pk`` in ``POLL_GAP_SECONDS`` (shared by every
    web process through Redis): repeated calls send no further polls meanwhile."""
    key = f"trainhub:webhook-poll:{attempt_pk}"
    return bool(redis_client().set(key, "1", nx=True, ex=POLL_GAP_SECONDS))
