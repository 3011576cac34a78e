"""The live stream's producer side: stored events, told to the job's channel-layer group (and
status changes to the project's) once their transaction commits.

A message carries the events' stored fields, so a watcher that is up to date sends them on
without reading the database; the events' numbers are what make the stream gap-free: a watcher
that sees a number beyond the next one it expects reads the missing ones from the database
(api/live/feed.py), so a message that is late, lost or too large to carry its events costs a
read, never an event. Publishing is best effort for the same reason: a Redis hiccup is logged,
never raised into the transaction's caller.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from functools import cache
from typing import Any

import redis
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import transaction

from jobs.models import JobEvent, TrainingJob
from jobs.states import JobStatus
from trainhub import embedded

log = logging.getLogger(__name__)

_STATUSES = frozenset(s.value for s in JobStatus)
JOB_MESSAGE = "job.events"  # handled by JobFeed consumers as ``job_events``
PROJECT_MESSAGE = "project.status"  # handled by the project consumer as ``project_status``
# A message above this carries no events, only the newest number: watchers read the database.
MAX_MESSAGE_BYTES = 256 * 1024


def job_group(job_pk: int) -> str:
    return f"trainhub.job.{job_pk}"


def project_group(project_pk: int) -> str:
    return f"trainhub.project.{project_pk}"


def event_fields(e: JobEvent) -> dict[str, Any]:
    """An event as a message carries it: what ``JobEvent(**fields)`` rebuilds for a presenter."""
    return {
        "number": e.number,
        "attempt": e.attempt,
        "type": e.type,
        "level": e.level,
        "message": e.message,
        "data": e.data,
        "created_at": e.created_at.timestamp() if e.created_at else None,
    }


def stream_type(e: JobEvent) -> str:
    """An event's type on the live streams. ``status`` is a change of the job's status only;
    the other status events (an executor's report of its attempt, an attempt's end) are
    ``attempt_status``, so a client can stop at a terminal ``status`` without second-guessing."""
    if e.type == "status" and (e.attempt or e.data.get("status") not in _STATUSES):
        return "attempt_status"
    return e.type


def _job_message(job: TrainingJob, events: Sequence[JobEvent]) -> dict[str, Any]:
    message = {
        "type": JOB_MESSAGE,
        "job": job.public_id,
        "last": events[-1].number,
        "events": [event_fields(e) for e in events],
    }
    if len(json.dumps(message, default=str)) > MAX_MESSAGE_BYTES:
        message["events"] = []
    return message


def _status_message(job: TrainingJob, event: JobEvent) -> dict[str, Any]:
    return {
        "type": PROJECT_MESSAGE,
        "job": job.public_id,
        "job_pk": job.pk,
        "event": event_fields(event),
    }


def publish_events(job: TrainingJob, events: Sequence[JobEvent]) -> None:
    """Tell watchers of the job (and of its project, for status changes) about ``events`` once
    the current transaction commits (at once outside one)."""
    if not events:
        return
    events = sorted(events, key=lambda e: e.number)
    outgoing = [(job_group(job.pk), _job_message(job, events))]
    outgoing += [
        (project_group(job.project_id), _status_message(job, e))
        for e in events
        if stream_type(e) == "status"
    ]

    def send() -> None:
        try:
            _send_all(outgoing)
        except Exception:  # a watcher re-reads what it missed
            log.warning("live: could not publish job %s events", job.public_id, exc_info=True)

    transaction.on_commit(send)


def _send_all(outgoing: Sequence[tuple[str, dict[str, Any]]]) -> None:
    """PUBLISH each message where channels-redis's pub/sub layer listens for its group, in one
    round trip on a kept connection: the layer's own ``group_send`` from sync code would start
    an event loop and a connection per call (2 ms here, against 0.1 ms)."""
    layer = get_channel_layer()
    pipe = _redis().pipeline(transaction=False)
    for group, message in outgoing:
        pipe.publish(f"{settings.TRAINHUB_LIVE_PREFIX}__group__{group}", layer.serialize(message))
    pipe.execute()


@cache
def _redis() -> redis.Redis:
    url = embedded.redis_py_url(settings.TRAINHUB_LIVE_REDIS_URL)
    return redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)
