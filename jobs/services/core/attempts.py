"""Attempts: start, leases, reports, and their end. Where an attempt runs is its runner's
business (core.runner): an ending attempt has its runner release what it held, a stop is asked
of its runner, and every runner's reports come to :func:`attempt_report`.

An attempt ends exactly once (conditional UPDATE on ``ended_at IS NULL``); how it ended
decides where the job goes: back to the queue while attempts remain, failed, or cancelled.
A paused job stays paused whatever stopped its attempt (it was to stop), unless the attempt
failed for a reason a resume would meet again (OOM, a bad dataset...): then the job fails as a
running one would, and a retry still resumes from its newest checkpoint.

A preempted attempt (a spot machine taken back) requeues the job without counting against
``max_attempts``, for up to ``max_preemptions`` preemptions since the last manual retry
(``TrainingJob.preemptions`` counts them); later ones count like any lost attempt. Like a
pause, a forgiven preemption moves ``attempt_budget_start`` up by one.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from jobs.errors import InvalidTransition
from jobs.models import JobAttempt, TrainingJob
from jobs.services.core.events import (
    clean_executor_event,
    event_append,
    events_store,
    events_within_caps,
)
from jobs.services.core.runner import Report, runner_for
from jobs.services.core.status import job_transition
from jobs.services.outbox import messages
from jobs.states import REPORT_ACTIONS, EndReason, JobStatus, ReportAction
from providers.base import MACHINE_PREFIX, CapacityType, Handle

log = logging.getLogger(__name__)
S = JobStatus


def _lease_deadline() -> Any:
    return timezone.now() + timedelta(seconds=settings.TRAINHUB_LEASE_TTL_SECONDS)


def attempt_live(*, job: TrainingJob) -> JobAttempt | None:
    return job.attempts.filter(ended_at__isnull=True).first()


def machine_name(attempt: JobAttempt) -> str:
    """What a rented machine is called: how the reconciler recognises ours."""
    return f"{MACHINE_PREFIX}{attempt.job.public_id}-a{attempt.number}"


def machine_handle(attempt: JobAttempt) -> Handle:
    """How the provider knows the attempt's machine."""
    return Handle(instance_id=attempt.provider_instance_id, name=machine_name(attempt))


def parse_machine_name(name: str) -> tuple[str, int] | None:
    """(job public id, attempt number) of one of our machine names; None for any other."""
    job_id, _, number = name.removeprefix(MACHINE_PREFIX).rpartition("-a")
    if not name.startswith(MACHINE_PREFIX) or not job_id or not number.isdigit():
        return None
    return job_id, int(number)


def attempt_start(*, job: TrainingJob, target: str, node_name: str = "") -> JobAttempt:
    """Create the next attempt and move the job queued → provisioning, in one transaction."""
    with transaction.atomic():
        job = TrainingJob.objects.select_for_update().get(pk=job.pk)
        number = (
            job.attempts.order_by("-number").values_list("number", flat=True).first() or 0
        ) + 1
        moved = job_transition(
            job=job,
            to=S.PROVISIONING,
            message=f"Attempt {number} starting on {target}.",
            data={"attempt": number, "target": target},
        )
        if not moved:  # already provisioning: another dispatcher (or a redelivery) got here first
            raise InvalidTransition(job.status, S.PROVISIONING)
        return JobAttempt.objects.create(
            job=job,
            number=number,
            target=target,
            node_name=node_name,
            lease_expires_at=_lease_deadline(),
        )


def attempt_end(*, attempt: JobAttempt, reason: EndReason, message: str = "") -> bool:
    """End a live attempt and move its job accordingly; False if it had already ended."""
    with transaction.atomic():
        ended = JobAttempt.objects.filter(pk=attempt.pk, ended_at__isnull=True).update(
            ended_at=timezone.now(), end_reason=reason
        )
        if not ended:
            return False
        runner = runner_for(attempt.target)
        if runner is not None:
            runner.release(attempt=attempt)
        job = TrainingJob.objects.select_for_update().get(pk=attempt.job_id)
        if job.status == S.PAUSED and reason == EndReason.CANCELLED:
            reason = EndReason.PAUSED  # the stop the pause asked for
            JobAttempt.objects.filter(pk=attempt.pk).update(end_reason=reason)
        detail = message or reason.value.replace("_", " ")
        event_append(
            job=job,
            type="status",
            level="info" if reason == EndReason.SUCCEEDED else "warning",
            message=f"Attempt {attempt.number} ended: {detail}.",
            data={"attempt": attempt.number, "end_reason": str(reason)},
        )
        _note_spot_saving(job, JobAttempt.objects.get(pk=attempt.pk))  # as release settled it
        if reason == EndReason.SUCCEEDED:
            pass  # the job moves on through finalizing → succeeded at ingest
        elif job.status == S.PAUSED:
            _end_while_paused(job, attempt, reason, detail)
        elif job.status == S.CANCELLING:
            job_transition(job=job, to=S.CANCELLED, message="Job cancelled.")
        elif job.status in (S.PROVISIONING, S.RUNNING, S.FINALIZING):
            forgiven = job.status != S.FINALIZING and _forgive_preemption(job, reason)
            used = job.attempts_counted(attempt.number)
            if reason.retryable and used < job.max_attempts and job.status != S.FINALIZING:
                free = (
                    f"preemption {job.preemptions} of {job.max_preemptions} not counted; "
                    if forgiven
                    else ""
                )
                job_transition(
                    job=job,
                    to=S.QUEUED,
                    message=f"Requeued after attempt {attempt.number} ({detail}); "
                    f"{free}{job.max_attempts - used} attempt(s) left.",
                    data={"preemptions": job.preemptions} if forgiven else None,
                )
            else:
                suffix = f" after {used} attempt(s)" if reason.retryable else ""
                job_transition(
                    job=job, to=S.FAILED, error_code=reason.value, message=f"{detail}{suffix}"
                )
    return True


def _forgive_preemption(job: TrainingJob, reason: EndReason) -> bool:
    """A preemption within the job's ``max_preemptions`` does not count against
    ``max_attempts``: the budget's start moves up by one (as for a pause). The job row is
    locked by the caller."""
    if reason != EndReason.PREEMPTED or job.preemptions >= job.max_preemptions:
        return False
    TrainingJob.objects.filter(pk=job.pk).update(
        attempt_budget_start=F("attempt_budget_start") + 1, preemptions=F("preemptions") + 1
    )
    job.attempt_budget_start += 1
    job.preemptions += 1
    return True


def _note_spot_saving(job: TrainingJob, attempt: JobAttempt) -> None:
    """A spot attempt's cost against what its machine time would have cost on demand."""
    if (
        attempt.capacity != CapacityType.SPOT
        or attempt.cost is None
        or attempt.on_demand_cost is None
    ):
        return
    saved = attempt.on_demand_cost - attempt.cost
    event_append(
        job=job,
        type="log",
        message=f"Attempt {attempt.number} ran on spot for ${attempt.cost:.2f}; on demand it "
        f"would have cost ${attempt.on_demand_cost:.2f} (saved ${saved:.2f}).",
        data={
            "attempt": attempt.number,
            "capacity": attempt.capacity,
            "cost": float(attempt.cost),
            "on_demand_cost": float(attempt.on_demand_cost),
            "saved": float(saved),
        },
    )


def _end_while_paused(
    job: TrainingJob, attempt: JobAttempt, reason: EndReason, detail: str
) -> None:
    """The paused job's attempt ended: it stays paused, unless the attempt failed for a reason
    a resume would meet again (not a stop, not a lost machine)."""
    if reason in (EndReason.PAUSED, EndReason.CANCELLED) or reason.retryable:
        return
    job_transition(
        job=job,
        to=S.FAILED,
        error_code=reason.value,
        message=f"{detail} (attempt {attempt.number}, while pausing)",
    )


def attempt_request_stop(*, attempt: JobAttempt, pause: bool = False) -> None:
    """Ask whatever runs the attempt to stop (its runner: core.runner; after commit). The job
    stays cancelling (or paused, with the attempt live) until the stop is confirmed or the
    lease expires. ``pause``: the attempt is to save a checkpoint first where its place can."""
    if pause:
        JobAttempt.objects.filter(pk=attempt.pk, ended_at__isnull=True).update(
            pause_requested_at=timezone.now()
        )
    runner = runner_for(attempt.target)
    if runner is not None:
        runner.stop(attempt=attempt, pause=pause)


def attempt_renew_lease(*, attempt: JobAttempt, **also: Any) -> None:
    """Renew the lease (and set ``also``, in the same UPDATE)."""
    JobAttempt.objects.filter(pk=attempt.pk, ended_at__isnull=True).update(
        lease_expires_at=_lease_deadline(), **also
    )


def attempts_expire_leases() -> int:
    """End every live attempt whose lease ran out (node died, poll lost it); returns count."""
    expired = JobAttempt.objects.filter(ended_at__isnull=True, lease_expires_at__lt=timezone.now())
    count = 0
    for attempt in expired.iterator():
        count += attempt_end(
            attempt=attempt,
            reason=EndReason.LEASE_EXPIRED,
            message=f"no heartbeat for {settings.TRAINHUB_LEASE_TTL_SECONDS} s; worker lost",
        )
    return count


# --- the stall watchdog ------------------------------------------------------------------------
# A heartbeat says the executor's process is alive, not that it trains: a run hung in loading
# or in a collective keeps its lease for ever. Any other event is progress (downloads and loads
# log as they go); a training step also times the steps, and the bound grows with the slowest.


def _progress(attempt: JobAttempt, events: list[dict[str, Any]]) -> dict[str, Any]:
    """The attempt's progress fields as ``events`` move them (none for heartbeats alone)."""
    moving = [e for e in events if e["type"] != "heartbeat"]
    if not moving:
        return {}
    now = timezone.now()
    updates: dict[str, Any] = {"progress_at": now}
    steps = [e["data"].get("step") for e in moving if e["type"] == "metrics"]
    step = max((n for n in steps if type(n) is int and n >= 0), default=None)
    last = attempt.progress_step
    if step is not None and (last is None or step > last):
        updates.update(progress_step=step, step_at=now)
        if last is not None and attempt.step_at is not None:
            per_step = (now - attempt.step_at).total_seconds() / (step - last)
            updates["step_seconds"] = max(per_step, attempt.step_seconds or 0.0)
    return updates


def stall_bound_seconds(attempt: JobAttempt) -> float:
    """How long the attempt may report nothing but heartbeats."""
    floor = float(settings.TRAINHUB_STALL_SECONDS)
    if attempt.step_seconds is None:
        return floor
    return max(floor, float(settings.TRAINHUB_STALL_STEPS) * attempt.step_seconds)


def attempts_end_stalled() -> int:
    """End every live attempt of a running job whose executor reported no progress within its
    bound (the job is retried from its newest checkpoint; the node or machine stops the process
    as for a lost lease); returns count. Attempts that never reported are the lease's business;
    a job finalizing (its adapter being checked here), pausing or cancelling is not training."""
    now = timezone.now()
    floor = timedelta(seconds=settings.TRAINHUB_STALL_SECONDS)
    quiet = JobAttempt.objects.filter(
        ended_at__isnull=True,
        progress_at__lt=now - floor,
        job__status__in=(S.PROVISIONING, S.RUNNING),
    )
    count = 0
    for attempt in quiet.iterator():
        assert attempt.progress_at is not None  # noqa: S101 - the filter's
        silent = (now - attempt.progress_at).total_seconds()
        if silent < stall_bound_seconds(attempt):
            continue
        where = (
            f"after step {attempt.progress_step}"
            if attempt.progress_step is not None
            else "before the first training step (loading)"
        )
        count += attempt_end(
            attempt=attempt,
            reason=EndReason.STALLED,
            message=f"no progress for {silent:.0f} s {where}, though its heartbeats went on; "
            "stopped to resume from the last checkpoint",
        )
    return count


# --- executor reports -------------------------------------------------------------------------


def attempt_record_events(
    *,
    job_id: str,
    attempt_number: int,
    events: Iterable[object],
) -> int:
    """Store an executor's event batch and apply its status reports; returns events stored.

    Events of an attempt that is not the job's live one are dropped: a late or duplicate
    message from an outdated attempt must never move the job. Who may report for which
    attempt is decided before this is called (a node attempt: its report token, checked by
    the events endpoint; a cloud attempt: read by the control plane from its provider).
    """
    attempt = (
        JobAttempt.objects.select_related("job")
        .filter(job__public_id=job_id, number=attempt_number, ended_at__isnull=True)
        .first()
    )
    if attempt is None:
        log.info("dropping events for %s attempt %s: not the live attempt", job_id, attempt_number)
        return 0
    cleaned = [e for e in (clean_executor_event(raw) for raw in events) if e is not None]
    kept = events_within_caps(job=attempt.job, attempt=attempt_number, events=cleaned)
    stored = events_store(job=attempt.job, attempt=attempt_number, events=kept)
    # Progress from all of them: over the caps a run still moves.
    attempt_renew_lease(attempt=attempt, **_progress(attempt, cleaned))
    for event in stored:
        report = Report.of_event(event.type, event.data, event.message)
        if report is not None:
            attempt_report(attempt=attempt, report=report)
    return len(stored)


def attempt_report(*, attempt: JobAttempt, report: Report) -> None:
    """Act on what was learned about the attempt's run (from its executor, or its provider
    for it), as ``REPORT_ACTIONS`` says for the job's status now."""
    job = TrainingJob.objects.get(pk=attempt.job_id)
    action = REPORT_ACTIONS[report.outcome, S(job.status)]
    if action is ReportAction.START:
        JobAttempt.objects.filter(pk=attempt.pk).update(started_at=timezone.now())
        job_transition(job=job, to=S.RUNNING, message="Training started.")
    elif action is ReportAction.FINALIZE:
        job_transition(
            job=job, to=S.FINALIZING, message="Training finished; verifying the adapter."
        )
        messages.send_ingest_artifact(attempt.pk, report.sha256)
    elif action is ReportAction.END:
        attempt_end(attempt=attempt, reason=report.end_reason, message=report.message)
