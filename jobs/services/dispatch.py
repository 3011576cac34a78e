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

from django.conf import settings
from django.db import transaction
from django.urls import reverse
from django.utils import timezone

from jobs.errors import InvalidTransition
from jobs.gpu_needs import misfit
from jobs.models import GpuNode, JobAttempt, TrainingJob
from jobs.services import messages
from jobs.services.attempts import attempt_start
from jobs.services.events import event_append
from jobs.services.nodes import node_cancel
from jobs.services.specs import attempt_spec
from jobs.states import JobStatus, WaitCode
from providers.registry import AUTO_TARGET, OWN_FLEET_TARGET

log = logging.getLogger(__name__)
S = JobStatus
N = GpuNode.Status
LOCAL = OWN_FLEET_TARGET
# Jobs looked at per pass; the rest wait for the next pass (the order is by priority, age).
DISPATCH_BATCH = 200


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
            note_waiting(job, *_waiting_reason(job, nodes, fitting))
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


def _waiting_reason(
    job: TrainingJob, nodes: list[GpuNode], fitting: list[GpuNode]
) -> tuple[WaitCode, str]:
    online = [n for n in nodes if n.status != N.OFFLINE]
    fitting_online = [n for n in fitting if n.status != N.OFFLINE]
    if fitting_online:
        busy = ", ".join(f"{n.name} ({n.status})" for n in fitting_online)
        return WaitCode.NODES_BUSY, f"Waiting for a node: every node that fits is busy: {busy}."
    if not nodes:
        return WaitCode.NO_NODE_REGISTERED, "Waiting for a node: no GPU node is registered."
    if not online:
        return WaitCode.NODES_OFFLINE, "Waiting for a node: every GPU node is offline."
    why = "; ".join(f"{n.name} {misfit(job.gpu, job.node_selector, n)}" for n in online)
    offline = ", ".join(n.name for n in fitting)
    tail = f" Fitting but offline: {offline}." if offline else ""
    return WaitCode.NO_NODE_FITS, f"No online node fits this job: {why}.{tail}"


def note_waiting(job: TrainingJob, code: WaitCode, message: str) -> None:
    """Record why the job waits, as a field and an event (with ``code``), only when the reason
    changes."""
    reason = message[:1000]
    if reason == job.waiting_reason:
        return
    with transaction.atomic():
        changed = (
            TrainingJob.objects.filter(pk=job.pk, status=S.QUEUED)
            .exclude(waiting_reason=reason)
            .update(waiting_reason=reason)
        )
        if changed:
            event_append(
                job=job, type="log", level="info", message=reason, data={"waiting": str(code)}
            )
    job.waiting_reason = reason


# --- the message to the node ----------------------------------------------------------------


def send_run_attempt(*, attempt_pk: int) -> None:
    """Send the attempt to its node's queue (again, if it was sent before)."""
    attempt = JobAttempt.objects.select_related("job").get(pk=attempt_pk)
    if attempt.ended_at is not None or attempt.claimed_at is not None:
        return
    claim_url = settings.TRAINHUB_CONTROL_URL.rstrip("/") + reverse("node-claim")
    messages.send_run_attempt(
        attempt.node_name, {"spec": attempt_spec(attempt), "claim_url": claim_url}
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


# --- cancel -------------------------------------------------------------------------------


def attempts_resend_cancels() -> int:
    """Repeat the stop request for node attempts of cancelling jobs (a broadcast can be lost)."""
    live = JobAttempt.objects.select_related("job").filter(
        target=LOCAL, ended_at__isnull=True, job__status=S.CANCELLING
    )
    count = 0
    for attempt in live:
        node_cancel(attempt=attempt)
        count += 1
    return count
