"""The own-fleet dispatcher: queued ``local`` (and ``auto``) jobs onto idle GPU nodes that fit.

Among the idle nodes that fit, one that reported the job's base model cached comes first
(gpu_needs.cached_first), the rest in name order as before: a job never waits for a node with
its model while another fitting node is idle. The waiting reason names the fitting nodes that
have the model and why they can't take it; the dispatch says whether the model was cached.

Queued jobs stay in the database until placed. :func:`dispatch_queued` runs when a job is
queued, when a node turns idle, and on every fleet tick; several may run at once: a placement
locks the node row (``skip_locked``) and moves the job with the conditional status update, so
two dispatchers never place the same job or fill the same node twice.

The node place's runner (runners.node) starts the attempt and rings the node. The node claims
the attempt over HTTPS with its token (:func:`attempt_claim`) and gets the spec, whose signed
URLs are issued then, and a report token that lets its executor report for this one attempt
(:func:`report_token`); a duplicate or outdated delivery is refused there.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.core import signing
from django.db import transaction
from django.utils import timezone

from jobs.gpu_needs import cached_first, misfit, model_cached
from jobs.models import GpuNode, JobAttempt, TrainingJob
from jobs.services.core.events import event_append
from jobs.services.core.specs import attempt_spec
from jobs.services.runners.node import NODES
from jobs.states import JobStatus, WaitCode
from providers.registry import AUTO_TARGET, OWN_FLEET_TARGET
from trainhub_contract import celery_conf as cc

S = JobStatus
N = GpuNode.Status
LOCAL = OWN_FLEET_TARGET
# A report token outlives any run: the longest job trainhub accepts, and a margin.
_REPORT_TOKEN_SECONDS = cc.LONGEST_JOB_SECONDS + 6 * 3600
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
        idle = cached_first([n for n in fitting if n.status == N.IDLE], job.model)
        attempt = NODES.start(job=job, on=idle)
        if attempt is not None:
            taken = next(n for n in idle if n.name == attempt.node_name)
            taken.status = N.BUSY  # for the rest of this pass
            placed += 1
        elif job.target == LOCAL:
            note_waiting(job, *_waiting_reason(job, nodes, fitting))
    return placed


def _cached_on(job: TrainingJob, fitting: list[GpuNode]) -> str:
    """The fitting nodes with the job's model cached, and why each can't take it now."""
    have = [n for n in fitting if model_cached(n, job.model)]
    if not have:
        return ""
    return " Model cached on: " + ", ".join(f"{n.name} ({n.status})" for n in have) + "."


def _waiting_reason(
    job: TrainingJob, nodes: list[GpuNode], fitting: list[GpuNode]
) -> tuple[WaitCode, str]:
    # Only the two waits told to tenants by kind (api.presenters) name nodes or their caches.
    online = [n for n in nodes if n.status != N.OFFLINE]
    fitting_online = [n for n in fitting if n.status != N.OFFLINE]
    cache = _cached_on(job, fitting)
    if fitting_online:
        busy = ", ".join(f"{n.name} ({n.status})" for n in fitting_online)
        return (
            WaitCode.NODES_BUSY,
            f"Waiting for a node: every node that fits is busy: {busy}.{cache}",
        )
    if not nodes:
        return WaitCode.NO_NODE_REGISTERED, "Waiting for a node: no GPU node is registered."
    if not online:
        return WaitCode.NODES_OFFLINE, "Waiting for a node: every GPU node is offline."
    why = "; ".join(f"{n.name} {misfit(job.gpu, job.node_selector, n)}" for n in online)
    offline = ", ".join(n.name for n in fitting)
    tail = f" Fitting but offline: {offline}." if offline else ""
    return WaitCode.NO_NODE_FITS, f"No online node fits this job: {why}.{tail}{cache}"


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


# --- the node's claim and reports ---------------------------------------------------------


@dataclass(frozen=True)
class Claimed:
    """What a node gets for an attempt it claimed."""

    spec: dict[str, Any]
    report_token: str


def attempt_claim(*, node: GpuNode, job_id: object, attempt_number: object) -> Claimed | None:
    """The node starts the attempt: its spec and report token once, for the live attempt
    dispatched to it; None for anything else (duplicate, outdated, cancelled, another's)."""
    if not isinstance(job_id, str) or type(attempt_number) is not int:  # a JSON true is no int
        return None
    claimed = JobAttempt.objects.filter(
        job__public_id=job_id,
        number=attempt_number,
        node_name=node.name,
        ended_at__isnull=True,
        claimed_at__isnull=True,
        job__status=S.PROVISIONING,
    ).update(claimed_at=timezone.now())
    if not claimed:
        return None
    attempt = JobAttempt.objects.select_related("job").get(
        job__public_id=job_id, number=attempt_number
    )
    return Claimed(spec=attempt_spec(attempt), report_token=report_token(attempt))


# The report token: the attempt it speaks for, signed with the secret key; it expires with the
# job's longest possible run (its signed URLs' horizon).
_REPORT_SALT = "trainhub.attempt-report"


def report_token(attempt: JobAttempt) -> str:
    """Signed ``{attempt, node, key}``; ``key`` is a prefix of the node token's hash, so
    rotating the node's token also cuts off the report tokens issued before."""
    key = GpuNode.objects.values_list("token_sha256", flat=True).get(name=attempt.node_name)
    claim = {"attempt": attempt.pk, "node": attempt.node_name, "key": key[:16]}
    return signing.dumps(claim, salt=_REPORT_SALT)


def attempt_for_report(*, node_name: str, job_id: str, attempt_number: int, token: str) -> bool:
    """True if ``token`` was issued for this attempt of this node when the node claimed it."""
    try:
        claim = signing.loads(
            token, salt=_REPORT_SALT, max_age=timedelta(seconds=_REPORT_TOKEN_SECONDS)
        )
    except signing.BadSignature:
        return False
    if not isinstance(claim, dict) or claim.get("node") != node_name:
        return False
    key = GpuNode.objects.filter(name=node_name).values_list("token_sha256", flat=True).first()
    if key is None or not hmac.compare_digest(str(claim.get("key")), key[:16]):
        return False  # the node's token was rotated (or the node deleted) since the claim
    return (
        isinstance(claim.get("attempt"), int)
        and JobAttempt.objects.filter(
            pk=claim["attempt"],
            job__public_id=job_id,
            number=attempt_number,
            node_name=node_name,
            claimed_at__isnull=False,
        ).exists()
    )
