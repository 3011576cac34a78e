"""Provider webhooks: a per-attempt URL carrying the attempt's signed id and when it was issued.

A call only triggers a poll of that attempt (api.webhook_views), so a forged body moves nothing.
The URL is valid for the attempt's run and a margin, then refused (403): a URL that leaked (a
provider's log, a proxy's) does not let anyone make the control plane poll forever, and calls
for one attempt send at most one poll per ``POLL_GAP_SECONDS``.

Orphan RunPod jobs: after a ``/run`` whose answer was lost, trainhub submits the attempt again
and RunPod may run both (RunPod cannot list jobs, so the first one's id is never learnt from
it). The body of a webhook (RunPod sends the job's ``/status`` object, ``id`` included) is the
one place such a job shows itself: a job id that no attempt of the target owns is noted once
(``ORPHANS_SEEN_METRIC`` counts them), and the reconciler cancels it with the key of the
attempt whose URL it called (``reconcile.orphan_jobs_cancel``, ``ORPHANS_CANCELLED_METRIC``).
A forged body can at most have a job cancelled that no attempt owns.
"""

from __future__ import annotations

import logging
import re
from typing import cast

from django.conf import settings
from django.core import signing
from django.urls import reverse

from jobs.errors import NotFound, ServiceError
from jobs.models import JobAttempt
from jobs.services.outbox import messages
from trainhub.shared_redis import redis_client

log = logging.getLogger(__name__)

# v2: tokens carry their issue time (v1 tokens, without one, no longer verify).
WEBHOOK_SALT = "trainhub.provider-webhook.v2"
# The provider calls back when the run ends: within the job's max runtime of the launch, plus
# the time it may sit in the provider's queue first (RunPod's ttl allows 6 h) and a stop.
WEBHOOK_SLACK_SECONDS = 7 * 3600
POLL_GAP_SECONDS = 5
# Provider jobs that no attempt owns: job id -> the pk of the attempt whose webhook named it,
# until the reconciler has cancelled them; each counted once (seen for a week).
ORPHANS_PENDING_KEY = "trainhub:runpod-orphans:pending"
ORPHAN_SEEN_PREFIX = "trainhub:runpod-orphans:seen:"
ORPHAN_SEEN_SECONDS = 7 * 24 * 3600
ORPHANS_SEEN_METRIC = "trainhub:metrics:runpod_orphan_jobs_seen"
ORPHANS_CANCELLED_METRIC = "trainhub:metrics:runpod_orphan_jobs_cancelled"
_JOB_ID = re.compile(r"^[A-Za-z0-9_-]{1,128}$")  # RunPod's ids, e.g. 60902e6c-…-u1


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
    return cast(str, settings.TRAINHUB_PUBLIC_URL).rstrip("/") + reverse(
        "provider-webhook", args=[token]
    )


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


def webhook_received(*, token: str, body: object) -> None:
    """A provider called an attempt's webhook URL: poll that attempt at once (at most once per
    ``POLL_GAP_SECONDS``) and note a provider job the body names that no attempt owns. Raises
    like ``webhook_attempt`` for a URL this control plane did not sign or that expired."""
    attempt_pk = webhook_attempt(token)
    if attempt_pk is not None and webhook_poll_due(attempt_pk):
        messages.send_poll_attempt(attempt_pk)
    job_id = body.get("id") if isinstance(body, dict) else None
    if isinstance(job_id, str) and _JOB_ID.match(job_id):
        webhook_job_seen(attempt_pk=int(_signer().unsign(token)), job_id=job_id)


def webhook_job_seen(*, attempt_pk: int, job_id: str) -> bool:
    """Note ``job_id``, named by a webhook of attempt ``attempt_pk``, for cancelling when no
    attempt of that target owns it; True the first time it is noted (and counted). A job an
    ended attempt owns is not an orphan: the stop flow ends it."""
    row = (
        JobAttempt.objects.filter(pk=attempt_pk)
        .values_list("target", "provider_instance_id", "ended_at")
        .first()
    )
    if row is None:
        return False
    target, own_id, ended_at = row
    if job_id == own_id or (not own_id and ended_at is None):
        return False  # its own job, or its launch is storing the id right now
    if JobAttempt.objects.filter(target=target, provider_instance_id=job_id).exists():
        return False
    client = redis_client()
    if not client.set(ORPHAN_SEEN_PREFIX + job_id, attempt_pk, nx=True, ex=ORPHAN_SEEN_SECONDS):
        return False  # noted before (RunPod repeats a webhook that was not answered 200)
    client.incr(ORPHANS_SEEN_METRIC)
    client.hset(ORPHANS_PENDING_KEY, job_id, attempt_pk)
    log.warning(
        "%s job %s, named by attempt %s's webhook, is owned by no attempt (a duplicate run "
        "of an ambiguous launch?); the reconciler cancels it",
        target, job_id, attempt_pk,
    )  # fmt: skip
    return True


def orphan_jobs_pending() -> dict[str, int]:
    """Provider jobs noted as owned by no attempt and not cancelled yet: job id -> the pk of
    the attempt whose webhook named it."""
    pending = redis_client().hgetall(ORPHANS_PENDING_KEY)
    return {_text(k): int(v) for k, v in pending.items()}


def orphan_job_done(*, job_id: str, cancelled: bool) -> None:
    """Forget a pending orphan job; ``cancelled``: the provider confirmed the cancel (counted)."""
    client = redis_client()
    if client.hdel(ORPHANS_PENDING_KEY, job_id) and cancelled:
        client.incr(ORPHANS_CANCELLED_METRIC)


def orphan_job_metrics() -> dict[str, int]:
    """The orphan-job counters: seen (noted from a webhook) and cancelled."""
    seen, cancelled = redis_client().mget(ORPHANS_SEEN_METRIC, ORPHANS_CANCELLED_METRIC)
    return {"seen": int(seen or 0), "cancelled": int(cancelled or 0)}


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
