"""Training files: streamed upload within the size limit and the project's storage quota,
validation by a worker task, delete."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import Count, Q, Sum
from django.utils import timezone

from jobs import storage
from jobs.errors import Conflict, InvalidRequest, PayloadTooLarge, QuotaExceeded, ServiceError
from jobs.models import Project, TrainingFile, TrainingJob
from jobs.models.ids import new_file_id
from jobs.services.core.jobs import job_advance_validation
from jobs.services.core.retention import storage_forget
from jobs.services.outbox import messages
from jobs.states import LIVE
from trainhub_contract import datasets

log = logging.getLogger(__name__)
PURPOSES = ("fine-tune",)
S = TrainingFile.Status


@dataclass(frozen=True)
class StorageUsage:
    """What a project's training files hold now."""

    bytes: int
    files: int


@dataclass(frozen=True)
class UploadAllowance:
    """How large the next upload of a project may be, and the error for one that is larger:
    the per-file limit, or the room left in the project's quota where that is smaller."""

    limit: int
    refuse: Callable[[], ServiceError]


def _usage(project: Project) -> StorageUsage:
    totals = TrainingFile.objects.filter(project=project).aggregate(n=Count("pk"), b=Sum("bytes"))
    return StorageUsage(bytes=totals["b"] or 0, files=totals["n"])


def _quota_error(project: Project, usage: StorageUsage, reason: str) -> QuotaExceeded:
    quota, most = settings.TRAINHUB_PROJECT_STORAGE_BYTES, settings.TRAINHUB_PROJECT_MAX_FILES
    return QuotaExceeded(
        f"{reason}: project {project.name!r} stores {usage.files} of at most {most} files, "
        f"{usage.bytes} of at most {quota} bytes. Delete files it no longer needs "
        "(DELETE /v1/files/<id>) or ask the operator for a larger quota.",
        code="storage_quota_exceeded",
        param="file",
    )


def too_large_error(limit: int) -> PayloadTooLarge:
    """The answer to a file over the per-upload limit (also the upload handler's default)."""
    return PayloadTooLarge(
        f"The file is larger than the {limit} byte limit for one upload.",
        code="file_too_large",
        param="file",
    )


def file_upload_allowance(*, project: Project) -> UploadAllowance:
    """The allowance for the next upload of ``project``, asked before any byte of it is read.

    Raises QuotaExceeded when the project already holds its quota of files or bytes, so such an
    upload is refused unread."""
    usage = _usage(project)
    room = settings.TRAINHUB_PROJECT_STORAGE_BYTES - usage.bytes
    if usage.files >= settings.TRAINHUB_PROJECT_MAX_FILES:
        raise _quota_error(project, usage, "The project holds as many files as it may")
    if room <= 0:
        raise _quota_error(project, usage, "The project's stored files fill its quota")
    limit = settings.TRAINHUB_MAX_UPLOAD_BYTES
    if room < limit:
        reason = f"The upload is larger than the {room} bytes left in the project's quota"
        return UploadAllowance(room, lambda: _quota_error(project, usage, reason))
    return UploadAllowance(limit, lambda: too_large_error(limit))


def file_create(
    *,
    project: Project,
    user: User | None,
    filename: str,
    chunks: Iterable[bytes],
    purpose: object = "fine-tune",  # request input, checked here
) -> TrainingFile:
    """Stream an upload into storage (hashing as it goes) and queue its validation.

    Stops reading at the upload allowance (PayloadTooLarge, or QuotaExceeded when the quota is
    the tighter bound); the quota is checked again under the project's row lock before the
    record is made, so concurrent uploads cannot pass it together. A refused upload leaves
    storage and the project's files as they were."""
    if not isinstance(purpose, str) or purpose not in PURPOSES:
        raise InvalidRequest(
            f"purpose must be one of: {', '.join(PURPOSES)} (got {purpose!r}).",
            code="invalid_value",
            param="purpose",
        )
    allowance = file_upload_allowance(project=project)
    public_id = new_file_id()
    key = storage.training_file_key(project.pk, public_id)
    try:
        stored = storage.save_stream(key, chunks, max_bytes=allowance.limit)
    except storage.TooLarge:
        raise allowance.refuse() from None
    if stored.size == 0:
        storage.delete(key)
        raise InvalidRequest("The uploaded file is empty.", code="empty_file", param="file")
    try:
        with transaction.atomic():
            record = _record_within_quota(
                project=project,
                user=user,
                public_id=public_id,
                filename=filename,
                purpose=purpose,
                stored=stored,
            )
            messages.send_validate_file(record.pk)
    except BaseException:
        storage.delete(key)  # refused or failed: the bytes go with the record that never was
        raise
    return record


def _record_within_quota(
    *,
    project: Project,
    user: User | None,
    public_id: str,
    filename: str,
    purpose: str,
    stored: storage.StoredObject,
) -> TrainingFile:
    """The file's record, made while the project's row is locked so that two uploads cannot
    both take the last of its quota."""
    Project.objects.select_for_update().filter(pk=project.pk).first()
    usage = _usage(project)
    if usage.files + 1 > settings.TRAINHUB_PROJECT_MAX_FILES:
        raise _quota_error(project, usage, "The project holds as many files as it may")
    if usage.bytes + stored.size > settings.TRAINHUB_PROJECT_STORAGE_BYTES:
        raise _quota_error(
            project, usage, f"This file ({stored.size} bytes) does not fit in the project's quota"
        )
    return TrainingFile.objects.create(
        public_id=public_id,
        project=project,
        created_by=user,
        purpose=purpose,
        filename=filename[:255],
        bytes=stored.size,
        sha256=stored.sha256,
        storage_key=stored.key,
    )


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
    # Committed before the jobs waiting for it are looked for: a job created meanwhile looks at
    # the file again once it is committed itself (jobs._advance_once_committed).
    TrainingFile.objects.filter(pk=file_pk).update(processed_at=timezone.now(), **fields)
    record.refresh_from_db()
    waiting = TrainingJob.objects.filter(status="validating_files").filter(_uses(record))
    for job in waiting.distinct():
        job_advance_validation(job=job)
    return record


def _uses(record: TrainingFile) -> Q:
    """Jobs that read ``record``: to train on, to validate on, or as eval items."""
    return Q(training_file=record) | Q(validation_file=record) | Q(evals_file=record)


def file_delete(*, record: TrainingFile) -> None:
    """Delete a file unless a live job still needs it."""
    in_use = TrainingJob.objects.filter(status__in=LIVE).filter(_uses(record))
    if in_use.exists():
        raise Conflict(
            f"File {record.public_id} is used by a live job; cancel the job first.",
            code="file_in_use",
        )
    if TrainingJob.objects.filter(_uses(record)).exists():
        raise Conflict(
            f"File {record.public_id} is referenced by finished jobs; delete those jobs first.",
            code="file_in_use",
        )
    with transaction.atomic():
        storage_forget(key=record.storage_key, reason="file deleted")
        record.delete()
