"""Storage retention: what is kept, and the sweep that deletes the rest.

- A job's verified adapter lives as long as the job, and so do its seal markers (empty objects,
  jobs.storage.seal): while one exists its upload URL stays closed and nothing uploaded there is
  ever promoted, however long the URL itself stays valid.
- Everything else — every attempt's checkpoints (uploaded and sealed), unverified bundles
  (attempts that failed, quarantined uploads), uploads that arrived after a seal — is deleted
  ``TRAINHUB_CHECKPOINT_RETENTION_SECONDS`` after the job finished: a retry of a failed or
  cancelled job resumes from its newest checkpoint, a new job may train on from a checkpoint
  of any finished job (its ``fine_tuned_model_checkpoint``, jobs.services.core.lineage), and an
  operator may inspect a quarantined upload.
- Deleting a job or a file writes a :class:`StorageDeletion` in the same transaction; its
  objects are deleted on commit and again by every sweep until all URLs that could still write
  there have expired, so a crash or a late upload leaves nothing behind.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q, QuerySet
from django.utils import timezone

from jobs import storage
from jobs.models import StorageDeletion, TrainingJob
from jobs.services.outbox import messages
from jobs.states import TERMINAL

log = logging.getLogger(__name__)
# Jobs looked at per sweep; the rest wait for the next one.
SWEEP_BATCH = 500


@dataclass(frozen=True)
class SweepReport:
    jobs_swept: int
    objects_deleted: int
    deletions_pending: int


def storage_forget(*, key: str, reason: str) -> StorageDeletion:
    """Schedule ``key`` (an object, or a folder ending in '/') for deletion. Call it inside the
    transaction that deletes its owner: the objects go once that commits, never before."""
    deletion = StorageDeletion.objects.create(key=key, reason=reason)
    messages.send_purge_storage(deletion.pk)
    return deletion


def storage_purge(*, deletion_pk: int, now: datetime | None = None) -> int:
    """Delete what ``deletion_pk`` names; returns how many objects went. The row is dropped
    once no transfer URL issued before it can still write there."""
    now = now or timezone.now()
    deletion = StorageDeletion.objects.filter(pk=deletion_pk).first()
    if deletion is None:
        return 0
    if deletion.key.endswith("/"):
        deleted = storage.delete_prefix(deletion.key)
    else:
        deleted = int(storage.exists(deletion.key))
        storage.delete(deletion.key)
    if deletion.created_at <= now - timedelta(seconds=storage.MAX_URL_TTL_SECONDS):
        deletion.delete()
    else:
        StorageDeletion.objects.filter(pk=deletion.pk).update(last_purged_at=now)
    if deleted:
        log.info(
            "storage: deleted %s object(s) under %s (%s)", deleted, deletion.key, deletion.reason
        )
    return deleted


def storage_sweep(*, now: datetime | None = None) -> SweepReport:
    """The periodic pass: pending deletions, then finished jobs whose leftovers are due."""
    now = now or timezone.now()
    deleted = 0
    for pk in list(StorageDeletion.objects.order_by("pk").values_list("pk", flat=True)):
        deleted += storage_purge(deletion_pk=pk, now=now)
    due = list(_jobs_due(now).order_by("finished_at").values_list("pk", flat=True)[:SWEEP_BATCH])
    for pk in due:
        deleted += _sweep_job(job_pk=pk, now=now)
    return SweepReport(
        jobs_swept=len(due),
        objects_deleted=deleted,
        deletions_pending=StorageDeletion.objects.count(),
    )


def _jobs_due(now: datetime) -> QuerySet[TrainingJob]:
    grace = timedelta(seconds=settings.TRAINHUB_CHECKPOINT_RETENTION_SECONDS)
    finished = Q(status__in=list(TERMINAL), finished_at__lte=now - grace)
    not_swept = Q(storage_swept_at__isnull=True) | Q(storage_swept_at__lt=F("finished_at"))
    return TrainingJob.objects.filter(finished, not_swept)


def _sweep_job(*, job_pk: int, now: datetime) -> int:
    """Delete a finished job's objects except its verified adapters and seal markers. The job
    row stays locked meanwhile, so a retry cannot start (and resume from a checkpoint) halfway
    through."""
    with transaction.atomic():
        job = TrainingJob.objects.select_for_update().filter(pk=job_pk).first()
        if job is None or job.status not in TERMINAL:
            return 0
        keep = set(job.artifacts.filter(verified=True).values_list("storage_key", flat=True))
        stale = [
            info.key
            for info in storage.list_objects(storage.job_prefix(job.project_id, job.public_id))
            if info.key not in keep and not storage.is_seal_marker(info.key)
        ]
        for key in stale:
            storage.delete(key)
        TrainingJob.objects.filter(pk=job.pk).update(storage_swept_at=now)
    return len(stale)
