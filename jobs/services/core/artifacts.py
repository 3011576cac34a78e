"""Artifact ingest: seal the uploaded bundle, verify the sealed copy, then succeed the job.

The adapter's PUT URL outlives the attempt (max runtime + slack), so the bytes it can reach are
never the ones served: ingest first seals the upload (jobs.storage.seal: closes the URL on the
local route, moves the bytes to a key no URL was ever issued for), then verifies and records
that sealed copy. The hash the download announces is the hash of the only bytes it can serve.
"""

from __future__ import annotations

import logging

from django.db import transaction

from jobs import storage
from jobs.models import Artifact, JobAttempt, TrainingJob
from jobs.services.core.attempts import attempt_end
from jobs.services.core.status import job_transition
from jobs.states import EndReason, JobStatus
from trainhub_contract.bundle import BundleError, verify_bundle

log = logging.getLogger(__name__)


def artifact_ingest(*, attempt_pk: int, reported_sha256: str = "") -> Artifact | None:
    """Seal attempt's bundle, verify the sealed copy (every member hash, then the whole-bundle
    hash the executor reported) and record it as the job's adapter. A mismatch fails the job
    with ``artifact_corrupt``; the sealed bytes stay in storage, unserved, for inspection."""
    attempt = JobAttempt.objects.select_related("job").get(pk=attempt_pk)
    job: TrainingJob = attempt.job
    if job.status != JobStatus.FINALIZING or attempt.ended_at is not None:
        return None  # a repeat, or an attempt that no longer counts
    key = storage.seal(storage.bundle_key(job.project_id, job.public_id, attempt.number))
    if key is None:
        _corrupt(attempt, "the executor reported success but no bundle was uploaded")
        return None
    try:
        verified = verify_bundle(storage.read_chunks(key))
        if reported_sha256 and verified.sha256 != reported_sha256:
            raise BundleError("the bundle's sha256 differs from the one the executor reported")
    except FileNotFoundError:  # sealed bytes deleted meanwhile (the job was deleted)
        _corrupt(attempt, "the bundle was deleted from storage before it was verified")
        return None
    except BundleError as exc:
        _corrupt(attempt, exc.message)
        return None
    with transaction.atomic():
        # A duplicate ingest (a redelivered task) verified the same sealed bytes: one records.
        live = JobAttempt.objects.select_for_update().filter(pk=attempt.pk, ended_at__isnull=True)
        if live.first() is None:
            return None
        artifact = Artifact.objects.create(
            job=job,
            attempt=attempt,
            kind=Artifact.Kind.ADAPTER,
            storage_key=key,
            filename=f"{job.public_id}-adapter.tar",
            size=verified.size,
            sha256=verified.sha256,
            reported_sha256=reported_sha256,
            verified=True,
        )
        attempt_end(attempt=attempt, reason=EndReason.SUCCEEDED, message="adapter verified")
        job_transition(
            job=job,
            to=JobStatus.SUCCEEDED,
            message=f"Adapter stored ({verified.size} bytes, sha256 {verified.sha256[:12]}…).",
            data={"artifact": artifact.public_id, "sha256": verified.sha256},
        )
    return artifact


def _corrupt(attempt: JobAttempt, message: str) -> None:
    log.warning("artifact of %s rejected: %s", attempt, message)
    attempt_end(attempt=attempt, reason=EndReason.ARTIFACT_CORRUPT, message=message)
    return None
