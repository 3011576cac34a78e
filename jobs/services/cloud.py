"""Cloud attempts after launch (services.launch): poll, drive SSH executors, check the billed
rate, stop, reconcile.

Polls are scheduled per attempt (``next_poll_at``): each cycle takes the most overdue attempts
up to the target's budget, so a provider's rate limit degrades staleness evenly instead of
starving some jobs. A billed rate above the job's max_price_per_hour stops the machine.
Stopping is two-phase: the job stays ``cancelling`` until a poll shows
the machine gone.
"""

from __future__ import annotations

import logging
import os
from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core import signing
from django.db.models import F, Q
from django.urls import reverse
from django.utils import timezone

from gpu_worker import celery_conf as cc
from jobs.models import JobAttempt, Project, TrainingJob
from jobs.services import costs, offers, remote
from jobs.services.attempts import (
    apply_reported_status,
    attempt_end,
    attempt_record_events,
    machine_name,
    parse_machine_name,
)
from jobs.services.events import event_append
from jobs.services.targets import MissingCredentials, adapter_for
from jobs.states import TERMINAL, EndReason, JobStatus
from providers import registry
from providers.base import Handle, ProviderAdapter, RemoteState, RemoteStatus
from providers.errors import (
    InvalidCredentials,
    ProviderError,
)

log = logging.getLogger(__name__)
S = JobStatus
ALIVE = (RemoteStatus.PENDING, RemoteStatus.RUNNING)
# Seconds between two polls of one attempt: a machine still starting changes less often.
POLL_EVERY = {RemoteStatus.PENDING: 30, RemoteStatus.RUNNING: 15}
# Attempts per provider call in a poll cycle (a chunk's states are applied before the next).
POLL_CHUNK = 200
# A stop the provider has not confirmed by then is sent again.
STOP_RESEND_SECONDS = 60
WEBHOOK_SALT = "trainhub.provider-webhook"


def _handle(attempt: JobAttempt) -> Handle:
    return Handle(instance_id=attempt.provider_instance_id, name=machine_name(attempt))


def webhook_url(attempt: JobAttempt) -> str:
    """A per-attempt URL the provider may call on completion ('' without a public address)."""
    if not settings.TRAINHUB_PUBLIC_URL:
        return ""
    token = signing.Signer(salt=WEBHOOK_SALT).sign(str(attempt.pk))
    return settings.TRAINHUB_PUBLIC_URL.rstrip("/") + reverse("provider-webhook", args=[token])


def webhook_attempt(token: str) -> int | None:
    try:
        return int(signing.Signer(salt=WEBHOOK_SALT).unsign(token))
    except (signing.BadSignature, ValueError):
        return None


def send_task(task: str, args: list[Any], countdown: float = 0) -> None:
    from trainhub.celery import app

    app.send_task(task, args=args, countdown=countdown or None)


def report_finished(attempt: JobAttempt, message: str = "") -> None:
    """The run finished; it may never have been seen running (it ran between two polls)."""
    apply_reported_status(attempt, "running", {}, "")  # only moves a job still provisioning
    apply_reported_status(attempt, "succeeded", {}, message)


# --- poll -------------------------------------------------------------------------------------


def attempts_poll_target(*, target: str) -> int:
    """Poll the most overdue live attempts of ``target`` (up to its budget); returns how many."""
    entry = registry.get(target)
    if entry is None or entry.adapter_factory is None:
        return 0
    now = timezone.now()
    # Least recently polled first: when the budget is short, every attempt waits alike (a
    # round robin); when it is not, pending ones are due less often (POLL_EVERY).
    due = list(
        _polled_attempts()
        .filter(target=target)
        .filter(Q(next_poll_at__isnull=True) | Q(next_poll_at__lte=now))
        .order_by(F("polled_at").asc(nulls_first=True), "pk")[: entry.poll_batch]
    )
    by_project: dict[int, list[JobAttempt]] = defaultdict(list)
    for attempt in due:
        by_project[attempt.job.project_id].append(attempt)
    # The next poll counts from the cycle's start (less a second of beat jitter): counted from
    # the end of a chunk, it would just miss the tick it is due at and wait 10 s more.
    cycle = now - timedelta(seconds=1)
    for attempts in by_project.values():
        adapter = _adapter_or_end(entry, attempts)
        # In chunks, so a state is applied a moment after its answer, not after the whole batch.
        for start in range(0, len(attempts) if adapter else 0, POLL_CHUNK):
            _poll(entry, adapter, attempts[start : start + POLL_CHUNK], cycle)
    return len(due)


def attempt_poll(*, attempt_pk: int) -> None:
    """Poll one attempt now (a provider's webhook said something changed)."""
    attempt = _polled_attempts().filter(pk=attempt_pk).first()
    entry = registry.get(attempt.target) if attempt is not None else None
    if attempt is not None and entry is not None and entry.adapter_factory is not None:
        adapter = _adapter_or_end(entry, [attempt])
        if adapter is not None:
            _poll(entry, adapter, [attempt], timezone.now())


def _polled_attempts() -> Any:
    return (
        JobAttempt.objects.select_related("job", "job__project")
        .filter(ended_at__isnull=True)
        .exclude(provider_instance_id="")
    )


def _adapter_or_end(target: registry.Target, attempts: list[JobAttempt]) -> Any:
    """The adapter of the attempts' project; None (and the attempts ended) without a key."""
    try:
        return adapter_for(target, attempts[0].job.project)
    except MissingCredentials as exc:
        _end_unreachable(attempts, exc)
        return None


def _end_unreachable(attempts: list[JobAttempt], exc: Exception) -> None:
    for attempt in attempts:
        attempt_end(
            attempt=attempt,
            reason=EndReason.PROVIDER_ERROR,
            message=f"cannot reach the machine: {exc}",
        )


def _poll(
    target: registry.Target,
    adapter: ProviderAdapter,
    attempts: list[JobAttempt],
    cycle: datetime,
) -> None:
    try:
        states = adapter.poll([_handle(a) for a in attempts])
    except InvalidCredentials as exc:  # revoked: no poll will work again
        _end_unreachable(attempts, exc)
        return
    except ProviderError as exc:  # unknown this cycle; the lease bounds how long that may last
        log.warning("poll of %d %s attempt(s) failed: %s", len(attempts), target.name, exc)
        return
    alive: dict[int, list[int]] = defaultdict(list)
    for attempt in attempts:
        state = states.get(attempt.provider_instance_id)
        if state is None:
            continue
        if _apply_remote_state(target, adapter, attempt, state):
            alive[POLL_EVERY[state.status]].append(attempt.pk)
    now = timezone.now()
    lease = now + timedelta(seconds=settings.TRAINHUB_LEASE_TTL_SECONDS)
    for seconds, pks in alive.items():  # one UPDATE per interval, not one per attempt
        JobAttempt.objects.filter(pk__in=pks, ended_at__isnull=True).update(
            lease_expires_at=lease, polled_at=now, next_poll_at=cycle + timedelta(seconds=seconds)
        )


def _apply_remote_state(
    target: registry.Target, adapter: ProviderAdapter, attempt: JobAttempt, state: RemoteState
) -> bool:
    """Act on what the provider said; True while the machine is alive."""
    job = attempt.job
    if state.events:
        _record_new_events(attempt, state.events)
        job.refresh_from_db(fields=["status"])
    if job.status == S.CANCELLING or attempt.stop_requested_at is not None:
        return _confirm_stop(adapter, attempt, state)
    rate = state.price_per_hour
    if rate is not None and state.status in ALIVE and _over_price_cap(target, attempt, rate):
        return False
    if state.status in ALIVE:
        if target.ssh_executor:
            remote.attempt_drive(attempt=attempt, state=state)
        elif state.status == RemoteStatus.RUNNING and job.status == S.PROVISIONING:
            apply_reported_status(attempt, "running", {}, state.message)
        return True
    if state.status == RemoteStatus.SUCCEEDED:
        report_finished(attempt, state.message)
    elif state.status == RemoteStatus.FAILED:
        apply_reported_status(attempt, "failed", {"code": state.error_code}, state.message)
    elif state.status == RemoteStatus.CANCELLED:
        attempt_end(attempt=attempt, reason=EndReason.CANCELLED, message=state.message)
    else:
        attempt_end(attempt=attempt, reason=EndReason.WORKER_LOST, message=state.message)
    return False


def _over_price_cap(target: registry.Target, attempt: JobAttempt, rate: float) -> bool:
    """Store the rate the provider bills; True (and the attempt ended, its machine stopped)
    when it is above the job's cap: an offer's quote is not a promise (Vast prices move)."""
    if costs.attempt_record_rate(attempt=attempt, rate=rate):
        event_append(
            job=attempt.job,
            type="log",
            message=f"Attempt {attempt.number}: {target.name} bills ${rate:.4f}/h.",
            data={"attempt": attempt.number, "billed_rate_per_hour": rate},
        )
    cap = attempt.job.max_price_per_hour
    if cap is None or costs.money(rate) <= cap:
        return False
    if attempt.offer:
        offers.offer_refused(attempt.offer, f"billed ${rate:.2f}/h")
    attempt_end(
        attempt=attempt,
        reason=EndReason.PRICE_CAP_EXCEEDED,
        message=f"{target.name} bills ${rate:.4f}/h, above the job's max_price_per_hour of "
        f"${cap}/h; the machine is terminated",
    )
    return True


def _record_new_events(attempt: JobAttempt, events: Iterable[dict[str, Any]]) -> None:
    """Providers repeat a window of recent events on every poll: store only unseen ones."""
    last = (
        attempt.job.events.filter(attempt=attempt.number)
        .order_by("-seq")
        .values_list("seq", flat=True)
        .first()
    )
    fresh = [
        e for e in events if last is None or not isinstance(e.get("seq"), int) or e["seq"] > last
    ]
    if fresh:
        attempt_record_events(
            job_id=attempt.job.public_id, attempt_number=attempt.number, events=fresh
        )


def _confirm_stop(adapter: ProviderAdapter, attempt: JobAttempt, state: RemoteState) -> bool:
    """Second phase of a stop: the attempt ends once the provider shows the machine gone."""
    if state.status not in ALIVE:
        attempt_end(attempt=attempt, reason=EndReason.CANCELLED, message="stopped at the provider")
        return False
    sent = attempt.stop_requested_at
    if sent is None or timezone.now() - sent > timedelta(seconds=STOP_RESEND_SECONDS):
        _request_stop(adapter, attempt)
    return True


def _request_stop(adapter: ProviderAdapter, attempt: JobAttempt) -> bool:
    try:
        adapter.cancel(_handle(attempt))
    except ProviderError as exc:
        log.warning("stop of %s failed (sent again later): %s", machine_name(attempt), exc)
        return False
    JobAttempt.objects.filter(pk=attempt.pk).update(
        stop_requested_at=timezone.now(), next_poll_at=timezone.now()
    )
    return True


# --- stop -------------------------------------------------------------------------------------


def attempts_stop(*, job_pk: int) -> None:
    """Stop the job's cloud machines, whatever the outcome (a finished attempt's machine must
    stop billing too). The live attempt is stopped only once the job is cancelling or over:
    while the job runs, it is a newer attempt than the lost one whose end sent this stop.
    A stop that fails is sent again by this task (and, at worst, by the reconciler)."""
    job = TrainingJob.objects.select_related("project").get(pk=job_pk)
    attempts = job.attempts.exclude(provider_instance_id="").filter(
        Q(ended_at__isnull=True) | Q(stop_requested_at__isnull=True)
    )
    failed = False
    for attempt in attempts.select_related("job"):
        if attempt.ended_at is None and job.status not in (S.CANCELLING, *TERMINAL):
            continue
        target = registry.get(attempt.target)
        if target is None or target.adapter_factory is None:
            continue
        try:
            adapter = adapter_for(target, job.project)
        except MissingCredentials as exc:
            log.error("cannot stop %s: %s", machine_name(attempt), exc)
            continue
        failed |= not _request_stop(adapter, attempt)
    if failed:
        send_task(cc.CANCEL_JOB, [job_pk], STOP_RESEND_SECONDS)


# --- reconcile --------------------------------------------------------------------------------


def providers_reconcile() -> int:
    """Terminate every machine of ours (``trainhub-<job>-a<n>``) that no live attempt owns;
    returns how many were terminated. One listing per target and credential."""
    terminated = 0
    for target in registry.cloud_targets():
        if target.misconfiguration():
            continue  # nothing can have been launched on it as configured
        for project in _projects_with_credentials(target):
            try:
                adapter = adapter_for(target, project)
                machines = adapter.list_instances()
            except (MissingCredentials, ProviderError) as exc:
                log.warning("reconcile of %s for %s skipped: %s", target.name, project.slug, exc)
                continue
            for handle in machines:
                terminated += _reconcile_machine(target, adapter, handle)
    return terminated


def _projects_with_credentials(target: registry.Target) -> list[Project]:
    kind = target.credential_kind
    if kind is None:
        return list(Project.objects.order_by("pk")[:1])
    projects = list(Project.objects.filter(credentials__provider=kind).distinct().order_by("pk"))
    if os.environ.get(f"{kind.upper()}_API_KEY"):
        own = {p.pk for p in projects}
        for project in Project.objects.exclude(pk__in=own).order_by("pk"):
            if kind in project.operator_credential_providers:
                projects.append(project)  # one listing covers the operator's account
                break
    return projects


def _reconcile_machine(target: registry.Target, adapter: ProviderAdapter, handle: Handle) -> int:
    owner = (
        JobAttempt.objects.select_related("job")
        .filter(target=target.name, provider_instance_id=handle.instance_id)
        .first()
    )
    if owner is not None and owner.ended_at is None:
        return 0
    if owner is None and _launch_in_flight(handle.name):
        return 0  # created a moment ago; its id is about to be stored
    reason = (
        f"attempt {owner.number} ended ({owner.end_reason})"
        if owner is not None
        else "no attempt owns it"
    )
    try:
        adapter.cancel(handle)
    except ProviderError as exc:
        log.warning("reconciler could not terminate %s: %s", handle.name, exc)
        return 0
    log.warning(
        "reconciler terminated %s %s (%s): %s", target.name, handle.instance_id, handle.name, reason
    )
    job = owner.job if owner is not None else _job_of(handle.name)
    if job is not None:
        event_append(
            job=job,
            type="log",
            level="warning",
            message=f"Reconciler terminated {target.name} machine {handle.instance_id} "
            f"({handle.name}): {reason}.",
            data={"instance": handle.instance_id, "reason": reason},
        )
    return 1


def _launch_in_flight(name: str) -> bool:
    parsed = parse_machine_name(name)
    return parsed is not None and (
        JobAttempt.objects.filter(
            job__public_id=parsed[0],
            number=parsed[1],
            ended_at__isnull=True,
            provider_instance_id="",
        ).exists()
    )


def _job_of(name: str) -> TrainingJob | None:
    parsed = parse_machine_name(name)
    return TrainingJob.objects.filter(public_id=parsed[0]).first() if parsed else None
