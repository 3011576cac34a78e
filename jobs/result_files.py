"""A succeeded job's result files, as OpenAI's API lists them in ``result_files``: file ids a
client downloads with ``GET /files/{id}/content`` (``client.files.content(id)``).

Two per job, both derived from what is already stored, so they need no rows of their own:
- ``file-metrics-<job>``: the training metrics as CSV (OpenAI's columns first), rebuilt from
  the job's metrics events;
- ``file-adapter-<job>``: the verified adapter bundle (the job's adapter artifact).
Their ids are the job's id under another prefix: reading one is reading the job, so the
project check is the job's.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from dataclasses import dataclass

from jobs.models import Artifact, JobEvent, Project, TrainingJob
from jobs.states import JobStatus

METRICS, ADAPTER = "metrics", "adapter"
_PREFIXES = {METRICS: "file-metrics-", ADAPTER: "file-adapter-"}
PURPOSE = "fine-tune-results"
# step and OpenAI's names first (what its result CSV holds: train_accuracy is the training token
# accuracy, which its checkpoints call train_mean_token_accuracy; both are here), then what
# trainhub measures too.
CSV_COLUMNS = (
    "step",
    "train_loss",
    "train_accuracy",
    "valid_loss",
    "valid_mean_token_accuracy",
    "train_mean_token_accuracy",
    "full_valid_loss",
    "full_valid_mean_token_accuracy",
    "learning_rate",
    "grad_norm",
    "epoch",
    "tokens_per_second",
    "trained_tokens",
    "eval_score",
)


def _short(job_public_id: str) -> str:
    return job_public_id.removeprefix("ftjob-")


def result_file_ids(job: TrainingJob) -> list[str]:
    if job.status != JobStatus.SUCCEEDED:
        return []
    return [_PREFIXES[kind] + _short(job.public_id) for kind in (METRICS, ADAPTER)]


def is_result_file_id(file_id: str) -> bool:
    return file_id.startswith(tuple(_PREFIXES.values()))


@dataclass(frozen=True)
class ResultFile:
    id: str
    kind: str  # METRICS or ADAPTER
    job: TrainingJob

    @property
    def filename(self) -> str:
        short = _short(self.job.public_id)
        return f"{short}-metrics.csv" if self.kind == METRICS else f"{short}-adapter.tar"


def result_file_get(*, project: Project, file_id: str) -> ResultFile | None:
    """The result file ``file_id`` names in ``project``; None if it names none there."""
    for kind, prefix in _PREFIXES.items():
        if file_id.startswith(prefix):
            job = (
                TrainingJob.objects.select_related("project")
                .filter(
                    project=project,
                    public_id="ftjob-" + file_id.removeprefix(prefix),
                    status=JobStatus.SUCCEEDED,
                )
                .first()
            )
            return ResultFile(file_id, kind, job) if job is not None else None
    return None


def adapter_of(job: TrainingJob) -> Artifact | None:
    return job.artifacts.filter(kind=Artifact.Kind.ADAPTER, verified=True).order_by("-pk").first()


def _metrics_rows(job: TrainingJob) -> Iterator[dict[str, object]]:
    """One row per metrics event, and a row per validation pass (logged at its step)."""
    events = JobEvent.objects.filter(job=job, type__in=("metrics", "log")).order_by("number")
    for event in events.iterator(chunk_size=1000):
        data = event.data if isinstance(event.data, dict) else {}
        if event.type == "metrics":
            yield {
                "step": data.get("step"),
                "train_loss": data.get("loss"),
                "train_accuracy": data.get("mean_token_accuracy"),
                "train_mean_token_accuracy": data.get("mean_token_accuracy"),
                "learning_rate": data.get("lr"),
                **{k: data.get(k) for k in ("grad_norm", "epoch", "tokens_per_second")},
                "trained_tokens": data.get("trained_tokens"),
            }
        elif validation := validation_metrics(data):
            yield {"step": data.get("step"), **validation}


def validation_metrics(data: dict[str, object]) -> dict[str, object]:
    """A validation event's figures under OpenAI's names (the executor logs a sample pass as
    ``eval_*`` and the whole file as ``full_valid_*``); empty for any other event."""
    if "eval_loss" in data:
        return {
            "valid_loss": data.get("eval_loss"),
            "valid_mean_token_accuracy": data.get("eval_mean_token_accuracy"),
        }
    if "full_valid_loss" in data:
        return {k: data.get(k) for k in ("full_valid_loss", "full_valid_mean_token_accuracy")}
    if "eval_score" in data:  # graded checkpoints: the job's grader on its evals
        return {"eval_score": data.get("eval_score")}
    return {}


def metrics_csv(job: TrainingJob) -> bytes:
    out = io.StringIO()
    writer = csv.DictWriter(out, CSV_COLUMNS, restval="", extrasaction="ignore")
    writer.writeheader()
    for row in _metrics_rows(job):
        writer.writerow({k: "" if v is None else v for k, v in row.items()})
    return out.getvalue().encode()
