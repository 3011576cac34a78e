"""Launching a cloud attempt: ask a provider for the attempt's machine.

Provider calls never run inside a transaction. The attempt row is committed before the launch
call and its instance id right after, so a crash in between leaves a record that the lease and
the reconciler act on. Placement hands over candidate offers, cheapest first: one that refuses
for capacity is remembered (services.offers) and the next is tried within the same attempt.
Other errors follow the provider error family: a launch that surely did not happen is retried
with backoff (the attempt's lease bounds the retries); bad credentials and permanent refusals
end the attempt with a reason. What differs between the rented places (what the request
carries for the executor, whether an unanswered launch may be sent again) is asked of the
place's runner (cloud.rental).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from datetime import timedelta
from decimal import Decimal

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from jobs import storage
from jobs.errors import InvalidTransition
from jobs.models import JobAttempt, Project, TrainingJob
from jobs.services.accounts.targets import MissingCredentials, adapter_for
from jobs.services.cloud import offers
from jobs.services.cloud.polling import POLL_EVERY
from jobs.services.cloud.provider_webhooks import webhook_url
from jobs.services.cloud.rental import ExecutorStart, Rental, rental_for
from jobs.services.core import costs
from jobs.services.core.attempts import attempt_end, attempt_report, attempt_start, machine_name
from jobs.services.core.events import event_append
from jobs.services.core.runner import finished
from jobs.services.outbox import messages
from jobs.states import EndReason, JobStatus
from providers import registry
from providers.base import CapacityType, LaunchRequest, Offer, RemoteStatus
from providers.errors import (
    InvalidCredentials,
    NoCapacity,
    ProviderError,
    RateLimited,
    TransientProviderError,
)

log = logging.getLogger(__name__)
S = JobStatus
# Launches that surely did not happen are retried after these delays; then the lease decides.
LAUNCH_RETRY_SECONDS = (5, 15, 30, 60, 120)
# After a launch call that may have been applied: how long to wait before looking again.
UNCONFIRMED_WAIT_SECONDS = 60


def offer_label(offer: Offer, terms: tuple[CapacityType, float] | None = None) -> str:
    """'vastai 4821 (1x RTX 4090 24 GB, $0.35/h)': how events and reasons name an offer;
    with ``terms`` (costs.rental_terms) a spot rental says so: '$0.12/h spot'."""
    where = f" in {offer.region}" if offer.region else ""
    price, spot = offer.price_per_hour, ""
    if terms is not None and terms[0] == CapacityType.SPOT:
        price, spot = terms[1], " spot"
    return (
        f"{offer.target} {offer.offer_id} ({offer.gpu_count}x {offer.gpu_name} "
        f"{offer.vram_gb:g} GB{where}, ${price:.2f}/h{spot})"
    )


def attempt_launch(*, job: TrainingJob, candidates: Sequence[Offer] = ()) -> JobAttempt | None:
    """Start the next attempt of a queued cloud job and launch it: on the first candidate offer
    that takes it, or (targets without a price list) wherever the job's target chooses."""
    rented = rental_for(candidates[0].target if candidates else job.target)
    if rented is None:
        return None
    target, _ = rented
    try:
        attempt = attempt_start(job=job, target=target.name)
    except InvalidTransition as exc:  # cancelled, or launched by a duplicate delivery meanwhile
        log.info("not launching %s: %s", job.public_id, exc)
        return None
    attempt_provision(attempt_pk=attempt.pk, candidates=candidates)
    return attempt


def attempt_provision(
    *, attempt_pk: int, try_number: int = 0, candidates: Sequence[Offer] = ()
) -> None:
    """Ask the provider for the attempt's machine (again after a launch that did not happen:
    then on the offer the attempt holds)."""
    attempt = JobAttempt.objects.select_related("job", "job__project").get(pk=attempt_pk)
    job = attempt.job
    if attempt.ended_at is not None or attempt.provider_instance_id:
        return
    if job.status in (S.CANCELLING, S.PAUSED):  # a paused job's end reason becomes "paused"
        word = "paused" if job.status == S.PAUSED else "cancelled"
        attempt_end(attempt=attempt, reason=EndReason.CANCELLED, message=f"{word} before launch")
        return
    if attempt.launch_unconfirmed_at is not None and storage.exists(
        storage.bundle_key(job.project_id, job.public_id, attempt.number)
    ):
        _adopt_finished_run(attempt)
        return
    choices: Sequence[Offer | None] = candidates or [
        Offer(**attempt.offer) if attempt.offer else None
    ]
    refusals: list[str] = []
    for offer in choices:
        if offer is not None:
            why = _claim_offer(attempt, offer)
            if why:
                label = offer_label(offer, costs.rental_terms(offer, job.capacity))
                refusals.append(f"{label}: {why}")
                continue
        rented = rental_for(attempt.target)
        if rented is None:
            attempt_end(attempt=attempt, reason=EndReason.PROVIDER_ERROR, message="unknown target")
            return
        target, rental = rented
        try:
            request = _launch_request(attempt, target, rental.executor_start(attempt))
            handle = adapter_for(target, job.project).launch(request)
        except NoCapacity as exc:
            if offer is None:
                _launch_failed(attempt, target, rental, exc, try_number)
                return
            offers.offer_refused(offer, f"no capacity: {exc.message}")
            label = offer_label(offer, costs.rental_terms(offer, job.capacity))
            refusals.append(f"{label}: no capacity ({exc.message})")
            continue
        except (MissingCredentials, ProviderError) as exc:
            _launch_failed(attempt, target, rental, exc, try_number)
            return
        _launched(attempt, target, handle.instance_id, offer)
        return
    attempt_end(
        attempt=attempt,
        reason=EndReason.NO_CAPACITY,
        message="no offer took the launch: " + "; ".join(refusals),
    )


def _claim_offer(attempt: JobAttempt, offer: Offer) -> str:
    """Make ``offer`` the attempt's, rented as the job's ``capacity`` asks (spot or on demand,
    costs.rental_terms), unless the project's spend ceiling forbids it (checked with the
    project row locked, so two launches cannot both take the last dollars)."""
    terms = costs.rental_terms(offer, attempt.job.capacity)
    if terms is None:
        return "not offered as spot"
    capacity, price = terms
    with transaction.atomic():
        project = Project.objects.select_for_update().get(pk=attempt.job.project_id)
        if project.max_spend_per_hour is not None:
            spend = costs.project_spend_per_hour(project_id=project.pk, exclude_attempt=attempt.pk)
            why = costs.over_ceiling(ceiling=project.max_spend_per_hour, spend=spend, price=price)
            if why:
                return why
        fields = {
            "target": offer.target,
            "offer": dataclasses.asdict(offer),
            "capacity": str(capacity),
            "on_demand_rate_per_hour": costs.money(offer.price_per_hour),
        }
        JobAttempt.objects.filter(pk=attempt.pk).update(**fields)
    for name, value in fields.items():
        setattr(attempt, name, value)
    return ""


def _launched(
    attempt: JobAttempt, target: registry.Target, instance_id: str, offer: Offer | None
) -> None:
    job = attempt.job
    now = timezone.now()
    estimate = None
    quoted = costs.quoted_rate(attempt) if offer is not None else None
    if quoted is not None:
        hours = Decimal(job.max_runtime_seconds) / 3600
        estimate = costs.money(quoted * hours)
    if not attempt.capacity:  # a target without a price list rents on demand
        attempt.capacity = CapacityType.ON_DEMAND
    JobAttempt.objects.filter(pk=attempt.pk).update(
        capacity=attempt.capacity,
        provider_instance_id=instance_id,
        launched_at=now,
        launch_unconfirmed_at=None,
        estimated_cost=estimate,
        next_poll_at=now + timedelta(seconds=POLL_EVERY[RemoteStatus.PENDING]),
    )
    terms = (CapacityType(attempt.capacity), float(quoted)) if quoted is not None else None
    where = f" on {offer_label(offer, terms)}" if offer is not None else ""
    event_append(
        job=job,
        type="log",
        message=f"Attempt {attempt.number}: {target.name} accepted the launch as "
        f"{instance_id}{where}.",
        data={
            "attempt": attempt.number,
            "instance": instance_id,
            "capacity": attempt.capacity,
            **({"offer": dataclasses.asdict(offer)} if offer is not None else {}),
        },
    )
    if estimate is not None:
        costs.job_costs_refresh(job_pk=job.pk)
    # A cancel or pause (or end) while the provider call was in flight found no instance to
    # stop. (A paused attempt's executor has not started: nothing to checkpoint.)
    if JobAttempt.objects.filter(
        Q(ended_at__isnull=False) | Q(job__status__in=(S.CANCELLING, S.PAUSED)), pk=attempt.pk
    ).exists():
        messages.send_stop_machines(job.pk)


def _launch_request(
    attempt: JobAttempt, target: registry.Target, executor: ExecutorStart
) -> LaunchRequest:
    job = attempt.job
    return LaunchRequest(
        job_id=job.public_id,
        attempt=attempt.number,
        name=machine_name(attempt),
        max_runtime_seconds=job.max_runtime_seconds,
        spec=executor.spec,
        gpu=dict(job.gpu),
        ssh_public_key=executor.ssh_public_key,
        webhook_url=webhook_url(attempt),
        offer=Offer(**attempt.offer) if attempt.offer else None,
        # placement priced the offer this way (_claim_offer); targets without offers: on demand
        capacity=CapacityType(attempt.capacity or CapacityType.ON_DEMAND),
    )


def _launch_failed(
    attempt: JobAttempt, target: registry.Target, rental: Rental, exc: Exception, try_number: int
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
    elif (
        isinstance(exc, TransientProviderError)
        and exc.maybe_applied
        and not rental.relaunches_unanswered()
    ):
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
        messages.send_provision_attempt(attempt.pk, try_number + 1, UNCONFIRMED_WAIT_SECONDS)
    elif isinstance(exc, TransientProviderError | RateLimited) and try_number < len(
        LAUNCH_RETRY_SECONDS
    ):
        # Not applied (or found by name next time): try again; the lease ends a hopeless run.
        delay = max(LAUNCH_RETRY_SECONDS[try_number], getattr(exc, "retry_after", 0) or 0)
        messages.send_provision_attempt(attempt.pk, try_number + 1, delay)
    else:
        attempt_end(
            attempt=attempt, reason=EndReason.PROVIDER_ERROR, message=f"launch failed: {exc}"
        )


def _adopt_finished_run(attempt: JobAttempt) -> None:
    """A launch we could not confirm did run, and its bundle is there: verify it."""
    event_append(
        job=attempt.job,
        type="log",
        message=f"Attempt {attempt.number}'s unconfirmed launch did run: its bundle is stored.",
        data={"attempt": attempt.number},
    )
    for report in finished():
        attempt_report(attempt=attempt, report=report)
