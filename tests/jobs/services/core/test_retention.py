"""Retention on both backends: the adapter and the seal markers live as long as their job;
every attempt's checkpoints and unverified bundles of finished jobs go after the grace period
(a retry resumes from them, a new job may train on from a checkpoint); deleted jobs lose every object, including ones a late upload
puts back."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from jobs import storage, tasks
from jobs.models import StorageDeletion, TrainingJob
from jobs.services.core.jobs import job_cancel, job_delete, job_retry
from jobs.services.core.retention import storage_sweep
from trainhub_contract import celery_conf as cc

pytestmark = pytest.mark.usefixtures("storage_backend")

DAY = timedelta(days=1)


def keys(job: TrainingJob) -> set[str]:
    return {o.key for o in storage.list_objects(storage.job_prefix(job.project_id, job.public_id))}


def leftovers(job: TrainingJob) -> set[str]:
    """Two attempts' checkpoints (one sealed, so with its marker) and a failed earlier attempt's
    (unverified) bundle. Returns the keys it added."""
    before = keys(job)
    to_seal = storage.checkpoint_key(job.project_id, job.public_id, 7)
    made = {
        to_seal,
        storage.checkpoint_key(job.project_id, job.public_id, 8),
        storage.bundle_key(job.project_id, job.public_id, 9),
    }
    for key in made:
        storage.save_stream(key, [b"leftover " + key.encode()])
    assert storage.seal(to_seal) == storage.sealed_key(to_seal)
    return keys(job) - before


def markers(job: TrainingJob) -> set[str]:
    return {key for key in keys(job) if storage.is_seal_marker(key)}


def test_succeeded_job_keeps_only_its_adapter_after_the_grace_period(ingested, settings) -> None:
    settings.TRAINHUB_CHECKPOINT_RETENTION_SECONDS = 3 * 24 * 3600
    job, artifact, bundle = ingested
    made = leftovers(job)
    assert len(markers(job)) == 2  # the adapter's, and attempt 7's checkpoint's
    assert len(keys(job)) == 2 + 4

    assert storage_sweep(now=timezone.now() + 2 * DAY).jobs_swept == 0
    assert made <= keys(job), "a checkpoint may still be trained on"
    report = storage_sweep(now=timezone.now() + 4 * DAY)

    # The markers stay: the upload URLs they close may still be valid.
    assert keys(job) == {artifact.storage_key} | markers(job)
    assert len(markers(job)) == 2
    assert b"".join(storage.read_chunks(artifact.storage_key)) == bundle
    assert (report.jobs_swept, report.objects_deleted) == (1, 3)
    job.refresh_from_db()
    assert job.storage_swept_at is not None
    assert storage_sweep(now=timezone.now() + 5 * DAY).jobs_swept == 0, "swept once"


def test_failed_job_keeps_its_checkpoint_for_the_grace_period(make_job, settings, sent) -> None:
    settings.TRAINHUB_CHECKPOINT_RETENTION_SECONDS = 3 * 24 * 3600
    job = make_job()
    job_cancel(job=job)
    job.refresh_from_db()
    assert job.status == "cancelled"
    made = leftovers(job)

    assert storage_sweep(now=timezone.now() + 2 * DAY).jobs_swept == 0
    assert keys(job) == made, "a retry may still resume from the checkpoint"

    assert storage_sweep(now=timezone.now() + 4 * DAY).objects_deleted == 3
    assert keys(job) == markers(job) and len(markers(job)) == 1


def test_a_retried_job_is_not_swept_and_is_due_again_when_it_ends(make_job, settings, sent) -> None:
    settings.TRAINHUB_CHECKPOINT_RETENTION_SECONDS = 0
    job = make_job()
    job_cancel(job=job)
    storage_sweep()
    job.refresh_from_db()
    swept_at = job.storage_swept_at
    assert swept_at is not None

    job_retry(job=job)  # back to queued: its new attempt writes a checkpoint
    job.refresh_from_db()
    made = leftovers(job)
    assert storage_sweep(now=timezone.now() + DAY).jobs_swept == 0
    assert keys(job) == made

    job_cancel(job=job)  # finished again, later: due again
    assert storage_sweep(now=timezone.now() + DAY).objects_deleted == 3


def test_deleting_a_job_removes_all_its_objects_and_late_uploads(
    ingested, django_capture_on_commit_callbacks, sent
) -> None:
    job, _, _ = ingested
    leftovers(job)
    with django_capture_on_commit_callbacks(execute=True):
        job_delete(job=job)
    [[deletion_pk]] = sent.named(cc.PURGE_STORAGE)
    assert len(keys(job)) == 6, "nothing goes before the worker runs the purge"

    tasks.purge_storage(deletion_pk)
    assert keys(job) == set()

    # A zombie executor finishes its upload afterwards: the next sweep deletes it too.
    storage.save_stream(storage.checkpoint_key(job.project_id, job.public_id, 1), [b"late"])
    storage_sweep(now=timezone.now() + DAY)
    assert keys(job) == set()
    assert StorageDeletion.objects.filter(pk=deletion_pk).exists()

    # Once every URL issued before the delete has expired, the deletion is done.
    storage_sweep(now=timezone.now() + timedelta(seconds=storage.MAX_URL_TTL_SECONDS) + DAY)
    assert not StorageDeletion.objects.exists()


def test_a_lost_purge_message_is_made_up_by_the_sweep(ingested, sent) -> None:
    job, _, _ = ingested
    job_delete(job=job)  # the on-commit purge never runs here (no commit in this test)
    assert StorageDeletion.objects.count() == 1
    storage_sweep()
    assert keys(job) == set()
