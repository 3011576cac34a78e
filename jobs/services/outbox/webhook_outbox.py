"""Outbound webhooks: which stored events the project's endpoints hear of.

Called inside the transaction that stores events, so a delivery row exists exactly when its
event does (none lost to a crash after the commit, none for a rollback); the delivery message
goes out once it commits. What a delivery says is fixed here: its body (OpenAI's webhook event
shape) is stored with it and sent unchanged on every try.

Which events qualify:

- ``status`` events of the control plane (attempt 0: written by ``job_transition``, the one
  status writer) entering succeeded, failed, cancelled, running or paused. An executor's own
  status reports (attempt ≥ 1) are not the job's status: its "succeeded" means "verify my
  adapter" (the job is only finalizing), so they never make a webhook.
- ``checkpoint`` events of an attempt: the executor reports one after its upload finished
  (gpu_worker/checkpoints.py), the same event the checkpoints API lists. Whether a checkpoint
  is sound is verified when an attempt resumes from it (services.specs); the webhook tells the
  client it exists, as the API does.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from django.utils import timezone

from jobs.models import JobEvent, TrainingJob, WebhookDelivery, WebhookEndpoint
from jobs.models.ids import checkpoint_id
from jobs.models.webhooks import underscore_id
from jobs.services.outbox import messages

STATUS_WEBHOOKS = {
    "succeeded": "fine_tuning.job.succeeded",
    "failed": "fine_tuning.job.failed",
    "cancelled": "fine_tuning.job.cancelled",
    "running": "fine_tuning.job.running",
    "paused": "fine_tuning.job.paused",
}
CHECKPOINT_WEBHOOK = "fine_tuning.job.checkpoint"


def webhook_type(event: JobEvent) -> str | None:
    """The webhook event type ``event`` makes, or None."""
    if event.type == "status" and event.attempt == 0 and isinstance(event.data, dict):
        return STATUS_WEBHOOKS.get(str(event.data.get("status")))
    if event.type == "checkpoint" and event.attempt > 0:
        return CHECKPOINT_WEBHOOK
    return None


def _data(job: TrainingJob, event: JobEvent, type_: str) -> dict[str, Any]:
    """OpenAI's ``data: {id}``, plus what saves the receiver a GET for the common case."""
    data: dict[str, Any] = {"id": job.public_id, "object": "fine_tuning.job"}
    if type_ == CHECKPOINT_WEBHOOK:
        step = event.data.get("step") if isinstance(event.data, dict) else None
        data["checkpoint"] = {
            "id": checkpoint_id(job.public_id, event.number),
            "object": "fine_tuning.job.checkpoint",
            "step_number": step if isinstance(step, int) else None,
            "attempt": event.attempt,
        }
        return data
    data["status"] = str(event.data.get("status"))
    if type_ == STATUS_WEBHOOKS["succeeded"]:
        data["fine_tuned_model"] = job.fine_tuned_model_name
    if type_ == STATUS_WEBHOOKS["failed"]:
        data["error"] = {
            "code": str(event.data.get("code") or "internal_error"),
            "message": event.message[:1000],
        }
    return data


def body_of(job: TrainingJob, event: JobEvent, type_: str, event_id: str) -> str:
    created = event.created_at or timezone.now()
    payload = {
        "object": "event",
        "id": event_id,
        "type": type_,
        "created_at": int(created.timestamp()),
        "data": _data(job, event, type_),
    }
    return json.dumps(payload, separators=(",", ":"))


def webhooks_for_events(job: TrainingJob, events: Sequence[JobEvent]) -> None:
    """Called inside the transaction that stores ``events``: queue a delivery for every enabled
    endpoint of the job's project that subscribed to what they say."""
    due = [(e, t) for e in events if (t := webhook_type(e)) is not None]
    if not due:  # the common case (metrics, logs): no query at all
        return
    endpoints = list(
        WebhookEndpoint.objects.filter(project_id=job.project_id, enabled=True).values_list(
            "pk", "event_types"
        )
    )
    if not endpoints:
        return
    now = timezone.now()
    rows = []
    for event, type_ in due:
        subscribed = [pk for pk, types in endpoints if type_ in (types or ())]
        if not subscribed:
            continue
        event_id = underscore_id("evt")
        body = body_of(job, event, type_, event_id)
        rows += [
            WebhookDelivery(
                endpoint_id=pk,
                event_id=event_id,
                event_type=type_,
                job_public_id=job.public_id,
                body=body,
                next_attempt_at=now,
            )
            for pk in subscribed
        ]
    if not rows:
        return
    WebhookDelivery.objects.bulk_create(rows)
    for row in rows:
        messages.send_deliver_webhook(row.pk)
