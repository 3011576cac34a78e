"""Cloud attempts as the service tests drive them through the Celery task bodies (called
directly): a job placed on a scripted target, and a poll of every attempt as if it were due."""

from __future__ import annotations

from typing import Any

from jobs import tasks
from jobs.models import JobAttempt, TrainingJob


def poll_due(target: str = "fake-cloud") -> None:
    """One poll of ``target``'s attempts, each as if its next poll were due."""
    JobAttempt.objects.update(next_poll_at=None)
    tasks.poll_target(target)


def launched(make_job: Any, **fields: Any) -> tuple[TrainingJob, JobAttempt]:
    """A job placed through the place_job task, with its live attempt."""
    job = make_job(target=fields.pop("target", "fake-cloud"), **fields)
    tasks.place_job(job.pk)
    return job, JobAttempt.objects.get(job=job, ended_at__isnull=True)
