"""Job events: control-plane appends and executor batches (deduplicated on attempt + seq)."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from django.db import transaction
from django.db.models import F

from jobs.models import JobEvent, TrainingJob
from jobs.services.outbox import live, webhook_outbox

log = logging.getLogger(__name__)

EVENT_TYPES = frozenset(
    {"status", "log", "metrics", "checkpoint", "artifact", "error", "heartbeat"}
)
LEVELS = frozenset(JobEvent.Level.values)
MAX_MESSAGE_CHARS = 4000
# What an executor may make the control plane store (a node or rented host may be hostile):
# an event's data as JSON, the events kept from one batch, and from one attempt. Events that
# move the job (status, error) are kept past those caps, the last few of a batch (the final
# word comes last).
MAX_EVENT_DATA_BYTES = 16 * 1024
MAX_EVENTS_PER_BATCH = 500
MAX_EVENTS_PER_ATTEMPT = 50_000
MAX_DECISIVE_PER_BATCH = 20
_DECISIVE = frozenset({"status", "error"})
# The job's latest metrics. tokens_per_second: non-padding input tokens; useful_*: tokens that
# carry loss; padding_share: padding's part of the positions computed (gpu_worker.token_counts);
# mean_token_accuracy: the step's next-token hits among its trained tokens (token_accuracy).
METRIC_KEYS = ("step", "total_steps", "epoch", "loss", "mean_token_accuracy", "lr",
               "tokens_per_second", "grad_norm", "useful_tokens_per_second", "useful_tokens",
               "padding_share")  # fmt: skip


def _reserve_numbers(job_id: int, count: int) -> int:
    """Reserve ``count`` public numbers; returns the first. The UPDATE row-locks the job, which
    serialises appenders of the same job until commit, so numbers are gap-free and ordered."""
    TrainingJob.objects.filter(pk=job_id).update(event_counter=F("event_counter") + count)
    last = TrainingJob.objects.filter(pk=job_id).values_list("event_counter", flat=True).get()
    return last - count + 1


def event_append(
    *,
    job: TrainingJob,
    type: str,
    message: str,
    level: str = "info",
    data: Mapping[str, Any] | None = None,
) -> JobEvent:
    """Append a control-plane event (attempt 0, seq = public number)."""
    with transaction.atomic():
        number = _reserve_numbers(job.pk, 1)
        event = JobEvent.objects.create(
            job_id=job.pk,
            attempt=0,
            seq=number,
            number=number,
            type=type,
            level=level,
            message=message[:MAX_MESSAGE_CHARS],
            data=dict(data or {}),
        )
        _stored(job, [event])
        return event


def _stored(job: TrainingJob, events: list[JobEvent]) -> None:
    """What storing events sets off, inside their transaction: webhook deliveries are queued in
    it (none lost, none for a rollback); the live stream hears of them once it commits."""
    webhook_outbox.webhooks_for_events(job, events)
    live.publish_events(job, events)


def clean_executor_event(raw: object) -> dict[str, Any] | None:
    """The event as stored, or None (logged) if the executor sent something malformed."""
    if not isinstance(raw, Mapping):
        return None
    seq, type_ = raw.get("seq"), raw.get("type")
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0 or type_ not in EVENT_TYPES:
        return None
    level = raw.get("level", "info")
    data = raw.get("data") or {}
    if level not in LEVELS or not isinstance(data, Mapping):
        return None
    try:
        text = json.dumps(data, default=str)
    except (TypeError, ValueError):  # not JSON at all (it came as JSON, so hardly)
        text = ""
    if not text or len(text) > MAX_EVENT_DATA_BYTES:
        data = {"data_dropped": f"over {MAX_EVENT_DATA_BYTES} bytes"}
    elif "\\u0000" in text:  # PostgreSQL's jsonb refuses NUL characters
        try:
            data = json.loads(text.replace("\\u0000", ""))
        except ValueError:  # the text held an escaped backslash before "u0000"
            data = {"data_dropped": "held NUL characters"}
    return {
        "seq": seq,
        "type": type_,
        "level": level,
        "message": str(raw.get("message", "")).replace("\x00", "")[:MAX_MESSAGE_CHARS],
        "data": dict(data),
    }


def events_within_caps(
    *, job: TrainingJob, attempt: int, events: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """The cleaned events worth storing: every decisive one, the others up to the batch and
    the attempt caps (logged once per batch when some are dropped)."""
    routine = [e for e in events if e["type"] not in _DECISIVE]
    decisive = [e for e in events if e["type"] in _DECISIVE]
    stored = JobEvent.objects.filter(job_id=job.pk, attempt=attempt).count()
    room = max(0, min(MAX_EVENTS_PER_BATCH, MAX_EVENTS_PER_ATTEMPT - stored))
    if len(routine) <= room and len(decisive) <= MAX_DECISIVE_PER_BATCH:
        return events
    kept_ids = {id(e) for e in routine[:room]} | {id(e) for e in decisive[-MAX_DECISIVE_PER_BATCH:]}
    kept = [e for e in events if id(e) in kept_ids]
    log.warning(
        "job %s attempt %s: dropped %d of %d events over the caps (%d a batch, %d an attempt)",
        job.public_id, attempt, len(events) - len(kept), len(events),
        MAX_EVENTS_PER_BATCH, MAX_EVENTS_PER_ATTEMPT,
    )  # fmt: skip
    return kept


def events_store(
    *, job: TrainingJob, attempt: int, events: Iterable[dict[str, Any]]
) -> list[JobEvent]:
    """Store cleaned executor events once each; returns the newly stored ones in order."""
    batch = {e["seq"]: e for e in events}
    if not batch:
        return []
    with transaction.atomic():
        TrainingJob.objects.select_for_update().filter(pk=job.pk).values_list("pk").get()
        seen = set(
            JobEvent.objects.filter(job_id=job.pk, attempt=attempt, seq__in=batch).values_list(
                "seq", flat=True
            )
        )
        fresh = [batch[s] for s in sorted(batch) if s not in seen]
        if not fresh:
            return []
        first = _reserve_numbers(job.pk, len(fresh))
        rows = [
            JobEvent(job_id=job.pk, attempt=attempt, number=first + i, **e)
            for i, e in enumerate(fresh)
        ]
        JobEvent.objects.bulk_create(rows)
        _stored(job, rows)
        metrics = [e["data"] for e in fresh if e["type"] == "metrics"]
        if metrics:
            latest = {k: metrics[-1][k] for k in METRIC_KEYS if k in metrics[-1]}
            updates: dict[str, Any] = {"latest_metrics": latest}
            tokens = metrics[-1].get("trained_tokens")
            if isinstance(tokens, int):
                updates["trained_tokens"] = tokens
            TrainingJob.objects.filter(pk=job.pk).update(**updates)
    return rows
