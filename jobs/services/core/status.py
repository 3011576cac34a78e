"""The one writer of a job's status, and what entering a status sets in motion.

The bottom service layer: attempts, dispatch, jobs and the cloud services import it, it imports
none of them (only events, the runner port and the messages it sends).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.db import transaction
from django.utils import timezone

from jobs.errors import InvalidTransition
from jobs.models import TrainingJob
from jobs.services.core.events import event_append
from jobs.services.core.runner import runner_for
from jobs.services.outbox import messages
from jobs.states import ALLOWED_FROM, TERMINAL, JobStatus
from providers import registry

S = JobStatus


def job_transition(
    *,
    job: TrainingJob,
    to: JobStatus,
    message: str = "",
    error_code: str = "",
    data: Mapping[str, Any] | None = None,
) -> bool:
    """The only writer of ``TrainingJob.status``.

    A conditional UPDATE (``WHERE status IN allowed``) makes concurrent writers safe on
    PostgreSQL and SQLite alike. Returns True if this call moved the job, False if it was
    already in ``to`` (a repeat); raises InvalidTransition otherwise.
    """
    now = timezone.now()
    fields: dict[str, Any] = {"status": to}
    if to != S.QUEUED:
        fields["waiting_reason"] = ""  # only a queued job waits; a reason would be stale
    if to in TERMINAL:
        fields["finished_at"] = now
    if to == S.FAILED:
        fields.update(error_code=error_code or "internal_error", error_message=message)
    if to == S.RUNNING:
        fields["started_at"] = now
    with transaction.atomic():
        moved = TrainingJob.objects.filter(pk=job.pk, status__in=ALLOWED_FROM[to]).update(**fields)
        if not moved:
            current = TrainingJob.objects.values_list("status", flat=True).get(pk=job.pk)
            if current == to:
                return False
            raise InvalidTransition(current, to)
        if to == S.QUEUED and job.status in (S.FAILED, S.CANCELLED):
            TrainingJob.objects.filter(pk=job.pk).update(
                error_code="", error_message="", finished_at=None
            )
            fields.update(error_code="", error_message="", finished_at=None)
        status_event = event_append(
            job=job,
            type="status",
            level="error" if to == S.FAILED else "info",
            message=message or f"Job is {to}.",
            data={
                "status": str(to),
                **({"code": error_code} if error_code else {}),
                **(data or {}),
            },
        )
        for name, value in fields.items():
            setattr(job, name, value)
        if to == S.QUEUED:
            _on_queued(job.pk, job.target)
        if to in TERMINAL:  # the creator is told (services/notifications), after commit
            messages.send_notify_job(job.pk, status_event.number)
    return True


def _on_queued(job_pk: int, target: str) -> None:
    """Wake what starts the job's next attempt (on commit): its place's runner, or placement
    for ``auto`` (which picks the place)."""
    runner = runner_for(target)
    if runner is not None:
        runner.queued(job_pk=job_pk)
    elif target == registry.AUTO_TARGET:
        messages.send_place_job(job_pk)
