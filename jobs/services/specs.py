"""The executor's job spec for an attempt (gpu_worker.spec), with its signed transfer URLs.

One builder for every launcher: the node dispatcher, serverless launches and SSH machines.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings

from gpu_worker.spec import SPEC_VERSION
from jobs import storage
from jobs.models import JobAttempt

# Signed URLs outlive the attempt: max_runtime plus time to wait in the node's queue and upload.
# (S3 caps a presigned URL at 7 days, so a week-long job gets no slack there.)
URL_SLACK_SECONDS = 6 * 3600


def attempt_spec(
    attempt: JobAttempt, *, sinks: list[dict[str, Any]] | None = None, public: bool = False
) -> dict[str, Any]:
    """The executor's job spec for ``attempt`` (gpu_worker.spec), with fresh signed URLs.

    ``sinks``: where its events go (default: Celery, as on a GPU node). ``public``: the
    executor runs on a rented machine outside the operator's network."""
    job = attempt.job
    ttl = job.max_runtime_seconds + URL_SLACK_SECONDS

    def url(key: str, method: str, **kwargs: Any) -> str:
        return storage.transfer_url(key, method, ttl_seconds=ttl, public=public, **kwargs)

    files = {"dataset": job.training_file, "validation_dataset": job.validation_file}
    checkpoint = storage.checkpoint_key(job.project_id, job.public_id)
    spec: dict[str, Any] = {
        "version": SPEC_VERSION,
        "job_id": job.public_id,
        "attempt": attempt.number,
        "model": job.model,
        **{
            name: {
                "url": url(f.storage_key, "GET"),
                "sha256": f.sha256,
                "format": f.format,
            }
            for name, f in files.items()
            if f is not None
        },
        "outputs": {
            # Issued before the bytes exist, so capped rather than pinned to a size and hash:
            # ingest verifies every member against the manifest and the reported sha256.
            "artifact_url": url(
                storage.bundle_key(job.project_id, job.public_id, attempt.number),
                "PUT",
                max_bytes=storage.MAX_PUT_BYTES,
            ),
            "checkpoint_url": url(checkpoint, "PUT", max_bytes=storage.MAX_PUT_BYTES),
            "resume_url": url(checkpoint, "GET") if storage.exists(checkpoint) else None,
        },
        "adapter": job.adapter,
        "hyperparameters": job.hyperparameters,
        "seed": job.seed,
        "max_runtime_seconds": job.max_runtime_seconds,
        "report": {
            "sinks": sinks if sinks is not None else [{"type": "celery"}],
            # Several heartbeats per lease, so one lost message never costs the attempt.
            "heartbeat_seconds": max(1.0, settings.TRAINHUB_LEASE_TTL_SECONDS / 5),
            # Progress reaches the API within a second or two (metrics are throttled to 1/s).
            "flush_seconds": 1.0,
        },
    }
    return spec
