"""Training on top of a fine-tuned model: a job's ``model`` may name an earlier job's adapter.

``model`` is then OpenAI's name of a succeeded job of the same project (its
``fine_tuned_model``, ``ft:<base>:<project>:<suffix>:<job>``) or of one of its checkpoints
(``…:ckpt-step-<n>``, ``fine_tuned_model_checkpoint``: the newest checkpoint of an attempt, kept
as long as the job's other leftovers, jobs.services.core.retention). The new job trains the
same base model, continuing that adapter with its settings (gpu_worker.lineage says why); it
records which bytes it continues (key and sha256), and the executor verifies them.

Another project's name, or a name that is not a job's, is a 404 like any object of another
project.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from jobs import storage
from jobs.errors import InvalidRequest, NotFound
from jobs.models import JobEvent, Project, TrainingJob
from jobs.result_files import adapter_of
from jobs.states import TERMINAL, JobStatus

FT_PREFIX = "ft:"
_CHECKPOINT = re.compile(r"^(?P<model>ft:.+):ckpt-step-(?P<step>\d{1,9})$")


@dataclass(frozen=True)
class Parent:
    """What a new job continues: the parent job, a checkpoint's step (None: the final
    adapter), and the stored bytes."""

    job: TrainingJob
    name: str
    step: int | None
    key: str
    sha256: str

    def fields(self) -> dict[str, Any]:
        """The TrainingJob fields that record it."""
        return {
            "parent_job": self.job,
            "parent_model": self.name,
            "parent_step": self.step,
            "parent_key": self.key,
            "parent_sha256": self.sha256,
        }


def is_fine_tuned_name(model: object) -> bool:
    return isinstance(model, str) and model.startswith(FT_PREFIX)


def _not_found(name: str) -> NotFound:
    return NotFound(
        f"The model '{name}' does not exist or you do not have access to it.",
        code="model_not_found",
        param="model",
    )


def _job_named(project: Project, name: str) -> TrainingJob:
    suffix = name.rsplit(":", 1)[-1]
    job = (
        TrainingJob.objects.select_related("project")
        .filter(project=project, public_id=f"ftjob-{suffix}")
        .first()
    )
    if job is None or job.fine_tuned_model_name != name:
        raise _not_found(name)
    return job


def resolve_parent(project: Project, name: str) -> Parent:
    """The adapter ``name`` (an ``ft:`` name) stands for in ``project``; NotFound or
    InvalidRequest saying why it cannot be trained on."""
    checkpoint = _CHECKPOINT.match(name)
    job = _job_named(project, checkpoint["model"] if checkpoint else name)
    if checkpoint is None:
        adapter = adapter_of(job) if job.status == JobStatus.SUCCEEDED else None
        if adapter is None:
            raise InvalidRequest(
                f"Job {job.public_id} is {job.status}: only a succeeded job's fine_tuned_model "
                "(or a checkpoint of a finished job) can be trained on.",
                code="model_not_ready",
                param="model",
            )
        return Parent(job, name, None, adapter.storage_key, adapter.sha256)
    step = int(checkpoint["step"])
    if job.status not in TERMINAL:
        raise InvalidRequest(
            f"Job {job.public_id} is {job.status}; its checkpoints can be trained on once it "
            "has finished.",
            code="model_not_ready",
            param="model",
        )
    event = _newest_checkpoint_at(job, step)
    if event is None:
        raise _not_found(name)
    upload = storage.checkpoint_key(job.project_id, job.public_id, event.attempt)
    key = storage.seal(upload)  # the attempt has ended: its slot holds this checkpoint
    sha256 = event.data.get("sha256") if isinstance(event.data, dict) else None
    if key is None or not isinstance(sha256, str):
        raise InvalidRequest(
            f"The checkpoint '{name}' is no longer stored (a finished job keeps its checkpoints "
            "for the operator's retention period); train on the job's fine_tuned_model.",
            code="model_not_ready",
            param="model",
        )
    return Parent(job, name, step, key, sha256)


def _newest_checkpoint_at(job: TrainingJob, step: int) -> JobEvent | None:
    """The checkpoint event of ``step`` when it is still its attempt's newest (an attempt's
    checkpoint slot keeps only the newest); None otherwise."""
    events = JobEvent.objects.filter(job=job, type="checkpoint").order_by("attempt", "number")
    newest: dict[int, JobEvent] = {}
    for event in events:
        newest[event.attempt] = event
    return next(
        (e for e in newest.values() if isinstance(e.data, dict) and e.data.get("step") == step),
        None,
    )


def inherited_adapter(parent: Parent, requested: dict[str, Any] | None) -> dict[str, Any]:
    """The child's adapter settings: the parent's. A request that names others is refused
    (a continued adapter keeps its shape)."""
    settings = dict(parent.job.adapter)
    if requested:
        clash = sorted(k for k, v in requested.items() if settings.get(k) != v)
        if clash:
            raise InvalidRequest(
                f"adapter.{clash[0]} is {settings.get(clash[0])!r} in '{parent.name}', which this "
                "job continues; leave adapter out or give the parent's settings.",
                code="invalid_value",
                param=f"adapter.{clash[0]}",
            )
    return settings
