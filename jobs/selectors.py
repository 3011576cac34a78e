"""Reads, scoped to a project. Keyset pagination: ``after`` is an id, never an offset, so deep
pages cost the same as the first."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, TypeVar

from django.db.models import Model, QuerySet
from django.db.models.fields.json import KeyTextTransform

from jobs import result_files
from jobs.errors import InvalidRequest, NotFound
from jobs.models import (
    Artifact,
    Deployment,
    Export,
    GpuNode,
    InferenceServer,
    JobEvent,
    NodeEvent,
    Project,
    ProviderCredential,
    TrainingFile,
    TrainingJob,
)
from jobs.states import JobStatus

MAX_LIMIT = 100
M = TypeVar("M", bound=Model)
# Public ids and target names are short ASCII tokens. Anything else (junk, or a NUL byte, which
# PostgreSQL refuses in a text parameter with a 500) cannot match a row, so it is never queried.
_TOKEN = re.compile(r"[A-Za-z0-9_-]{1,64}")


def _is_token(value: str) -> bool:
    return _TOKEN.fullmatch(value) is not None


def _is_number(value: str) -> bool:
    return value.isascii() and value.isdigit()  # isdigit alone accepts '²', which int() refuses


def parse_limit(raw: str | None, default: int = 20) -> int:
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_LIMIT:
        raise InvalidRequest(
            f"limit must be an integer from 1 to {MAX_LIMIT}.", code="invalid_value", param="limit"
        )
    return value


def _page(qs: QuerySet[M], limit: int) -> tuple[list[M], bool]:
    rows = list(qs[: limit + 1])
    return rows[:limit], len(rows) > limit


def newest_first_page(
    qs: QuerySet[M],
    *,
    among: QuerySet[M],
    after: str | None,
    limit: int,
    noun: str,
    key: str = "public_id",
) -> tuple[list[M], bool]:
    """Newest first; ``after`` is the ``key`` of the last row of the previous page, looked up
    ``among`` the caller's rows (its project, its endpoint): anything else is a 400."""
    if after:
        pk = (
            among.filter(**{key: after}).values_list("pk", flat=True).first()
            if _is_token(after)
            else None
        )
        if pk is None:
            raise InvalidRequest(
                f"after: no {noun} '{after}'.", code="invalid_value", param="after"
            )
        qs = qs.filter(pk__lt=pk)
    return _page(qs.order_by("-pk"), limit)


def one_by_id(
    rows: QuerySet[M], value: str, *, missing: str, code: str, key: str = "public_id"
) -> M:
    """The row of ``rows`` whose ``key`` is ``value``; a 404 saying ``missing`` otherwise."""
    found = rows.filter(**{key: value}).first() if _is_token(value) else None
    if found is None:
        raise NotFound(missing, code=code)
    return found


def job_get(*, project: Project, job_id: str) -> TrainingJob:
    rows = TrainingJob.objects.select_related(
        "project", "training_file", "validation_file", "evals_file", "parent_job"
    )
    return one_by_id(
        rows.filter(project=project),
        job_id,
        missing=f"No fine-tuning job '{job_id}'.",
        code="job_not_found",
    )


def parse_metadata_filter(query: Mapping[str, str]) -> dict[str, str]:
    """``?metadata[key]=value`` pairs (how OpenAI's SDK sends a metadata filter)."""
    pairs = {}
    for name, value in query.items():
        if name.startswith("metadata[") and name.endswith("]"):
            key = name[len("metadata[") : -1]
            if not key or "\x00" in key + value:
                raise InvalidRequest(
                    "metadata filters are metadata[<key>]=<value>.",
                    code="invalid_value",
                    param="metadata",
                )
            pairs[key] = value
    return pairs


def job_list(
    *,
    project: Project,
    status: str | None,
    target: str | None,
    after: str | None,
    limit: int,
    metadata: Mapping[str, str] | None = None,
) -> tuple[list[TrainingJob], bool]:
    qs = TrainingJob.objects.select_related(
        "project", "training_file", "validation_file", "evals_file", "parent_job"
    ).filter(project=project)
    for i, (key, value) in enumerate((metadata or {}).items()):
        # A key transform per pair (not JSON containment, which SQLite lacks); any key works.
        qs = qs.alias(**{f"_meta{i}": KeyTextTransform(key, "metadata")}).filter(
            **{f"_meta{i}": value}
        )
    if status:
        if status not in JobStatus.__members__.values():
            raise InvalidRequest(
                f"status must be one of: {', '.join(JobStatus)}.",
                code="invalid_value",
                param="status",
            )
        qs = qs.filter(status=status)
    if target:
        if not _is_token(target):
            raise InvalidRequest(
                "target must be a target name such as 'local'.",
                code="invalid_value",
                param="target",
            )
        qs = qs.filter(target=target)
    among = TrainingJob.objects.filter(project=project)
    return newest_first_page(qs, among=among, after=after, limit=limit, noun="job")


def _event_number(after: str, job: TrainingJob, kind: str, noun: str) -> int:
    """The event number in ``<kind>-<job suffix>-<number>`` (an event or checkpoint id of
    ``job``, as presenters write them), for an ``after`` cursor; a 400 for anything else."""
    prefix = f"{kind}-{job.public_id.removeprefix('ftjob-')}-"
    number = after.removeprefix(prefix)
    if not after.startswith(prefix) or not _is_number(number):
        raise InvalidRequest(
            f"after: '{after}' is not {noun} of this job.", code="invalid_value", param="after"
        )
    return int(number)


def event_list(*, job: TrainingJob, after: str | None, limit: int) -> tuple[list[JobEvent], bool]:
    """Events oldest first, so a client tails with ``after=<last id>``."""
    qs = JobEvent.objects.filter(job=job)
    if after:
        qs = qs.filter(number__gt=_event_number(after, job, "ftevent", "an event"))
    return _page(qs.order_by("number"), limit)


def checkpoint_list(
    *, job: TrainingJob, after: str | None, limit: int
) -> tuple[list[tuple[JobEvent, dict[str, Any]]], bool]:
    """The job's stored checkpoints, newest first, each with the metrics logged at or before
    its step. An attempt keeps only its newest checkpoint (its slot is overwritten), so there
    is one per attempt that saved any. ``after``: the id of the last checkpoint of a page."""
    saved = JobEvent.objects.filter(job=job, type="checkpoint").order_by("attempt", "number")
    newest = {e.attempt: e for e in saved}  # the last one of each attempt wins
    rows = sorted(newest.values(), key=lambda e: -e.number)
    if after:
        number = _event_number(after, job, "ftckpt", "a checkpoint")
        rows = [e for e in rows if e.number < number]
    page = rows[:limit]
    return [(e, _metrics_before(e)) for e in page], len(rows) > limit


def _metrics_before(checkpoint: JobEvent) -> dict[str, Any]:
    """The attempt's metrics at the checkpoint's step, else the last before it, with its newest
    validation figures up to that step under OpenAI's names (result_files). Matched by step,
    not by event order: the executor sends a checkpoint event at once but merges metrics for up
    to a second, so the metrics of the checkpoint's own step are usually stored after it (and
    the whole file's validation comes after the last step's checkpoint)."""
    step = checkpoint.data.get("step") if isinstance(checkpoint.data, dict) else None
    if not isinstance(step, int):
        return {}
    events = JobEvent.objects.filter(job_id=checkpoint.job_id, attempt=checkpoint.attempt)
    metrics = _newest_at_or_before(events.filter(type="metrics"), step)
    logs = events.filter(type="log")
    sample = _newest_at_or_before(logs.filter(data__has_key="eval_loss"), step)
    whole = _newest_at_or_before(logs.filter(data__has_key="full_valid_loss"), step)
    graded = _newest_at_or_before(logs.filter(data__has_key="eval_score"), step)
    return {
        **(metrics or {}),
        **result_files.validation_metrics(sample or {}),
        **result_files.validation_metrics(whole or {}),
        **result_files.validation_metrics(graded or {}),
    }


def _newest_at_or_before(events: QuerySet[JobEvent], step: int) -> dict[str, Any] | None:
    rows = events.order_by("-number").values_list("data", flat=True)
    for data in rows.iterator(chunk_size=200):  # newest first: the match is near the top
        if isinstance(data, dict) and isinstance(data.get("step"), int) and data["step"] <= step:
            return data
    return None


def file_get(*, project: Project, file_id: str) -> TrainingFile:
    return one_by_id(
        TrainingFile.objects.filter(project=project),
        file_id,
        missing=f"No file '{file_id}'.",
        code="file_not_found",
    )


def file_list(
    *, project: Project, after: str | None, limit: int, purpose: str | None = None
) -> tuple[list[TrainingFile], bool]:
    among = qs = TrainingFile.objects.filter(project=project)
    if purpose:
        qs = qs.filter(purpose=purpose) if _is_token(purpose) else qs.none()
    return newest_first_page(qs, among=among, after=after, limit=limit, noun="file")


def result_file_get(project: Project, file_id: str) -> result_files.ResultFile:
    found = (
        result_files.result_file_get(project=project, file_id=file_id)
        if _is_token(file_id)
        else None
    )
    if found is None:
        raise NotFound(f"No file '{file_id}'.", code="file_not_found")
    return found


def artifact_list(*, job: TrainingJob) -> list[Artifact]:
    return list(job.artifacts.select_related("job").filter(verified=True).order_by("pk"))


def export_list(*, job: TrainingJob) -> list[Export]:
    return list(job.exports.select_related("job", "artifact__job").order_by("pk"))


def artifact_get(*, project: Project, artifact_id: str) -> Artifact:
    found = (
        Artifact.objects.select_related("job")
        .filter(job__project=project, public_id=artifact_id, verified=True)
        .first()
        if _is_token(artifact_id)
        else None
    )
    if found is None:
        raise NotFound(f"No artifact '{artifact_id}'.", code="artifact_not_found")
    return found


def credential_list(*, project: Project) -> list[ProviderCredential]:
    return list(project.credentials.order_by("provider", "name"))


def credential_get(*, project: Project, credential_id: str) -> ProviderCredential:
    found = (
        project.credentials.filter(pk=int(credential_id)).first()
        if _is_number(credential_id)
        else None
    )
    if found is None:
        raise NotFound(f"No credential '{credential_id}'.", code="credential_not_found")
    return found


def node_list() -> list[GpuNode]:
    return list(GpuNode.objects.select_related("current_attempt__job").order_by("name"))


def node_event_list(*, name: str, limit: int = 100) -> list[NodeEvent]:
    """A node's latest audit events (kept after the node is deleted), newest first."""
    return list(NodeEvent.objects.filter(node_name=name).order_by("-id")[:limit])


# --- inference (jobs.services.serving) ---------------------------------------------------------


def deployment_list(*, project: Project) -> list[Deployment]:
    """The project's live deployments, oldest first."""
    return list(
        Deployment.objects.select_related("job")
        .filter(job__project=project, undeployed_at__isnull=True)
        .order_by("pk")
    )


def deployment_get(*, project: Project, name: str) -> Deployment:
    """The project's live deployment called ``name``; a 404 otherwise (another project's
    name included)."""
    found = (
        Deployment.objects.select_related("job", "server")
        .filter(job__project=project, undeployed_at__isnull=True, name=name)
        .first()
    )
    if found is None:
        raise NotFound(
            f"The model '{name}' does not exist or you do not have access to it.",
            code="model_not_found",
        )
    return found


def served_base_models() -> list[str]:
    """The base models an online inference server serves."""
    return sorted(
        set(
            InferenceServer.objects.filter(status=InferenceServer.Status.ONLINE).values_list(
                "base_model", flat=True
            )
        )
    )
