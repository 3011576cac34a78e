"""Webhook deliveries: one signed, SSRF-checked try at a time, retried with backoff for the
retry window, at least once, and endpoints that keep failing switched off.

- A try first *claims* the delivery (a conditional UPDATE: pending, due, not held by another
  worker), so a duplicate message or the beat's re-send finds it taken; the hold
  (``locked_until``) outlasts the POST's own time limit, and a worker that dies mid-try leaves a
  hold that simply runs out. Nothing is locked in the database while the POST runs.
- The POST goes through ``jobs.outbound_http``: the URL and every address its host resolves to
  are checked again at each try (a DNS answer may have changed since the endpoint was saved),
  the connection goes to a checked address, redirects are failures.
- Every try is signed afresh (Standard Webhooks: ``webhook-timestamp`` is the try's time, and
  receivers refuse stale ones) under the same ``webhook-id``, with the current secret and,
  during a rotation's overlap, the previous one.
- A failed try is retried after 5 s, 15 s, 45 s … (x3, at most 3 h between tries, ±10 %), and
  once more at the end of the window; then the delivery is ``failed``. The beat's
  ``webhooks_due`` sends the retries that are due.
- An endpoint whose every try has failed for ``TRAINHUB_WEBHOOK_DISABLE_AFTER_SECONDS`` (5 days)
  is disabled with the reason, and the project's members are told by email.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.core.mail import send_mail
from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from jobs import outbound_http, webhook_signing
from jobs.errors import Conflict
from jobs.models import ProjectMembership, WebhookAttempt, WebhookDelivery, WebhookEndpoint
from jobs.services.outbound.webhook_endpoints import endpoint_signing_secrets, url_policy
from jobs.services.outbox import messages
from trainhub_contract import celery_conf as cc

log = logging.getLogger(__name__)

S = WebhookDelivery.Status
FIRST_RETRY_SECONDS = 5.0
BACKOFF_FACTOR = 3.0
MAX_RETRY_DELAY_SECONDS = 3 * 3600.0
JITTER = 0.1
# How long a worker holds a delivery while it tries: longer than the POST can take.
HOLD = timedelta(seconds=outbound_http.TOTAL_TIMEOUT_SECONDS + 20)
# A first try is sent on commit; the beat takes over only if that message went missing.
FIRST_TRY_GRACE = timedelta(seconds=60)
DUE_BATCH = 2000


def retry_delay(tries: int) -> float:
    """Seconds from the ``tries``-th failed try to the next one (exponential, capped, with
    jitter so a receiver that comes back is not hit by every retry at once)."""
    base = min(FIRST_RETRY_SECONDS * BACKOFF_FACTOR ** max(0, tries - 1), MAX_RETRY_DELAY_SECONDS)
    return base * random.uniform(1 - JITTER, 1 + JITTER)  # noqa: S311 (spreading, not secrecy)


def next_try_at(delivery: WebhookDelivery, now: datetime) -> datetime | None:
    """When to try again, or None once the retry window is over. The last retry falls on
    the window's end, so a receiver down for most of a day still gets the message."""
    window_end = delivery.created_at + timedelta(
        seconds=settings.TRAINHUB_WEBHOOK_RETRY_WINDOW_SECONDS
    )
    if now >= window_end:
        return None
    return min(now + timedelta(seconds=retry_delay(delivery.attempts)), window_end)


@dataclass(frozen=True)
class TryResult:
    delivery: WebhookDelivery
    answer: outbound_http.Answer


def delivery_try(*, delivery_pk: int) -> TryResult | None:
    """One try of a due delivery; None if it is not due, not pending or held by another
    worker (a duplicate message)."""
    now = timezone.now()
    delivery = _claim(delivery_pk, now)
    if delivery is None:
        return None
    endpoint = WebhookEndpoint.objects.get(pk=delivery.endpoint_id)
    delivery.endpoint = endpoint
    if not endpoint.enabled:
        reason = endpoint.disabled_reason or "disabled"
        answer = outbound_http.Answer(None, 0, error=f"not sent: the endpoint is {reason}")
        _record(delivery, answer, now, give_up=True)
        return TryResult(delivery, answer)
    answer = _post(delivery, endpoint, now)
    _record(delivery, answer, now)
    return TryResult(delivery, answer)


# The claim and the read of what was claimed in one statement (PostgreSQL and SQLite >= 3.35
# both have RETURNING): a delivery's try is a handful of statements, and at hundreds a second
# each round trip counts (docs/BENCHMARKS.md).
_CLAIM = (
    "UPDATE jobs_webhookdelivery SET locked_until = %s, attempts = attempts + 1, "
    "last_attempt_at = %s WHERE id = %s AND status = %s AND next_attempt_at <= %s "
    "AND (locked_until IS NULL OR locked_until < %s) RETURNING *"
)


def _claim(delivery_pk: int, now: datetime) -> WebhookDelivery | None:
    """Hold a due, pending, unheld delivery for this try (attempts + 1); None if another
    worker has it, or it is not due or not pending."""
    at = connection.ops.adapt_datetimefield_value(now)
    until = connection.ops.adapt_datetimefield_value(now + HOLD)
    rows = list(WebhookDelivery.objects.raw(_CLAIM, [until, at, delivery_pk, S.PENDING, at, at]))
    return rows[0] if rows else None


def _post(
    delivery: WebhookDelivery, endpoint: WebhookEndpoint, now: datetime
) -> outbound_http.Answer:
    allow_http, allowed = url_policy()
    try:
        target = outbound_http.parse_url(endpoint.url, allow_http=allow_http)
        addresses = outbound_http.checked_addresses(target, allowed)
    except outbound_http.UrlRefused as exc:
        return outbound_http.Answer(None, 0, error=f"not sent: {exc}"[:500])
    body = delivery.body.encode()
    headers = webhook_signing.headers(
        endpoint_signing_secrets(endpoint, now),
        message_id=delivery.message_id,
        timestamp=int(time.time()),
        body=body,
    )
    return outbound_http.post(
        target, addresses, body, headers, ca_file=settings.TRAINHUB_WEBHOOK_CA_BUNDLE or None
    )


def _record(
    delivery: WebhookDelivery,
    answer: outbound_http.Answer,
    started: datetime,
    *,
    give_up: bool = False,
) -> None:
    """Log the try, settle or reschedule the delivery, and keep the endpoint's failure streak."""
    now = timezone.now()
    update: dict[str, object] = {
        "locked_until": None,
        "last_status_code": answer.status_code,
        "last_error": answer.error[:500],
    }
    if answer.ok:
        update.update(status=S.SUCCEEDED, delivered_at=now, next_attempt_at=None)
    else:
        retry = None if give_up else next_try_at(delivery, now)
        update.update(status=S.PENDING if retry else S.FAILED, next_attempt_at=retry)
    disabled_endpoint = None
    with transaction.atomic():
        WebhookAttempt.objects.create(
            delivery_id=delivery.pk,
            number=delivery.attempts,
            started_at=started,
            status_code=answer.status_code,
            latency_ms=answer.latency_ms,
            response_excerpt=answer.excerpt[: outbound_http.EXCERPT_BYTES],
            error=answer.error[:500],
        )
        WebhookDelivery.objects.filter(pk=delivery.pk).update(**update)
        if not give_up:
            disabled_endpoint = _streak(delivery.endpoint, ok=answer.ok, now=now)
    for name, value in update.items():
        setattr(delivery, name, value)
    if disabled_endpoint is not None:
        _tell_members(disabled_endpoint)


def _streak(endpoint: WebhookEndpoint, *, ok: bool, now: datetime) -> WebhookEndpoint | None:
    """Track the endpoint's run of failures; returns it if this failure disabled it."""
    rows = WebhookEndpoint.objects.filter(pk=endpoint.pk)
    if ok:
        if endpoint.failing_since is not None:
            rows.update(failing_since=None)
        return None
    if endpoint.failing_since is None:
        rows.filter(failing_since__isnull=True).update(failing_since=now)
        return None
    limit = timedelta(seconds=settings.TRAINHUB_WEBHOOK_DISABLE_AFTER_SECONDS)
    if now - endpoint.failing_since < limit:
        return None
    days = limit.total_seconds() / 86400
    reason = (
        f"auto-disabled: every delivery failed for {days:g} days (since "
        f"{endpoint.failing_since:%Y-%m-%d %H:%M} UTC)"
    )
    if not rows.filter(enabled=True).update(enabled=False, disabled_reason=reason):
        return None  # another worker disabled it first (and tells the members)
    endpoint.enabled, endpoint.disabled_reason = False, reason
    log.warning("webhook endpoint %s %s", endpoint.public_id, reason)
    return endpoint


def _tell_members(endpoint: WebhookEndpoint) -> None:
    """Email the project's members that the endpoint was disabled (after the commit)."""
    emails = sorted(
        {
            e
            for e in ProjectMembership.objects.filter(project_id=endpoint.project_id).values_list(
                "user__email", flat=True
            )
            if e
        }
    )
    if not emails:
        return
    subject = f"[trainhub] webhook endpoint {endpoint.public_id} was disabled"
    text = (
        f"The webhook endpoint {endpoint.public_id} ({endpoint.url}) of your trainhub project "
        f"was disabled: {endpoint.disabled_reason}.\n\n"
        "Its deliveries and their errors are listed at "
        f"GET /api/v1/webhook_endpoints/{endpoint.public_id}/deliveries. Once the receiver "
        'works again, enable it with PATCH {"enabled": true}; deliveries that failed can be '
        "sent again with POST …/deliveries/<id>/redeliver.\n"
    )
    try:
        send_mail(subject, text, None, emails)
    except Exception:  # the disable stands (the API and admin show why); the mail is a courtesy
        log.exception("could not email the members of %s", endpoint.public_id)


def deliveries_send_due() -> int:
    """Beat: send a try for every delivery that is due (retries, and first tries whose
    message went missing). Each message expires after one beat interval, so a backlog never
    piles up copies (a duplicate that does run finds the delivery claimed)."""
    now = timezone.now()
    due = (
        WebhookDelivery.objects.filter(status=S.PENDING, next_attempt_at__lte=now)
        .filter(Q(locked_until__isnull=True) | Q(locked_until__lt=now))
        .filter(Q(attempts__gt=0) | Q(created_at__lt=now - FIRST_TRY_GRACE))
        .order_by("next_attempt_at")
        .values_list("pk", flat=True)[:DUE_BATCH]
    )
    pks = list(due)
    for pk in pks:
        messages.send_deliver_webhook(pk, expires=cc.WEBHOOKS_DUE_INTERVAL_SECONDS)
    return len(pks)


def delivery_redeliver(*, delivery: WebhookDelivery) -> WebhookDelivery:
    """Try a delivery once more now, under the same ``webhook-id`` (a failed one gets one try;
    a pending one is tried now instead of at its next retry)."""
    if not delivery.endpoint.enabled:
        raise Conflict(
            f"The endpoint {delivery.endpoint.public_id} is disabled; enable it first.",
            code="webhook_endpoint_disabled",
        )
    now = timezone.now()
    with transaction.atomic():
        WebhookDelivery.objects.filter(pk=delivery.pk).update(
            status=S.PENDING, next_attempt_at=now, locked_until=None
        )
        messages.send_deliver_webhook(delivery.pk)
    delivery.refresh_from_db()
    return delivery
