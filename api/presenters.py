"""Model → JSON in the OpenAI-compatible shapes (Unix-second timestamps, typed ids)."""

from __future__ import annotations

import dataclasses
import time
from datetime import datetime
from decimal import Decimal
from typing import Any

from jobs.models import (
    Artifact,
    Deployment,
    Export,
    GpuNode,
    JobEvent,
    NodeEvent,
    ProviderCredential,
    TrainingFile,
    TrainingJob,
)
from jobs.models.ids import checkpoint_id
from jobs.result_files import (
    ADAPTER,
    PURPOSE,
    ResultFile,
    adapter_of,
    result_file_ids,
    validation_metrics,
)
from jobs.services.core.job_request import base_learning_rate
from jobs.states import JobStatus, WaitCode

# Why a job waits, as its project may read it. The dispatcher words a wait on the own fleet
# with node names and states (for operators: admin, node API), which would tell every tenant
# the operator's fleet and what it runs, so those two kinds are told by kind only. The others
# name no node (placement's speak of the project's own cloud offers) and are shown as written.
# Matched on the dispatcher's wording; a reason matching none of these is shown generically,
# so a new wording can make the message vaguer, never leak.
TENANT_WAITING = {
    WaitCode.NODES_BUSY: "Waiting for a node: every GPU node that fits this job is busy.",
    WaitCode.NO_NODE_FITS: (
        "No online node fits this job: no online GPU node meets its gpu needs and node_selector."
    ),
}
_NODE_WAITS = {  # the dispatcher's wording of the waits above
    "Waiting for a node: every node that fits is busy": WaitCode.NODES_BUSY,
    "No online node fits this job:": WaitCode.NO_NODE_FITS,
}
_SHOWN_AS_WRITTEN = (
    "Waiting for a node: no GPU node is registered.",  # WaitCode.NO_NODE_REGISTERED
    "Waiting for a node: every GPU node is offline.",  # WaitCode.NODES_OFFLINE
    "No offer can take this job now:",  # WaitCode.NO_OFFER (placement)
    "No idle GPU node fits and no cloud offer can take this job now:",  # NO_OFFER for auto
    "No spot offer can take this job now:",  # the same for capacity spot
    "No idle GPU node fits and no cloud spot offer can take this job now:",
)
WAITING_GENERIC = "Waiting for a GPU node or a cloud offer that can take this job."


def ts(value: datetime | None) -> int | None:
    return int(value.timestamp()) if value else None


def usd(value: Decimal | None) -> float | None:
    return float(value) if value is not None else None


def event_id(job_public_id: str, number: int) -> str:
    return f"ftevent-{job_public_id.removeprefix('ftjob-')}-{number}"


def file_json(f: TrainingFile) -> dict[str, Any]:
    return {
        "id": f.public_id,
        "object": "file",
        "bytes": f.bytes,
        "created_at": ts(f.created_at),
        "filename": f.filename,
        "purpose": f.purpose,
        "status": f.status,
        "sha256": f.sha256,
        "format": f.format or None,
        "example_count": f.example_count,
        "token_estimate": f.token_estimate,
        "error_count": f.error_count,
        "errors": f.errors,
    }


def tenant_waiting_reason(reason: str, code: str | None = None) -> str:
    """``reason`` (a job's waiting_reason or a waiting event's message, ``code`` that event's
    WaitCode) as the job's project may read it: without the operator's node names."""
    if not reason:
        return ""
    if code in TENANT_WAITING:
        return TENANT_WAITING[WaitCode(code)]
    for prefix, kind in _NODE_WAITS.items():
        if reason.startswith(prefix):
            return TENANT_WAITING[kind]
    if reason.startswith(_SHOWN_AS_WRITTEN):
        return reason
    return WAITING_GENERIC


def fine_tuned_model(j: TrainingJob) -> str | None:
    return j.fine_tuned_model_name if j.status == JobStatus.SUCCEEDED else None


def estimated_finish(j: TrainingJob) -> int | None:
    """When a running job should end at its pace so far (steps done / time since start)."""
    m = j.latest_metrics or {}
    step, total = m.get("step"), m.get("total_steps")
    if j.status != JobStatus.RUNNING or not j.started_at or not isinstance(step, int):
        return None
    if not isinstance(total, int) or not 0 < step <= total:
        return None
    elapsed = time.time() - j.started_at.timestamp()
    return int(j.started_at.timestamp() + elapsed * total / step)


def hyperparameters_json(hyper: dict[str, Any], method: str = "supervised") -> dict[str, Any]:
    """trainhub's resolved hyperparameters, with OpenAI's learning_rate_multiplier beside them
    (of the method's base rate); beta for dpo only."""
    rate = hyper.get("learning_rate")
    base = base_learning_rate(method)
    multiplier = round(rate / base, 6) if isinstance(rate, int | float) else None
    shown = {k: v for k, v in hyper.items() if k != "beta" or method == "dpo"}
    return {**shown, "learning_rate_multiplier": multiplier}


def parent_json(j: TrainingJob) -> dict[str, Any] | None:
    """The fine-tuned model a job continues (jobs.services.core.lineage), or None."""
    if not j.parent_model:
        return None
    return {
        "fine_tuned_model": j.parent_model,
        "job_id": j.parent_job.public_id if j.parent_job else None,
        "step_number": j.parent_step,
        "sha256": j.parent_sha256,
    }


def job_json(j: TrainingJob) -> dict[str, Any]:
    hyper = hyperparameters_json(j.hyperparameters, j.method)
    return {
        "id": j.public_id,
        "object": "fine_tuning.job",
        "model": j.parent_model or j.model,
        "base_model": j.model,
        "parent": parent_json(j),
        "created_at": ts(j.created_at),
        "started_at": ts(j.started_at),
        "finished_at": ts(j.finished_at),
        "estimated_finish": estimated_finish(j),
        "fine_tuned_model": fine_tuned_model(j),
        "organization_id": j.project.slug,
        "status": j.status,
        "training_file": j.training_file.public_id,
        "validation_file": j.validation_file.public_id if j.validation_file else None,
        "result_files": result_file_ids(j),
        "method": {"type": j.method, j.method: {"hyperparameters": hyper}},
        "hyperparameters": hyper,
        "adapter": j.adapter,
        "evals": {
            "file": j.evals_file.public_id,
            "grader": j.grader,
            "max_tokens": j.eval_max_tokens,
        }
        if j.evals_file
        else None,
        "checkpoint_selection": j.checkpoint_selection,
        "seed": j.seed,
        "suffix": j.suffix or None,
        "user_provided_suffix": j.suffix or None,
        "metadata": j.metadata or None,
        "integrations": [],
        "target": j.target,
        "priority": j.priority,
        "max_runtime_seconds": j.max_runtime_seconds,
        "max_attempts": j.max_attempts,
        "gpu": j.gpu,
        "node_selector": j.node_selector,
        "max_price_per_hour": usd(j.max_price_per_hour),
        "capacity": j.capacity,
        "max_preemptions": j.max_preemptions,
        "preemptions": j.preemptions,
        "estimated_cost": usd(j.estimated_cost),
        "cost": usd(j.cost),
        "on_demand_cost": usd(j.on_demand_cost),
        "waiting_reason": (tenant_waiting_reason(j.waiting_reason) or None)
        if j.status == "queued"
        else None,
        "trained_tokens": j.trained_tokens,
        "metrics": j.latest_metrics or None,
        "error": {"code": j.error_code, "message": j.error_message, "param": None}
        if j.error_code
        else None,
    }


def event_json(e: JobEvent, job_public_id: str) -> dict[str, Any]:
    message = e.message
    waiting = e.data.get("waiting") if isinstance(e.data, dict) else None
    if waiting is not None:  # a waiting event: told as the job's waiting_reason is
        message = tenant_waiting_reason(message, str(waiting))
    return {
        "id": event_id(job_public_id, e.number),
        "object": "fine_tuning.job.event",
        "created_at": ts(e.created_at),
        "level": e.level,
        "type": e.type,
        "message": message,
        "data": e.data,
        "attempt": e.attempt,
    }


def openai_event_json(e: JobEvent, job_public_id: str) -> dict[str, Any]:
    """An event as OpenAI's clients read it: ``type`` is ``metrics`` (data: step, train_loss,
    train_mean_token_accuracy, learning_rate, total_steps, ...; or a validation pass's
    valid_loss, valid_mean_token_accuracy, full_valid_*) or ``message``; trainhub's own kind (status,
    log, checkpoint, artifact, error, metrics, notification) stays readable as ``kind``. A
    notification (services/notifications) is a ``message`` whose data names the status event
    it is about, the status and, for a failure, the error."""
    out = event_json(e, job_public_id)
    data = e.data if isinstance(e.data, dict) else {}
    if e.type == "metrics":
        out["data"] = {
            **data,
            "train_loss": data.get("loss"),
            "train_mean_token_accuracy": data.get("mean_token_accuracy"),
            "learning_rate": data.get("lr"),
        }
    elif e.type == "log" and (validation := validation_metrics(data)):  # a metric to OpenAI
        out["data"] = {**data, **validation}
    else:
        return {**out, "type": "message", "kind": e.type}
    return {**out, "type": "metrics", "kind": e.type}


# A checkpoint's validation figures, OpenAI's names (selectors.checkpoint_list merges them in).
VALIDATION_METRICS = (
    "valid_loss",
    "valid_mean_token_accuracy",
    "full_valid_loss",
    "full_valid_mean_token_accuracy",
    "eval_score",  # the job's grader on its evals (gpu_worker.grading)
)


def checkpoint_json(e: JobEvent, job: TrainingJob, metrics: dict[str, Any]) -> dict[str, Any]:
    """A stored checkpoint (the newest of its attempt), in OpenAI's checkpoint shape."""
    step = e.data.get("step") if isinstance(e.data, dict) else None
    return {
        "id": checkpoint_id(job.public_id, e.number),
        "object": "fine_tuning.job.checkpoint",
        "created_at": ts(e.created_at),
        "fine_tuning_job_id": job.public_id,
        "fine_tuned_model_checkpoint": f"{job.fine_tuned_model_name}:ckpt-step-{step}",
        "step_number": step,
        "attempt": e.attempt,
        "metrics": {
            "step": step,
            "train_loss": metrics.get("loss"),
            "train_mean_token_accuracy": metrics.get("mean_token_accuracy"),
            **{name: metrics.get(name) for name in VALIDATION_METRICS},
            "learning_rate": metrics.get("lr"),
            "epoch": metrics.get("epoch"),
        },
        "bytes": e.data.get("size") if isinstance(e.data, dict) else None,
        "sha256": e.data.get("sha256") if isinstance(e.data, dict) else None,
    }


def deployment_json(d: Deployment) -> dict[str, Any]:
    """A deployed fine-tuned model, in OpenAI's model shape with trainhub's state beside it
    (never the server it runs on)."""
    return {
        "id": d.name,
        "object": "model",
        "created": ts(d.created_at),
        "owned_by": d.job.project.slug,
        "fine_tuning_job": d.job.public_id,
        "state": d.state,
        "detail": d.detail or None,
        "sha256": d.sha256,
    }


def base_model_json(name: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": None, "owned_by": "trainhub"}


def result_file_json(r: ResultFile) -> dict[str, Any]:
    """A job's result file as a file object (bytes: the adapter's stored size; the metrics CSV
    is built on download, so its size is not known before)."""
    adapter = adapter_of(r.job) if r.kind == ADAPTER else None
    return {
        "id": r.id,
        "object": "file",
        "bytes": adapter.size if adapter else None,
        "created_at": ts(r.job.finished_at),
        "filename": r.filename,
        "purpose": PURPOSE,
        "status": "processed",
        "sha256": adapter.sha256 if adapter else None,
        "job_id": r.job.public_id,
    }


def artifact_json(a: Artifact) -> dict[str, Any]:
    return {
        "id": a.public_id,
        "object": "fine_tuning.job.artifact",
        "job_id": a.job.public_id,
        "kind": a.kind,
        "filename": a.filename,
        "bytes": a.size,
        "sha256": a.sha256,
        "verified": a.verified,
        "created_at": ts(a.created_at),
    }


def export_json(e: Export) -> dict[str, Any]:
    return {
        "id": e.public_id,
        "object": "fine_tuning.job.export",
        "job_id": e.job.public_id,
        "format": e.format,
        "status": e.status,
        "error": e.error or None,
        "adapter_sha256": e.adapter_sha256,
        "artifact": artifact_json(e.artifact) if e.artifact is not None else None,
        "created_at": ts(e.created_at),
        "finished_at": ts(e.finished_at) if e.finished_at else None,
    }


def credential_json(c: ProviderCredential) -> dict[str, Any]:
    # Secret values are write-only: only the names of the stored fields are shown.
    return {
        "id": c.pk,
        "object": "provider_credential",
        "provider": c.provider,
        "name": c.name,
        "secret_fields": c.secret_fields,
        "created_at": ts(c.created_at),
        "updated_at": ts(c.updated_at),
    }


def node_json(n: GpuNode) -> dict[str, Any]:
    """A GPU node as operators see it (never its token)."""
    attempt = n.current_attempt
    return {
        "id": n.name,
        "object": "gpu_node",
        "status": n.status,
        "draining": n.draining,
        "ephemeral": n.ephemeral,
        "labels": n.labels,
        "capabilities": n.capabilities,
        "cached_models": n.cached_models if isinstance(n.cached_models, list) else [],
        "models_reported_at": ts(n.models_reported_at),
        "current_job": attempt.job.public_id if attempt else None,
        "current_attempt": attempt.number if attempt else None,
        "last_heartbeat_at": ts(n.last_heartbeat_at),
        "registered_at": ts(n.registered_at),
        "created_at": ts(n.created_at),
    }


def node_event_json(e: NodeEvent) -> dict[str, Any]:
    return {
        "object": "gpu_node.event",
        "node": e.node_name,
        "kind": e.kind,
        "message": e.message,
        "actor": e.actor or None,
        "created_at": ts(e.created_at),
    }


def provider_json(s: Any) -> dict[str, Any]:
    """A target (services.offers.ProviderStatus); the key itself is never shown."""
    t = s.target
    return {
        "id": t.name,
        "object": "provider",
        "description": t.description,
        "credential_kind": t.credential_kind,
        "has_offers": t.has_offers,
        "usable": not s.problem,
        "problem": s.problem or None,
        "credential": {
            "source": s.credential_source,
            "verified": None if s.credential_error is None else not s.credential_error,
            "error": s.credential_error or None,
        }
        if t.credential_kind
        else None,
    }


def offer_json(o: Any) -> dict[str, Any]:
    """A priced offer (providers.base.Offer)."""
    return {"object": "offer", **dataclasses.asdict(o), "details": dict(o.details)}


def page_json(data: list[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    return {"object": "list", "data": data, "has_more": has_more}
