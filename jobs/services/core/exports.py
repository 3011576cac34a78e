"""Exports: a succeeded job's adapter merged into its base model (``merged_safetensors``), for
serving without PEFT (vLLM, TGI, Ollama's safetensors import).

``export_create`` records the export and sends ``run_export`` to the ``exports`` queue, whose
worker runs on a host that can hold the base model in memory and reach it (the HF cache, or
the model's absolute path). ``export_run`` reads the adapter bundle from storage, merges on CPU
(gpu_worker.export), and stores the result as a verified ``merged`` artifact of the job, hashed
as it is written; it downloads like any artifact. Asking again for a format that is queued,
running or done returns that export; a failed one is made again, as is one whose worker died
(running for longer than STALE_SECONDS).
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from jobs import storage
from jobs.errors import Conflict, InvalidRequest
from jobs.models import Artifact, Export, TrainingJob
from jobs.result_files import adapter_of
from jobs.services.accounts.audit import SYSTEM, Actor, AuditObject, audit_record, created
from jobs.services.outbox import messages
from jobs.states import JobStatus

log = logging.getLogger(__name__)
STALE_SECONDS = 6 * 3600


def export_create(
    *, job: TrainingJob, format: object, actor: Actor = SYSTEM
) -> tuple[Export, bool]:
    """Export ``job``'s adapter as ``format``; returns (export, created)."""
    if format not in Export.Format.values:
        raise InvalidRequest(
            f"format must be one of: {', '.join(Export.Format.values)}.",
            code="invalid_value",
            param="format",
        )
    adapter = adapter_of(job) if job.status == JobStatus.SUCCEEDED else None
    if adapter is None:
        raise Conflict(
            f"Job {job.public_id} is {job.status}: only a succeeded job's adapter can be exported.",
            code="job_not_exportable",
        )
    stale = timezone.now() - timedelta(seconds=STALE_SECONDS)
    with transaction.atomic():
        TrainingJob.objects.select_for_update().filter(pk=job.pk).values_list("pk").get()
        alive = Q(status__in=[Export.Status.QUEUED, Export.Status.SUCCEEDED]) | Q(
            status=Export.Status.RUNNING, started_at__gte=stale
        )
        same = Export.objects.filter(alive, job=job, format=format, adapter_sha256=adapter.sha256)
        existing = same.order_by("-pk").first()
        if existing is not None:
            return existing, False
        export = Export.objects.create(job=job, format=format, adapter_sha256=adapter.sha256)
        audit_record(
            actor=actor,
            action="export.create",
            obj=AuditObject("export", export.public_id, job.public_id, job.project),
            changes=created({"format": format, "adapter_sha256": adapter.sha256}),
        )
        messages.send_run_export(export.pk)
    return export, True


def export_run(*, export_pk: int) -> Export | None:
    """Merge and store (the task ``run_export``); a duplicate message finds it taken."""
    now = timezone.now()
    taken = Export.objects.filter(pk=export_pk, status=Export.Status.QUEUED).update(
        status=Export.Status.RUNNING, started_at=now
    )
    export = Export.objects.select_related("job").filter(pk=export_pk).first()
    if not taken or export is None:
        return export
    job = export.job
    adapter = adapter_of(job)
    if adapter is None or adapter.sha256 != export.adapter_sha256:
        return _finish(export, error="the job's adapter is gone")
    # The training stack (torch, PEFT), imported by this task only: never by the web process.
    from gpu_worker.errors import ExecutorError  # (its module is light; kept beside its user)
    from gpu_worker.export import merge_adapter  # torch and PEFT load when it runs

    key = storage.export_key(job.project_id, job.public_id, export.public_id)
    with tempfile.TemporaryDirectory(prefix="trainhub-export-") as work:
        bundle, merged = Path(work) / "adapter.tar", Path(work) / "merged.tar"
        try:
            with bundle.open("wb") as out:
                for chunk in storage.read_chunks(adapter.storage_key):
                    out.write(chunk)
            with merged.open("wb") as out:
                merge_adapter(job.model, bundle, out)
        except ExecutorError as exc:
            return _finish(export, error=exc.message)
        except Exception as exc:  # a merge that fails for a reason of its own: say which
            log.exception("export %s failed", export.public_id)
            return _finish(export, error=f"the merge failed: {type(exc).__name__}: {exc}")
        stored = storage.save_stream(key, _chunks(merged))
    with transaction.atomic():
        artifact = Artifact.objects.create(
            job=job,
            kind=Artifact.Kind.MERGED,
            storage_key=stored.key,
            filename=f"{job.public_id}-merged.tar",
            size=stored.size,
            sha256=stored.sha256,
            verified=True,
        )
        return _finish(export, artifact=artifact)


def _chunks(path: Path, size: int = storage.CHUNK_BYTES) -> Iterator[bytes]:
    with path.open("rb") as f:
        while chunk := f.read(size):
            yield chunk


def _finish(export: Export, *, error: str = "", artifact: Artifact | None = None) -> Export:
    export.status = Export.Status.FAILED if error else Export.Status.SUCCEEDED
    export.error, export.artifact, export.finished_at = error[:1000], artifact, timezone.now()
    export.save(update_fields=["status", "error", "artifact", "finished_at"])
    return export
