"""The own-fleet dispatcher: queued ``local`` (and ``auto``) jobs onto idle GPU nodes that fit.

Queued jobs stay in the database until placed. :func:`dispatch_queued` runs when a job is
queued, when a node turns idle, and on every fleet tick; several may run at once: a placement
locks the node row (``skip_locked``) and moves the job with the conditional status update, so
two dispatchers never place the same job or fill the same node twice.

A placement creates the attempt, moves the job to ``provisioning`` and marks the node busy in
one transaction, then (on commit) sends ``run_attempt`` to the node's queue with the attempt's
spec, whose signed URLs are issued now. The node claims the attempt over HTTP before it starts
(:func:`attempt_claim`); a duplicate or outdated delivery is refused there. An attempt that is
not claimed in time is sent again, since a Redis restart may have lost its message.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.urls import reverse
from django.utils import timezone

from gpu_worker import celery_conf as cc
from gpu_worker.spec import SPEC_VERSION
from jobs import storage
from jobs.errors import InvalidTransition
from jobs.models import GpuNode, JobAttempt, TrainingJob
from jobs.placement import misfit
from jobs.services.attempts import attempt_start
from jobs.services.events import event_append
from jobs.services.nodes import node_settle
from jobs.states import JobStatus
from providers.registry import AUTO_TARGET

log = logging.getLogger(__name__)
S = JobStatus
N = GpuNode.Status
LOCAL = "local"
# Jobs looked at per pass; the rest wait for the next pass (the order is by priority, age).
DISPATCH_BATCH = 200
# Signed URLs outlive the attempt: max_runtime plus time to wait in the node's queue and upload.
# (S3 caps a presigned URL at 7 days, so a week-long job gets no slack there.)
URL_SLACK_SECONDS = 6 * 3600


def dispatch_queued() -> int:
    """Place as many queued local jobs as idle nodes allow; returns how many were placed."""
    placed = 0
    # ``auto`` jobs take an idle node that fits; if none does, placement offers them to clouds.
    queued = TrainingJob.objects.filter(status=S.QUEUED, target__in=(LOCAL, AUTO_TARGET))
    jobs = list(queued.order_by("-priority", "id")[:DISPATCH_BATCH])
    if not jobs:
        return 0
    nodes = list(GpuNode.objects.order_by("name"))
    for job in jobs:
        fitting = [n for n in nodes if misfit(job.gpu, job.node_selector, n) is None]
        idle = [n for n in fitting if n.status == N.IDLE]
        node = next((n for n in idle if place_on_node(job, n)), None)
        if node is not None:
            node.status = N.BUSY  # for the rest of this pass
            placed += 1
        elif job.target == LOCAL:
            note_waiting(job, _waiting_reason(job, nodes, fitting))
    return placed


def place_on_node(job: TrainingJob, node: GpuNode) -> bool:
    """Start an attempt of ``job`` on ``node`` if both are still free; True if it was."""
    try:
        with transaction.atomic():
            locked = (
                GpuNode.objects.select_for_update(skip_locked=True)
                .filter(pk=node.pk, status=N.IDLE, current_attempt__isnull=True)
                .first()
            )
            if locked is None:
                return False
            attempt = attempt_start(job=job, target=LOCAL, node_name=node.name)
            GpuNode.objects.filter(pk=node.pk).update(current_attempt=attempt, status=N.BUSY)
            if job.waiting_reason:
                TrainingJob.objects.filter(pk=job.pk).update(waiting_reason="")
            transaction.on_commit(lambda: send_run_attempt(attempt_pk=attempt.pk))
    except InvalidTransition:  # cancelled, or placed by another dispatcher meanwhile
        return False
    log.info("dispatched %s attempt %s to node %s", job.public_id, attempt.number, node.name)
    return True


def _waiting_reason(job: TrainingJob, nodes: list[GpuNode], fitting: list[GpuNode]) -> str:
    online = [n for n in nodes if n.status != N.OFFLINE]
    fitting_online = [n for n in fitting if n.status != N.OFFLINE]
    if fitting_online:
        busy = ", ".join(f"{n.name} ({n.status})" for n in fitting_online)
        return f"Waiting for a node: every node that fits is busy: {busy}."
    if not nodes:
        return "Waiting for a node: no GPU node is registered."
    if not online:
        return "Waiting for a node: every GPU node is offline."
    why = "; ".join(f"{n.name} {misfit(job.gpu, job.node_selector, n)}" for n in online)
    offline = ", ".join(n.name for n in fitting)
    tail = f" Fitting but offline: {offline}." if offline else ""
    return f"No online node fits this job: {why}.{tail}"[:1000]


def note_waiting(job: TrainingJob, reason: str) -> None:
    """Record why the job waits, as a field and an event, only when the reason changes."""
    if reason == job.waiting_reason:
        return
    with transaction.atomic():
        changed = (
            TrainingJob.objects.filter(pk=job.pk, status=S.QUEUED)
            .exclude(waiting_reason=reason)
            .update(waiting_reason=reason)
        )
        if changed:
            event_append(job=job, type="log", level="info", message=reason)
    job.waiting_reason = reason


# --- the message to the node ----------------------------------------------------------------


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


def send_run_attempt(*, attempt_pk: int) -> None:
    """Send the attempt to its node's queue (again, if it was sent before)."""
    from trainhub.celery import app

    attempt = JobAttempt.objects.select_related("job").get(pk=attempt_pk)
    if attempt.ended_at is not None or attempt.claimed_at is not None:
        return
    claim_url = settings.TRAINHUB_CONTROL_URL.rstrip("/") + reverse("node-claim")
    app.send_task(
        cc.RUN_ATTEMPT,
        args=[{"spec": attempt_spec(attempt), "claim_url": claim_url}],
        queue=cc.node_queue(attempt.node_name),
    )


def attempt_claim(*, node: GpuNode, job_id: object, attempt_number: object) -> bool:
    """The node starts the attempt: True once, for the live attempt dispatched to it."""
    if not isinstance(job_id, str) or not isinstance(attempt_number, int):
        return False
    return bool(
        JobAttempt.objects.filter(
            job__public_id=job_id,
            number=attempt_number,
            node_name=node.name,
            ended_at__isnull=True,
            claimed_at__isnull=True,
            job__status=S.PROVISIONING,
        ).update(claimed_at=timezone.now())
    )


def attempts_resend_unclaimed() -> int:
    """Send again every attempt its node has not claimed in time; returns how many."""
    cutoff = timezone.now() - timedelta(seconds=settings.TRAINHUB_DISPATCH_RESEND_SECONDS)
    stale = JobAttempt.objects.filter(
        target=LOCAL, ended_at__isnull=True, claimed_at__isnull=True, created_at__lt=cutoff
    ).values_list("pk", flat=True)
    pks = list(stale)
    for pk in pks:
        send_run_attempt(attempt_pk=pk)
    return len(pks)


# --- attempt end and cancel -----------------------------------------------------------------


def node_release(*, attempt: JobAttempt) -> None:
    """The attempt ended: free its node. An ephemeral node is shutting down after its one job:
    it retires (offline, whatever its last heartbeats say) until a new process registers, so
    no second job waits in a queue nobody reads."""
    node = GpuNode.objects.filter(current_attempt_id=attempt.pk).first()
    if node is None:
        return
    GpuNode.objects.filter(pk=node.pk, current_attempt_id=attempt.pk).update(
        current_attempt=None, retired=node.ephemeral
    )
    node_settle(node_pk=node.pk)  # idle again → the dispatcher looks for the next job


def send_node_cancel(*, attempt: JobAttempt) -> None:
    """Ask the node running ``attempt`` to stop it (a remote-control broadcast to that node)."""
    from trainhub.celery import app

    node = GpuNode.objects.filter(name=attempt.node_name).first()
    if node is None or not node.celery_hostname:
        return
    app.control.broadcast(
        cc.CANCEL_ATTEMPT_COMMAND,
        arguments={"job_id": attempt.job.public_id, "attempt": attempt.number},
        destination=[node.celery_hostname],
    )


def attempts_resend_cancels() -> int:
    """Repeat the stop request for node attempts of cancelling jobs (a broadcast can be lost)."""
    live = JobAttempt.objects.select_related("job").filter(
        target=LOCAL, ended_at__isnull=True, job__status=S.CANCELLING
    )
    count = 0
    for attempt in live:
        send_node_cancel(attempt=attempt)
        count += 1
    return count
