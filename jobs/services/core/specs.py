"""The executor's job spec for an attempt (trainhub_contract.spec), with its signed transfer URLs.

One builder for every launcher: the node dispatcher, serverless launches and SSH machines.

Every attempt uploads to keys of its own (jobs.storage.keys), and its URLs outlive it. So an
attempt never resumes from an upload key another attempt's URL can still write: building its
spec seals every earlier attempt's checkpoint (jobs.storage.seal) and resumes from the newest
sealed one, bytes that no URL reaches.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings

from jobs import storage
from jobs.models import JobAttempt
from providers import registry
from providers.base import CapacityType
from trainhub_contract.spec import SPEC_VERSION

# Signed URLs outlive the attempt: max_runtime plus time to wait in the node's queue and upload.
# (S3 caps a presigned URL at 7 days, so a week-long job gets no slack there.)
URL_SLACK_SECONDS = 6 * 3600


def attempt_spec(
    attempt: JobAttempt, *, sinks: list[dict[str, Any]] | None = None, public: bool = False
) -> dict[str, Any]:
    """The executor's job spec for ``attempt`` (trainhub_contract.spec), with fresh signed URLs.

    ``sinks``: where its events go (default: Celery, as on a GPU node). ``public``: the
    executor runs on a rented machine outside the operator's network."""
    job = attempt.job
    ttl = job.max_runtime_seconds + URL_SLACK_SECONDS

    def url(key: str, method: str, **kwargs: Any) -> str:
        return storage.transfer_url(key, method, ttl_seconds=ttl, public=public, **kwargs)

    files = {"dataset": job.training_file, "validation_dataset": job.validation_file}
    resume = _resume_key(attempt)
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
            "checkpoint_url": url(
                storage.checkpoint_key(job.project_id, job.public_id, attempt.number),
                "PUT",
                max_bytes=storage.MAX_PUT_BYTES,
            ),
            "resume_url": url(resume, "GET") if resume is not None else None,
        },
        "adapter": job.adapter,
        "hyperparameters": _executor_hyperparameters(job.hyperparameters),
        "seed": job.seed,
        "max_runtime_seconds": job.max_runtime_seconds,
        # Both only where they differ from what executors before them did (see below).
        **({"method": job.method} if job.method != "supervised" else {}),
        **(
            {"parent_adapter": {"url": url(job.parent_key, "GET"), "sha256": job.parent_sha256}}
            if job.parent_key
            else {}
        ),
        **({"evals": _evals(job, url)} if job.evals_file is not None else {}),
        **(
            {"checkpoint_selection": job.checkpoint_selection}
            if job.checkpoint_selection != "last"
            else {}
        ),
        "report": {
            "sinks": sinks if sinks is not None else [{"type": "http"}],
            # Several heartbeats per lease, so one lost message never costs the attempt.
            "heartbeat_seconds": max(1.0, settings.TRAINHUB_LEASE_TTL_SECONDS / 5),
            # Progress reaches the API within a second or two (metrics are throttled to 1/s).
            "flush_seconds": 1.0,
        },
    }
    target = registry.get(attempt.target)
    if attempt.capacity == CapacityType.SPOT and target is not None and target.spot_notice:
        # A spot machine that warns: the executor checkpoints when the warning comes.
        spec["preemption_notice"] = target.spot_notice
    return spec


def _evals(job: Any, url: Any) -> dict[str, Any]:
    found = job.evals_file
    return {
        "url": url(found.storage_key, "GET"),
        "sha256": found.sha256,
        "grader": job.grader,
        "max_tokens": job.eval_max_tokens,
    }


# Hyperparameters added to the spec later than others, with the value an executor that does
# not know them uses: left out at that value, so a node still running an older executor (which
# refuses fields it does not know) takes the job as before.
_NEWER_WITH_DEFAULT: dict[str, object] = {"packing": True, "eval_interval": 0, "beta": 0.1}


def _executor_hyperparameters(hyperparameters: dict[str, Any]) -> dict[str, Any]:
    return {
        k: v
        for k, v in hyperparameters.items()
        if not (k in _NEWER_WITH_DEFAULT and v == _NEWER_WITH_DEFAULT[k])
    }


def _resume_key(attempt: JobAttempt) -> str | None:
    """Seal the checkpoint uploads of the job's earlier attempts (all ended: a job runs one
    attempt at a time) and return the newest sealed checkpoint, or None. Attempts resume one
    from the next, so the highest-numbered checkpoint is the furthest along. Sealing is
    idempotent, so a spec built again for the same attempt resumes from the same bytes."""
    job = attempt.job
    newest: str | None = None
    for number in range(1, attempt.number):
        sealed = storage.seal(storage.checkpoint_key(job.project_id, job.public_id, number))
        newest = sealed or newest
    return newest
