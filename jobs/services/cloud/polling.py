"""Polling cloud attempts after launch (services.launch): turn what the provider shows into
reports (:func:`provider_reports`), let the place act on a machine alive (an SSH-driven one
drives its executor: cloud.rental), check the billed rate.

Polls are scheduled per attempt (``next_poll_at``): each cycle takes the most overdue attempts
up to the target's budget, so a provider's rate limit degrades staleness evenly instead of
starving some jobs. A billed rate above the job's max_price_per_hour stops the machine.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import F, Q, QuerySet
from django.utils import timezone

from jobs.models import JobAttempt
from jobs.services.accounts.targets import MissingCredentials, adapter_for
from jobs.services.cloud import offers
from jobs.services.cloud.rental import Rental, rental_for
from jobs.services.core import costs
from jobs.services.core.attempts import (
    attempt_end,
    attempt_record_events,
    attempt_report,
    machine_handle,
)
from jobs.services.core.events import event_append
from jobs.services.core.runner import Report, finished
from jobs.services.core.stopping import ALIVE, confirm_stop, pauses_in_place
from jobs.states import EndReason, JobStatus
from providers import registry
from providers.base import ProviderAdapter, RemoteState, RemoteStatus
from providers.errors import InvalidCredentials, ProviderError
from trainhub_contract.outcomes import Outcome

log = logging.getLogger(__name__)
S = JobStatus
# Seconds between two polls of one attempt: a machine still starting changes less often.
POLL_EVERY = {RemoteStatus.PENDING: 30, RemoteStatus.RUNNING: 15}
# Attempts per provider call in a poll cycle (a chunk's states are applied before the next).
POLL_CHUNK = 200


def attempts_poll_target(*, target: str) -> int:
    """Poll the most overdue live attempts of ``target`` (up to its budget); returns how many."""
    rented = rental_for(target)
    if rented is None:
        return 0
    entry, rental = rented
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
        if adapter is None:
            continue
        # In chunks, so a state is applied a moment after its answer, not after the whole batch.
        for start in range(0, len(attempts), POLL_CHUNK):
            _poll(entry, rental, adapter, attempts[start : start + POLL_CHUNK], cycle)
    return len(due)


def attempt_poll(*, attempt_pk: int) -> None:
    """Poll one attempt now (a provider's webhook said something changed)."""
    attempt = _polled_attempts().filter(pk=attempt_pk).first()
    rented = rental_for(attempt.target) if attempt is not None else None
    if attempt is not None and rented is not None:
        entry, rental = rented
        adapter = _adapter_or_end(entry, [attempt])
        if adapter is not None:
            _poll(entry, rental, adapter, [attempt], timezone.now())


def _polled_attempts() -> QuerySet[JobAttempt]:
    return (
        JobAttempt.objects.select_related("job", "job__project")
        .filter(ended_at__isnull=True)
        .exclude(provider_instance_id="")
    )


def _adapter_or_end(target: registry.Target, attempts: list[JobAttempt]) -> ProviderAdapter | None:
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
    rental: Rental,
    adapter: ProviderAdapter,
    attempts: list[JobAttempt],
    cycle: datetime,
) -> None:
    try:
        states = adapter.poll([machine_handle(a) for a in attempts])
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
        if _apply_remote_state(target, rental, adapter, attempt, state):
            alive[POLL_EVERY[state.status]].append(attempt.pk)
    now = timezone.now()
    lease = now + timedelta(seconds=settings.TRAINHUB_LEASE_TTL_SECONDS)
    for seconds, pks in alive.items():  # one UPDATE per interval, not one per attempt
        JobAttempt.objects.filter(pk__in=pks, ended_at__isnull=True).update(
            lease_expires_at=lease, polled_at=now, next_poll_at=cycle + timedelta(seconds=seconds)
        )


def provider_reports(state: RemoteState) -> tuple[Report, ...]:
    """What a provider's final state of a machine says about its run, as reports."""
    if state.status == RemoteStatus.SUCCEEDED:
        return finished(state.message)
    if state.status == RemoteStatus.FAILED:
        return (Report(Outcome.FAILED, code=state.error_code, message=state.message),)
    if state.status == RemoteStatus.CANCELLED:
        return (Report(Outcome.CANCELLED, message=state.message),)
    # Lost: the provider no longer knows the machine, or it died under us.
    return (Report(Outcome.FAILED, code=EndReason.WORKER_LOST, message=state.message),)


def _apply_remote_state(
    target: registry.Target,
    rental: Rental,
    adapter: ProviderAdapter,
    attempt: JobAttempt,
    state: RemoteState,
) -> bool:
    """Act on what the provider said; True while the machine is alive."""
    job = attempt.job
    if state.events:
        _record_new_events(attempt, state.events)
        job.refresh_from_db(fields=["status"])
    if job.status == S.PAUSED:
        if state.status == RemoteStatus.SUCCEEDED:  # finished before the pause reached it
            _report(attempt, state)
            return False
        if state.status in ALIVE and pauses_in_place(attempt):
            rental.alive(attempt, state, pause=True)
            return True
    if job.status in (S.CANCELLING, S.PAUSED) or attempt.stop_requested_at is not None:
        return confirm_stop(adapter, attempt, state)
    rate = state.price_per_hour
    if rate is not None and state.status in ALIVE and _over_price_cap(target, attempt, rate):
        return False
    if state.status in ALIVE:
        rental.alive(attempt, state, pause=False)
        return True
    _report(attempt, state)
    return False


def _report(attempt: JobAttempt, state: RemoteState) -> None:
    for report in provider_reports(state):
        attempt_report(attempt=attempt, report=report)


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
