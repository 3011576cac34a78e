"""Cloud attempts: launch on a provider, poll, drive SSH executors, stop, reconcile.

Provider calls never run inside a transaction. The attempt row is committed before the launch
call and its instance id right after, so a crash in between leaves a record that the lease and
the reconciler act on. Errors follow the provider error family: a launch that surely did not
happen is retried with backoff (the attempt's lease bounds the retries); no capacity, bad
credentials and permanent refusals end the attempt with a reason.

Polls are scheduled per attempt (``next_poll_at``): each cycle takes the most overdue attempts
up to the target's budget, so a provider's rate limit degrades staleness evenly instead of
starving some jobs. Stopping is two-phase: the job stays ``cancelling`` until a poll shows
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
from jobs import storage
from jobs.errors import InvalidTransition
from jobs.models import JobAttempt, Project, TrainingJob
from jobs.services import remote
from jobs.services.attempts import (
    apply_reported_status,
    attempt_end,
    attempt_record_events,
    attempt_start,
    machine_name,
    parse_machine_name,
)
from jobs.services.dispatch import attempt_spec
from jobs.services.events import event_append
from jobs.services.projects import credential_secrets
from jobs.states import TERMINAL, EndReason, JobStatus
from providers import registry
from providers.base import Handle, LaunchRequest, ProviderAdapter, RemoteState, RemoteStatus
from providers.errors import (
    InvalidCredentials,
    NoCapacity,
    ProviderError,
    RateLimited,
    TransientProviderError,
)

log = logging.getLogger(__name__)
S = JobStatus
ALIVE = (RemoteStatus.PENDING, RemoteStatus.RUNNING)
# Seconds between two polls of one attempt: a machine still starting changes less often.
POLL_EVERY = {RemoteStatus.PENDING: 30, RemoteStatus.RUNNING: 15}
# Attempts per provider call in a poll cycle (a chunk's states are applied before the next).
POLL_CHUNK = 200
# Launches that surely did not happen are retried after these delays; then the lease decides.
LAUNCH_RETRY_SECONDS = (5, 15, 30, 60, 120)
# After a launch call that may have been applied: how long to wait before looking again.
UNCONFIRMED_WAIT_SECONDS = 60
# A stop the provider has not confirmed by then is sent again.
STOP_RESEND_SECONDS = 60
WEBHOOK_SALT = "trainhub.provider-webhook"


class MissingCredentials(Exception):
    pass


def _handle(attempt: JobAttempt) -> Handle:
    return Handle(instance_id=attempt.provider_instance_id, name=machine_name(attempt))


def provider_secrets(*, project: Project, kind: str) -> dict[str, str] | None:
    """The project's newest credential of ``kind``, else the operator's environment key when
    the project may use it; None when neither exists."""
    credential = project.credentials.filter(provider=kind).order_by("-updated_at").first()
    if credential is not None:
        return credential_secrets(credential=credential)
    key = os.environ.get(f"{kind.upper()}_API_KEY", "")
    if key and kind in project.operator_credential_providers:
        return {"api_key": key}
    return None


def adapter_for(target: registry.Target, project: Project) -> ProviderAdapter:
    if target.adapter_factory is None:
        raise ValueError(f"target {target.name} has no provider adapter")
    secrets: dict[str, str] | None = {}
    if target.credential_kind:
        secrets = provider_secrets(project=project, kind=target.credential_kind)
    if secrets is None:
        raise MissingCredentials(
            f"project {project.slug} has no '{target.credential_kind}' credential any more"
        )
    return target.adapter_factory(secrets)


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


def _send(task: str, args: list[Any], countdown: float = 0) -> None:
    from trainhub.celery import app

    app.send_task(task, args=args, countdown=countdown or None)


# --- launch -----------------------------------------------------------------------------------


def attempt_launch(*, job_pk: int) -> JobAttempt | None:
    """Start the next attempt of a queued cloud job and ask its provider for a machine."""
    job = TrainingJob.objects.get(pk=job_pk)
    target = registry.get(job.target)
    if target is None or target.adapter_factory is None or job.status != S.QUEUED:
        return None
    try:
        attempt = attempt_start(job=job, target=job.target)
    except InvalidTransition as exc:  # cancelled, or launched by a duplicate delivery meanwhile
        log.info("not launching %s: %s", job.public_id, exc)
        return None
    if target.ssh_executor:
        remote.attempt_new_ssh_key(attempt=attempt)
    attempt_provision(attempt_pk=attempt.pk)
    return attempt


def attempt_provision(*, attempt_pk: int, try_number: int = 0) -> None:
    """Ask the provider for the attempt's machine (again after a launch that did not happen)."""
    attempt = JobAttempt.objects.select_related("job", "job__project").get(pk=attempt_pk)
    job = attempt.job
    if attempt.ended_at is not None or attempt.provider_instance_id:
        return
    if job.status == S.CANCELLING:
        attempt_end(attempt=attempt, reason=EndReason.CANCELLED, message="cancelled before launch")
        return
    target = registry.get(attempt.target)
    if target is None:
        attempt_end(attempt=attempt, reason=EndReason.PROVIDER_ERROR, message="unknown target")
        return
    if attempt.launch_unconfirmed_at is not None and storage.exists(
        storage.bundle_key(job.project_id, job.public_id, attempt.number)
    ):
        _adopt_finished_run(attempt)
        return
    try:
        adapter = adapter_for(target, job.project)
        handle = adapter.launch(_launch_request(attempt, target))
    except (MissingCredentials, ProviderError) as exc:
        _launch_failed(attempt, target, exc, try_number)
        return
    JobAttempt.objects.filter(pk=attempt.pk).update(
        provider_instance_id=handle.instance_id,
        launch_unconfirmed_at=None,
        next_poll_at=timezone.now() + timedelta(seconds=POLL_EVERY[RemoteStatus.PENDING]),
    )
    event_append(
        job=job,
        type="log",
        message=f"Attempt {attempt.number}: {target.name} accepted the launch as "
        f"{handle.instance_id}.",
        data={"attempt": attempt.number, "instance": handle.instance_id},
    )
    # A cancel (or end) while the provider call was in flight found no instance to stop.
    if JobAttempt.objects.filter(
        Q(ended_at__isnull=False) | Q(job__status=S.CANCELLING), pk=attempt.pk
    ).exists():
        _send(cc.CANCEL_JOB, [job.pk])


def _launch_request(attempt: JobAttempt, target: registry.Target) -> LaunchRequest:
    job = attempt.job
    return LaunchRequest(
        job_id=job.public_id,
        attempt=attempt.number,
        name=machine_name(attempt),
        max_runtime_seconds=job.max_runtime_seconds,
        # Handler-style providers run the spec as given; SSH ones get it once the machine is up.
        spec={} if target.ssh_executor else attempt_spec(attempt, sinks=[], public=True),
        gpu=dict(job.gpu),
        ssh_public_key=remote.attempt_public_key(attempt) if target.ssh_executor else "",
        webhook_url=webhook_url(attempt),
    )


def _launch_failed(
    attempt: JobAttempt, target: registry.Target, exc: Exception, try_number: int
) -> None:
    log.warning("launch of %s failed: %s", machine_name(attempt), exc)
    if isinstance(exc, NoCapacity):
        attempt_end(attempt=attempt, reason=EndReason.NO_CAPACITY, message=str(exc))
    elif isinstance(exc, InvalidCredentials):
        attempt_end(
            attempt=attempt,
            reason=EndReason.PROVIDER_ERROR,
            message=f"{target.name} refused the project's credential: {exc}",
        )
    elif isinstance(exc, TransientProviderError) and exc.maybe_applied and not target.ssh_executor:
        # The provider may run it already and cannot be asked (no listing by name): look at
        # the attempt's output before submitting again, rather than pay for two runs blindly.
        JobAttempt.objects.filter(pk=attempt.pk).update(launch_unconfirmed_at=timezone.now())
        event_append(
            job=attempt.job,
            type="log",
            level="warning",
            message=f"Attempt {attempt.number}: {target.name} may have accepted the launch "
            f"without answering ({exc}); checking the attempt's output in "
            f"{UNCONFIRMED_WAIT_SECONDS} s before submitting again.",
            data={"attempt": attempt.number},
        )
        _send(cc.PROVISION_ATTEMPT, [attempt.pk, try_number + 1], UNCONFIRMED_WAIT_SECONDS)
    elif isinstance(exc, TransientProviderError | RateLimited) and try_number < len(
        LAUNCH_RETRY_SECONDS
    ):
        # Not applied (or found by name next time): try again; the lease ends a hopeless run.
        delay = max(LAUNCH_RETRY_SECONDS[try_number], getattr(exc, "retry_after", 0) or 0)
        _send(cc.PROVISION_ATTEMPT, [attempt.pk, try_number + 1], delay)
    else:
        attempt_end(
            attempt=attempt, reason=EndReason.PROVIDER_ERROR, message=f"launch failed: {exc}"
        )


def _adopt_finished_run(attempt: JobAttempt) -> None:
    """A launch we could not confirm did run, and its bundle is there: verify it."""
    job = attempt.job
    event_append(
        job=job,
        type="log",
        message=f"Attempt {attempt.number}'s unconfirmed launch did run: its bundle is stored.",
        data={"attempt": attempt.number},
    )
    _report_finished(attempt)


def _report_finished(attempt: JobAttempt, message: str = "") -> None:
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
    if state.status in ALIVE:
        if target.ssh_executor:
            remote.attempt_drive(attempt=attempt, state=state)
        elif state.status == RemoteStatus.RUNNING and job.status == S.PROVISIONING:
            apply_reported_status(attempt, "running", {}, state.message)
        return True
    if state.status == RemoteStatus.SUCCEEDED:
        _report_finished(attempt, state.message)
    elif state.status == RemoteStatus.FAILED:
        apply_reported_status(attempt, "failed", {"code": state.error_code}, state.message)
    elif state.status == RemoteStatus.CANCELLED:
        attempt_end(attempt=attempt, reason=EndReason.CANCELLED, message=state.message)
    else:
        attempt_end(attempt=attempt, reason=EndReason.WORKER_LOST, message=state.message)
    return False


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
        _send(cc.CANCEL_JOB, [job_pk], STOP_RESEND_SECONDS)


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
