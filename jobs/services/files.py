"""Training files: streamed upload, validation by a worker task, delete."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from gpu_worker import datasets
from jobs import storage
from jobs.errors import Conflict, InvalidRequest
from jobs.models import Project, TrainingFile, TrainingJob
from jobs.models.ids import new_file_id
from jobs.services import messages
from jobs.services.jobs import job_advance_validation
from jobs.services.retention import storage_forget
from jobs.states import LIVE

log = logging.getLogger(__name__)
PURPOSES = ("fine-tune",)
S = TrainingFile.Status


def file_create(
    *,
    project: Project,
    user: User | None,
    filename: str,
    chunks: Iterable[bytes],
    purpose: object = "fine-tune",  # request input, checked here
) -> TrainingFile:
    """Stream an upload into storage (hashing as it goes) and queue its validation."""
    if not isinstance(purpose, str) or purpose not in PURPOSES:
        raise InvalidRequest(
            f"purpose must be one of: {', '.join(PURPOSES)} (got {purpose!r}).",
            code="invalid_value",
            param="purpose",
        )
    public_id = new_file_id()
    key = storage.training_file_key(project.pk, public_id)
    try:
        stored = storage.save_stream(key, chunks, max_bytes=settings.TRAINHUB_MAX_UPLOAD_BYTES)
    except storage.TooLarge as exc:
        raise InvalidRequest(
            f"The file is larger than the {exc.limit} byte limit.",
            code="file_too_large",
            param="file",
        ) from None
    if stored.size == 0:
        storage.delete(key)
        raise InvalidRequest("The uploaded file is empty.", code="empty_file", param="file")
    with transaction.atomic():
        record = TrainingFile.objects.create(
            public_id=public_id,
            project=project,
            created_by=user,
            purpose=purpose,
            filename=filename[:255],
            bytes=stored.size,
            sha256=stored.sha256,
            storage_key=key,
        )
        messages.send_validate_file(record.pk)
    return record


def file_validate(*, file_pk: int) -> TrainingFile | None:
    """Validate a stored file with the executor's own rules, then advance waiting jobs.

    Safe to run twice: only an ``uploaded`` (or interrupted ``processing``) file is claimed.
    """
    claimed = TrainingFile.objects.filter(pk=file_pk, status__in=[S.UPLOADED, S.PROCESSING]).update(
        status=S.PROCESSING
    )
    if not claimed:
        return None
    record = TrainingFile.objects.get(pk=file_pk)
    try:
        report = datasets.validate_jsonl(storage.read_chunks(record.storage_key))
    except FileNotFoundError:
        report = None
    if report is None:
        fields = {
            "status": S.ERROR,
            "errors": [{"line": 0, "message": "stored file is missing"}],
            "error_count": 1,
        }
    else:
        fields = {
            "status": S.PROCESSED if report.ok else S.ERROR,
            "format": report.format or "",
            "example_count": report.example_count,
            "token_estimate": report.token_estimate,
            "errors": [{"line": e.line, "message": e.message} for e in report.errors],
            "error_count": report.error_count,
        }
    TrainingFile.objects.filter(pk=file_pk).update(processed_at=timezone.now(), **fields)
    record.refresh_from_db()
    waiting = TrainingJob.objects.filter(status="validating_files").filter(
        training_file=record
    ) | TrainingJob.objects.filter(status="validating_files", validation_file=record)
    for job in waiting.distinct():
        job_advance_validation(job=job)
    return record


def file_delete(*, record: TrainingFile) -> None:
    """Delete a file unless a live job still needs it."""
    in_use = TrainingJob.objects.filter(status__in=LIVE).filter(
        training_file=record
    ) | TrainingJob.objects.filter(status__in=LIVE, validation_file=record)
    if in_use.exists():
        raise Conflict(
            f"File {record.public_id} is used by a live job; cancel the job first.",
            code="file_in_use",
        )
    if (
        TrainingJob.objects.filter(training_file=record).exists()
        or TrainingJob.objects.filter(validation_file=record).exists()
    ):
        raise Conflict(
            f"File {record.public_id} is referenced by finished jobs; delete those jobs first.",
            code="file_in_use",
        )
    with transaction.atomic():
        storage_forget(key=record.storage_key, reason="file deleted")
        record.delete()
