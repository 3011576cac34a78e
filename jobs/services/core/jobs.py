"""Training jobs: create (validated before any GPU is paid for), cancel, pause, resume, retry,
delete."""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import json
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.db.models import F

from jobs import gpu_needs, storage
from jobs.errors import Conflict, InvalidRequest, InvalidTransition, LimitExceeded
from jobs.models import GpuNode, IdempotencyKey, Project, TrainingFile, TrainingJob
from jobs.services.accounts.audit import SYSTEM, Actor, audit_record, created, deleted, diff
from jobs.services.accounts.targets import target_problem
from jobs.services.core.attempts import attempt_live, attempt_request_stop
from jobs.services.core.evals import evals_fields, evals_file_problem
from jobs.services.core.events import event_append
from jobs.services.core.job_request import native_job_request, parse_metadata
from jobs.services.core.lineage import inherited_adapter, is_fine_tuned_name, resolve_parent
from jobs.services.core.retention import storage_forget
from jobs.services.core.status import job_transition
from jobs.states import LIVE, TERMINAL, JobCapacity, JobStatus
from providers import registry
from trainhub_contract import spec
from trainhub_contract.dataset_formats import PREFERENCE

S = JobStatus
# Preemptions of spot machines that do not count against max_attempts (per manual retry).
DEFAULT_MAX_PREEMPTIONS = 5
JOB_FIELDS = (
    "model",
    "training_file",
    "validation_file",
    "adapter",
    "hyperparameters",
    "seed",
    "suffix",
    "target",
    "max_runtime_seconds",
    "max_attempts",
    "gpu",
    "node_selector",
    "max_price_per_hour",
    "capacity",
    "max_preemptions",
    "priority",
    "metadata",
    "evals",
    "checkpoint_selection",
    # OpenAI's spellings, turned into the fields above by job_request.native_job_request
    "method",
    "integrations",
)


# --- create -----------------------------------------------------------------------------------


def _param_error(message: str, param: str, code: str = "invalid_value") -> InvalidRequest:
    return InvalidRequest(message, code=code, param=param)


def _int_field(data: Mapping[str, Any], name: str, default: int, low: int, high: int) -> int:
    value = data.get(name, default)
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool):
        raise _param_error(
            f"{name} must be an integer (got {type(value).__name__}).", name, "invalid_type"
        )
    if not low <= value <= high:
        raise _param_error(f"{name} must be between {low} and {high} (got {value}).", name)
    return value


def _capacity(value: object) -> JobCapacity:
    choices = ", ".join(c.value for c in JobCapacity)
    if value is None:
        return JobCapacity.ON_DEMAND
    if not isinstance(value, str):
        raise _param_error(
            f"capacity must be one of {choices} (got {type(value).__name__}).",
            "capacity",
            "invalid_type",
        )
    try:
        return JobCapacity(value)
    except ValueError:
        raise _param_error(f"capacity {value!r} is not one of {choices}.", "capacity") from None


def _model_allowed(model: str) -> bool:
    patterns = settings.TRAINHUB_ALLOWED_MODELS
    if model.startswith("/"):  # local paths must be listed explicitly by the operator
        patterns = [p for p in patterns if p.startswith("/")]
    return any(fnmatch.fnmatchcase(model, p) for p in patterns)


def _project_file(project: Project, file_id: object, param: str) -> TrainingFile:
    if not isinstance(file_id, str) or not file_id:
        raise _param_error(f"{param} must be a file id (file-…).", param, "invalid_type")
    found = TrainingFile.objects.filter(project=project, public_id=file_id).first()
    if found is None:
        raise _param_error(f"No file '{file_id}' in this project.", param, "file_not_found")
    if found.purpose != "fine-tune":
        raise _param_error(
            f"File '{file_id}' has purpose '{found.purpose}', not 'fine-tune'.", param
        )
    if found.status == TrainingFile.Status.ERROR:
        raise _param_error(
            f"File '{file_id}' failed validation ({found.error_count} errors); fix it and upload again.",
            param,
            "invalid_file",
        )
    return found


def _check_target(project: Project, name: object) -> str:
    if name == registry.AUTO_TARGET:
        return _check_auto(project)
    entry = registry.get(name) if isinstance(name, str) else None
    if entry is None:
        raise _param_error(
            f"Unknown target {name!r}; available: {', '.join(registry.names())}.", "target"
        )
    problem = target_problem(project=project, target=entry)
    if problem is not None:
        code, message = problem
        raise _param_error(message, "target", code)
    return entry.name


def _check_auto(project: Project) -> str:
    """``auto`` needs somewhere to go: the own fleet, or a priced cloud the project can use."""
    if GpuNode.objects.exists():
        return registry.AUTO_TARGET
    reasons = []
    for entry in registry.priced_targets():
        problem = target_problem(project=project, target=entry)
        if problem is None:
            return registry.AUTO_TARGET
        reasons.append(problem[1])
    raise _param_error(
        "target 'auto' has nowhere to place this job: no GPU node is registered and no cloud "
        "with a price list is usable"
        + (f" ({' '.join(reasons)})" if reasons else "")
        + ". Register a node or add a provider credential.",
        "target",
        "target_unavailable",
    )


def _parse_job(project: Project, data: Mapping[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(data) - set(JOB_FIELDS))
    if unknown:
        raise _param_error(
            f"Unknown field '{unknown[0]}'; accepted fields: {', '.join(JOB_FIELDS)}.", unknown[0]
        )
    data = native_job_request(data)
    parent = (
        resolve_parent(project, data["model"]) if is_fine_tuned_name(data.get("model")) else None
    )
    try:
        model = spec.validate_model_name(parent.job.model if parent else data.get("model"))
        adapter = spec_to_json(spec.parse_adapter(data.get("adapter")))
        hyper = spec.parse_hyperparameters(data.get("hyperparameters"))
    except spec.SpecError as exc:
        raise _param_error(exc.message, exc.param or "body") from None
    if parent is not None:
        requested = data.get("adapter") or {}
        adapter = inherited_adapter(parent, {k: adapter[k] for k in requested})
    if not _model_allowed(model):
        raise _param_error(
            f"Model '{model}' is not available on this installation "
            "(the operator's TRAINHUB_ALLOWED_MODELS does not include it).",
            "model",
            "model_not_found",
        )
    suffix = "" if data.get("suffix") is None else data["suffix"]  # 0 or false is a wrong type
    if not isinstance(suffix, str) or len(suffix) > 64:
        raise _param_error("suffix must be a string of at most 64 characters.", "suffix")
    validation_id = data.get("validation_file")
    training_file = _project_file(project, data.get("training_file"), "training_file")
    validation_file = (
        _project_file(project, validation_id, "validation_file")
        if validation_id is not None
        else None
    )
    for param, found in (("training_file", training_file), ("validation_file", validation_file)):
        problem = method_file_problem(data["method"], found)
        if problem:
            raise _param_error(problem, param, "invalid_file")
    parsed: dict[str, Any] = {
        "model": model,
        "method": data["method"],
        **(parent.fields() if parent else {}),
        "adapter": adapter,
        "hyperparameters": spec_to_json(hyper),
        "training_file": training_file,
        "validation_file": validation_file,
        **evals_fields(data, lambda v, p: _project_file(project, v, p), validation_file),
        "seed": _int_field(data, "seed", 42, 0, 2**31 - 1),
        "suffix": suffix,
        "target": _check_target(project, data.get("target", registry.OWN_FLEET_TARGET)),
        "max_runtime_seconds": _int_field(
            data,
            "max_runtime_seconds",
            settings.TRAINHUB_DEFAULT_MAX_RUNTIME_SECONDS,
            60,
            spec.MAX_RUNTIME_LIMIT_SECONDS,
        ),
        "max_attempts": _int_field(data, "max_attempts", 3, 1, 10),
        "gpu": gpu_needs.parse_gpu(data.get("gpu")),
        "node_selector": gpu_needs.parse_node_selector(data.get("node_selector")),
        "max_price_per_hour": gpu_needs.parse_price(data.get("max_price_per_hour")),
        "capacity": _capacity(data.get("capacity")),
        "max_preemptions": _int_field(data, "max_preemptions", DEFAULT_MAX_PREEMPTIONS, 0, 100),
        "priority": _int_field(data, "priority", 0, -100, 100),
        "metadata": parse_metadata(data.get("metadata")),
    }
    entry = registry.get(parsed["target"])
    capped = parsed["max_price_per_hour"] is not None
    if capped and entry is not None and entry.is_cloud and not entry.has_offers:
        raise _param_error(  # refused now rather than discovered on the bill
            f"target '{entry.name}' has no price list, so max_price_per_hour cannot be "
            "enforced there; use a target with offers (GET /api/v1/providers/) or 'auto'.",
            "max_price_per_hour",
        )
    spot = parsed["capacity"] == JobCapacity.SPOT
    if spot and entry is not None and entry.is_cloud and not entry.has_offers:  # local ignores it
        raise _param_error(
            f"target '{entry.name}' has no price list, so it cannot rent spot machines; "
            "use a target whose offers have a spot price (GET /api/v1/providers/), 'auto', "
            "or capacity 'any'.",
            "capacity",
        )
    return parsed


def method_file_problem(method: str, found: TrainingFile | None) -> str | None:
    """Why ``found`` cannot be trained on by a ``method`` job (a dpo job takes preference
    pairs, a supervised one anything else); None when it can or is not validated yet (the
    check runs again when it is: job_advance_validation)."""
    if found is None or found.status != TrainingFile.Status.PROCESSED or not found.format:
        return None
    if (found.format == PREFERENCE) == (method == "dpo"):
        return None
    wanted = (
        "preference pairs ({input: {messages}, preferred_output, non_preferred_output})"
        if method == "dpo"
        else "supervised examples (messages, prompt/completion, alpaca or text)"
    )
    return (
        f"File '{found.public_id}' is in the {found.format} format (its first example and every "
        f"other); a {method} job trains on {wanted}."
    )


def spec_to_json(value: spec.AdapterSpec | spec.Hyperparameters) -> dict[str, Any]:
    out = asdict(value)
    return {k: list(v) if isinstance(v, tuple) else v for k, v in out.items()}


def _request_hash(data: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


def job_create(
    *,
    project: Project,
    user: User | None,
    data: Mapping[str, Any],
    idempotency_key: str | None = None,
    actor: Actor = SYSTEM,
) -> tuple[TrainingJob, bool]:
    """Validate and create a job; returns (job, created). With an idempotency key, a repeat
    of the same request returns the first job (and records nothing); the same key with
    another body is a 409."""
    if idempotency_key is not None and (
        not 1 <= len(idempotency_key) <= 255 or not idempotency_key.isprintable()
    ):
        raise _param_error(
            "Idempotency-Key must be 1 to 255 printable characters.", "Idempotency-Key"
        )
    request_hash = _request_hash(data)
    if idempotency_key:
        existing = _idempotent_replay(project, idempotency_key, request_hash)
        if existing:
            return existing, False
    fields = _parse_job(project, data)
    try:
        with transaction.atomic():
            # The project row lock makes the limit check and the insert one step.
            Project.objects.select_for_update().filter(pk=project.pk).values_list("pk").get()
            live = TrainingJob.objects.filter(project=project, status__in=LIVE).count()
            if live >= project.max_concurrent_jobs:
                raise LimitExceeded(
                    f"This project already has {live} live jobs (limit {project.max_concurrent_jobs}); "
                    "wait for one to finish or cancel one.",
                    code="concurrent_job_limit",
                )
            job = TrainingJob.objects.create(project=project, created_by=user, **fields)
            if idempotency_key:
                IdempotencyKey.objects.create(
                    project=project, key=idempotency_key, request_sha256=request_hash, job=job
                )
            event_append(
                job=job,
                type="status",
                message="Job created; validating files.",
                data={"status": str(S.VALIDATING_FILES)},
            )
            job_advance_validation(job=job)
            if job.status == S.VALIDATING_FILES:
                pk = job.pk
                transaction.on_commit(lambda: _advance_once_committed(pk), robust=True)
            audit_record(
                actor=actor,
                action="job.create",
                obj=job,
                changes=created(
                    {
                        "model": job.model,
                        "training_file": job.training_file.public_id,
                        "target": job.target,
                        "status": job.status,
                    }
                ),
            )
    except IntegrityError:
        if idempotency_key:  # a concurrent request with the same key won the race
            existing = _idempotent_replay(project, idempotency_key, request_hash)
            if existing:
                return existing, False
        raise
    return job, True


def _idempotent_replay(project: Project, key: str, request_hash: str) -> TrainingJob | None:
    row = IdempotencyKey.objects.select_related("job").filter(project=project, key=key).first()
    if row is None:
        return None
    if row.request_sha256 != request_hash:
        raise Conflict(
            "This Idempotency-Key was already used with a different request body.",
            code="idempotency_key_reused",
            param="Idempotency-Key",
        )
    return row.job


def job_advance_validation(*, job: TrainingJob) -> None:
    """Move a job out of validating_files once all its files are validated."""
    if job.status != S.VALIDATING_FILES:
        return
    files = [f for f in (job.training_file, job.validation_file, job.evals_file) if f is not None]
    for f in files:
        f.refresh_from_db(fields=["status", "error_count"])
    bad = next((f for f in files if f.status == TrainingFile.Status.ERROR), None)
    trained_on = (job.training_file, job.validation_file)
    mismatch = next(
        (p for f in trained_on if (p := method_file_problem(job.method, f))), None
    ) or evals_file_problem(job.evals_file)
    if mismatch is not None:
        job_transition(job=job, to=S.FAILED, error_code="invalid_dataset", message=mismatch)
    elif bad is not None:
        job_transition(
            job=job,
            to=S.FAILED,
            error_code="invalid_dataset",
            message=f"File {bad.public_id} failed validation with {bad.error_count} error(s); "
            f"see GET /api/v1/files/{bad.public_id}/ for line numbers.",
        )
    elif all(f.status == TrainingFile.Status.PROCESSED for f in files):
        job_transition(job=job, to=S.QUEUED, message="Files validated; job queued.")


def _advance_once_committed(job_pk: int) -> None:
    """Look at a new job's files again once the job is committed. Its file may have been
    validated at the same moment: the validation looked for waiting jobs before this one was
    committed, and the creation read the file before the validation was committed, so each
    missed the other and the job would wait in validating_files for ever. The validation
    commits the file before it looks (files.file_validate), so this second look, after the
    job's commit, sees the file settled whenever the validation's look missed the job."""
    job = (
        TrainingJob.objects.select_related("training_file", "validation_file", "evals_file")
        .filter(pk=job_pk, status=S.VALIDATING_FILES)
        .first()
    )
    if job is not None:
        with contextlib.suppress(InvalidTransition):  # moved on meanwhile (cancelled, say)
            job_advance_validation(job=job)


# --- user actions -----------------------------------------------------------------------------


def _audit_status(actor: Actor, action: str, job: TrainingJob, before: str) -> None:
    """One entry for a user action on a job, when it moved the job (a repeat records nothing)."""
    changes = diff({"status": before}, {"status": job.status})
    if changes:
        audit_record(actor=actor, action=action, obj=job, changes=changes)


def job_cancel(*, job: TrainingJob, actor: Actor = SYSTEM) -> TrainingJob:
    """Cancel a live job. Without a live attempt nothing runs, so it is cancelled at once;
    otherwise it stays ``cancelling`` until the executor or provider confirms the stop."""
    if job.status in TERMINAL:
        raise Conflict(f"Job {job.public_id} is already {job.status}.", code="job_not_cancellable")
    before = job.status
    with transaction.atomic():
        if job.status == S.VALIDATING_FILES:
            job_transition(
                job=job, to=S.CANCELLED, message="Job cancelled before its files were validated."
            )
        else:
            job_transition(job=job, to=S.CANCELLING, message="Cancellation requested.")
            attempt = attempt_live(job=job)
            if attempt is None:
                job_transition(job=job, to=S.CANCELLED, message="Job cancelled.")
            else:
                attempt_request_stop(attempt=attempt)
        _audit_status(actor, "job.cancel", job, before)
    return job


PAUSABLE = (S.PROVISIONING, S.RUNNING)


def job_pause(*, job: TrainingJob, actor: Actor = SYSTEM) -> TrainingJob:
    """Pause a provisioning or running job: it moves to ``paused`` at once and its live
    attempt is asked to stop after saving a checkpoint; the attempt's end leaves the job
    paused (services.attempts) and stops its machine. Resume queues it again.

    Where the checkpoint comes from, per target: an own GPU node's supervisor pulls the stop
    with mode "pause" (nodes.node_stop_requests) and the executor uploads a checkpoint of its
    last finished step before exiting; an SSH-driven rented machine gets "pause" in its
    cancel file on its next polls and is terminated once the executor exits (or after
    stopping.PAUSE_GRACE_SECONDS); a RunPod serverless job cannot be signalled, so it is
    cancelled like any other and the next attempt resumes from its latest periodic
    checkpoint. An attempt not yet started is simply stopped (nothing to save)."""
    if job.status not in PAUSABLE:
        raise Conflict(
            f"Only running or provisioning jobs can be paused; {job.public_id} is {job.status}.",
            code="job_not_pausable",
        )
    before = job.status
    with transaction.atomic():
        job_transition(
            job=job,
            to=S.PAUSED,
            message="Pause requested; the job saves a checkpoint and stops.",
        )
        attempt = attempt_live(job=job)
        if attempt is not None:
            attempt_request_stop(attempt=attempt, pause=True)
        _audit_status(actor, "job.pause", job, before)
    return job


def job_resume(*, job: TrainingJob, actor: Actor = SYSTEM) -> TrainingJob:
    """Queue a paused job again. Its next attempt resumes from the newest checkpoint (every
    attempt's spec does: services.specs), and the attempt the pause stopped does not count
    against max_attempts. Refused while that attempt is still stopping (saving its
    checkpoint): one attempt at a time, and the next must resume from that checkpoint."""
    if job.status != S.PAUSED:
        raise Conflict(
            f"Only paused jobs can be resumed; {job.public_id} is {job.status}.",
            code="job_not_resumable",
        )
    with transaction.atomic():
        job = TrainingJob.objects.select_for_update().get(pk=job.pk)
        if attempt_live(job=job) is not None:
            raise Conflict(
                f"Job {job.public_id} is still pausing: its attempt is saving a checkpoint and "
                "stopping. Retry the resume in a few seconds.",
                code="job_still_pausing",
            )
        # Every pause ends exactly one attempt (paused is entered only with a live attempt):
        # moving the budget's start by one leaves that attempt out of the count.
        TrainingJob.objects.filter(pk=job.pk).update(
            attempt_budget_start=F("attempt_budget_start") + 1
        )
        job.attempt_budget_start += 1
        before = job.status
        job_transition(job=job, to=S.QUEUED, message="Resume requested; job queued.")
        _audit_status(actor, "job.resume", job, before)
    return job


def job_retry(*, job: TrainingJob, actor: Actor = SYSTEM) -> TrainingJob:
    """Queue a failed or cancelled job again with a fresh automatic-retry budget (and a fresh
    allowance of preemptions that do not count against it)."""
    if job.status not in (S.FAILED, S.CANCELLED):
        raise Conflict(
            f"Only failed or cancelled jobs can be retried; {job.public_id} is {job.status}.",
            code="job_not_retryable",
        )
    before = job.status
    with transaction.atomic():
        used = job.attempts.count()
        TrainingJob.objects.filter(pk=job.pk).update(attempt_budget_start=used, preemptions=0)
        job.attempt_budget_start, job.preemptions = used, 0
        if job.training_file.status != TrainingFile.Status.PROCESSED:
            raise Conflict("The job's training file is not usable any more.", code="invalid_file")
        job_transition(job=job, to=S.QUEUED, message="Retry requested; job queued.")
        _audit_status(actor, "job.retry", job, before)
    return job


def job_set_priority(*, job: TrainingJob, priority: object, actor: Actor = SYSTEM) -> TrainingJob:
    """Reprioritise a job (the dispatcher takes higher first); recorded when it changes."""
    if not isinstance(priority, int) or isinstance(priority, bool) or not -100 <= priority <= 100:
        raise _param_error("priority must be an integer from -100 to 100.", "priority")
    with transaction.atomic():
        before = TrainingJob.objects.select_for_update().values_list("priority", flat=True)
        changes = diff({"priority": before.get(pk=job.pk)}, {"priority": priority})
        if changes:
            TrainingJob.objects.filter(pk=job.pk).update(priority=priority)
            audit_record(actor=actor, action="job.update", obj=job, changes=changes)
        job.priority = priority
    return job


def job_delete(*, job: TrainingJob, actor: Actor = SYSTEM) -> None:
    if job.status not in TERMINAL:
        raise Conflict(
            f"Job {job.public_id} is {job.status}; cancel it before deleting.",
            code="job_not_terminal",
        )
    child = job.children.exclude(status__in=TERMINAL).first()
    if child is not None:  # its attempts download this job's adapter
        raise Conflict(
            f"Job {child.public_id} is training on top of {job.public_id} ({child.status}); "
            "delete this job once it has finished.",
            code="job_has_live_children",
        )
    with transaction.atomic():
        storage_forget(key=storage.job_prefix(job.project_id, job.public_id), reason="job deleted")
        audit_record(
            actor=actor,
            action="job.delete",
            obj=job,
            changes=deleted({"status": job.status, "model": job.model}),
        )
        job.delete()
