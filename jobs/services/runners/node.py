"""The operator's own GPU nodes: a Celery queue per node, the node pushes its reports.

Starting an attempt on a node creates the attempt, moves the job to ``provisioning`` and marks
the node busy in one transaction, then (on commit) sends ``run_attempt`` to the node's queue
with the attempt's ids only: the broker is a doorbell that every node could once read. The node
claims the attempt over HTTPS with its token (scheduling.dispatch.attempt_claim), gets the spec
there, and its executor reports over HTTPS (core.attempts.attempt_record_events). An attempt not
claimed in time is sent again, since a Redis restart may have lost its message.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from jobs.errors import InvalidTransition
from jobs.gpu_needs import model_cached
from jobs.models import GpuNode, JobAttempt, TrainingJob
from jobs.services.core.attempts import attempt_end, attempt_start
from jobs.services.core.events import event_append
from jobs.services.fleet.nodes import node_release
from jobs.services.outbox import messages
from jobs.states import EndReason
from providers.base import Offer
from providers.registry import OWN_FLEET_TARGET

log = logging.getLogger(__name__)
N = GpuNode.Status
# A free node whose row another transaction held (its heartbeat, another dispatcher) is looked
# at again this soon, not at the next fleet tick: nothing else would ring for it.
CONTENDED_RETRY_SECONDS = 1.0


class NodeRunner:
    """Attempts on the operator's GPU nodes (core.runner.Runner)."""

    def queued(self, *, job_pk: int) -> None:
        messages.send_dispatch()  # the dispatcher matches queued jobs with idle nodes

    def start(
        self, *, job: TrainingJob, on: Sequence[GpuNode] | Sequence[Offer] = ()
    ) -> JobAttempt | None:
        for node in on:
            attempt = _place_on_node(job, node) if isinstance(node, GpuNode) else None
            if attempt is not None:
                return attempt
        return None

    def observe(self, *, target: str) -> int:
        return attempts_resend_unclaimed(target=target)

    def stop(self, *, attempt: JobAttempt, pause: bool) -> None:
        """An attempt not claimed yet has nothing running: it ends now, and the node's claim of
        it will be refused. A claimed one is stopped by its node, whose supervisor asks every
        few seconds (fleet.nodes.node_stop_requests; a pause saves a checkpoint first)."""
        if not attempt.node_name:  # on no node: the job's stop covers what it holds; the lease
            messages.send_stop_machines(attempt.job_id)  # ends the attempt
            return
        unclaimed = JobAttempt.objects.filter(
            pk=attempt.pk, claimed_at__isnull=True, ended_at__isnull=True
        ).exists()
        if unclaimed:
            attempt_end(
                attempt=attempt,
                reason=EndReason.PAUSED if pause else EndReason.CANCELLED,
                message=f"{'paused' if pause else 'cancelled'} before start",
            )

    def release(self, *, attempt: JobAttempt) -> None:
        node_release(attempt=attempt)


NODES = NodeRunner()


def _place_on_node(job: TrainingJob, node: GpuNode) -> JobAttempt | None:
    """Start an attempt of ``job`` on ``node`` if both are still free."""
    free = GpuNode.objects.filter(pk=node.pk, status=N.IDLE, current_attempt__isnull=True)
    try:
        with transaction.atomic():
            locked = free.select_for_update(skip_locked=True).first()
            if locked is None:
                if free.exists():  # free, but its row was held: skipped, not taken
                    messages.send_dispatch(countdown=CONTENDED_RETRY_SECONDS)
                    node.status = N.BUSY  # not offered again in this dispatcher pass
                return None
            attempt = attempt_start(job=job, target=OWN_FLEET_TARGET, node_name=node.name)
            GpuNode.objects.filter(pk=node.pk).update(current_attempt=attempt, status=N.BUSY)
            if job.waiting_reason:
                TrainingJob.objects.filter(pk=job.pk).update(waiting_reason="")
            _note_model_cache(job, node, attempt.number)
            transaction.on_commit(lambda: ring_node(attempt_pk=attempt.pk))
    except InvalidTransition:  # cancelled, or placed by another dispatcher meanwhile
        return None
    log.info("dispatched %s attempt %s to node %s", job.public_id, attempt.number, node.name)
    return attempt


def _note_model_cache(job: TrainingJob, node: GpuNode, attempt: int) -> None:
    """Say whether the node that takes the job has its model cached (nodes that never
    reported a cache, older ones, say nothing). No node name: the job's project reads it."""
    if node.models_reported_at is None:
        return
    cached = model_cached(node, job.model)
    if cached:
        message = f"Model {job.model} is cached on the node: no download."
    elif job.model.startswith("/"):
        message = f"Model {job.model} is not among the node's cached models."
    else:
        message = f"Model {job.model} is not cached on the node: it is downloaded first."
    event_append(
        job=job, type="log", message=message, data={"attempt": attempt, "model_cached": cached}
    )


def ring_node(*, attempt_pk: int) -> None:
    """Ring the attempt's node (again, if it was rung before)."""
    attempt = JobAttempt.objects.select_related("job").get(pk=attempt_pk)
    if attempt.ended_at is not None or attempt.claimed_at is not None:
        return
    messages.send_run_attempt(attempt.node_name, attempt.job.public_id, attempt.number)


def attempts_resend_unclaimed(*, target: str = OWN_FLEET_TARGET) -> int:
    """Send again every attempt its node has not claimed in time; returns how many."""
    cutoff = timezone.now() - timedelta(seconds=settings.TRAINHUB_DISPATCH_RESEND_SECONDS)
    stale = JobAttempt.objects.filter(
        target=target,
        ended_at__isnull=True,
        claimed_at__isnull=True,
        created_at__lt=cutoff,
    ).values_list("pk", flat=True)
    pks = list(stale)
    for pk in pks:
        ring_node(attempt_pk=pk)
    return len(pks)
