"""What rented machines cost: the rate each attempt is billed at, its cost when it ends, the
sums on its job, and a project's spend per hour (its ceiling is checked at placement).

An attempt's cost is its billed rate (else the quoted offer rate: the spot price for a spot
machine) times the time from the provider accepting the launch to the attempt's end, when the
stop is sent. Providers bill a little past that (until the machine is gone), so this is a close
lower bound, not an invoice. Its ``on_demand_cost`` is the same time at the offer's on-demand
rate: what the job would have paid without spot (equal to ``cost`` for on-demand machines).
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

from django.db.models import Sum

from jobs.models import JobAttempt, TrainingJob
from jobs.states import JobCapacity
from providers.base import CapacityType, Offer

CENTS = Decimal("0.0001")
# What an attempt's row needs for its rates (``project_spend_per_hour`` loads only these).
RATE_FIELDS = ("billed_rate_per_hour", "offer", "capacity", "on_demand_rate_per_hour")


def money(value: float | Decimal | str) -> Decimal:
    return Decimal(str(value)).quantize(CENTS)


def rental_terms(offer: Offer, capacity: JobCapacity | str) -> tuple[CapacityType, float] | None:
    """How a job asking for ``capacity`` would rent ``offer``, and at what price per hour; None
    when it cannot (spot asked, the offer has no spot price). ``any`` takes the cheaper."""
    spot = offer.spot_price_per_hour
    if capacity == JobCapacity.SPOT:
        return None if spot is None else (CapacityType.SPOT, spot)
    if capacity == JobCapacity.ANY and spot is not None and spot < offer.price_per_hour:
        return CapacityType.SPOT, spot
    return CapacityType.ON_DEMAND, offer.price_per_hour


def quoted_rate(attempt: JobAttempt) -> Decimal | None:
    """The offer's price for the way the attempt rents it (spot or on demand)."""
    offer = attempt.offer or {}
    key = "spot_price_per_hour" if attempt.capacity == CapacityType.SPOT else "price_per_hour"
    quoted = offer.get(key)
    return money(quoted) if quoted is not None else None


def attempt_rate(attempt: JobAttempt) -> Decimal | None:
    """What the attempt's machine costs per hour: as billed, else as quoted by its offer."""
    if attempt.billed_rate_per_hour is not None:
        return attempt.billed_rate_per_hour
    return quoted_rate(attempt)


def on_demand_rate(attempt: JobAttempt) -> Decimal | None:
    """What the attempt's machine would cost per hour on demand: the offer's on-demand rate
    for a spot machine, else the rate it is billed at."""
    if attempt.capacity == CapacityType.SPOT and attempt.on_demand_rate_per_hour is not None:
        return attempt.on_demand_rate_per_hour
    return attempt_rate(attempt)


def project_spend_per_hour(*, project_id: int, exclude_attempt: int | None = None) -> Decimal:
    """USD per hour of the project's live rented machines (launched or being launched)."""
    live = JobAttempt.objects.filter(job__project_id=project_id, ended_at__isnull=True)
    if exclude_attempt is not None:
        live = live.exclude(pk=exclude_attempt)
    rates = (attempt_rate(a) for a in live.only(*RATE_FIELDS))
    return sum((r for r in rates if r is not None), Decimal(0))


def over_ceiling(*, ceiling: Decimal | None, spend: Decimal, price: float) -> str:
    """Why renting at ``price`` would break the project's spend ceiling ('' when it would not)."""
    if ceiling is None or spend + money(price) <= ceiling:
        return ""
    return f"the project spends ${spend:.2f}/h; this would exceed its ceiling of ${ceiling:.2f}/h"


def attempt_record_rate(*, attempt: JobAttempt, rate: float) -> bool:
    """Store the rate the provider reports; True when it is new or changed."""
    value = money(rate)
    if attempt.billed_rate_per_hour == value:
        return False
    JobAttempt.objects.filter(pk=attempt.pk).update(billed_rate_per_hour=value)
    attempt.billed_rate_per_hour = value
    return True


def rented_cost(
    attempt: JobAttempt,
    *,
    until: datetime,
    since: datetime | None = None,
    on_demand: bool = False,
) -> Decimal | None:
    """What the attempt's machine costs from its launch (or ``since``, if later) to ``until``:
    its rate x the time. None when it never launched or has no rate. The one rule for a cost
    settled at the end and for a live machine's cost so far (the admin's job page, dashboard).
    ``on_demand``: the same time at the on-demand rate (``on_demand_rate``)."""
    rate = on_demand_rate(attempt) if on_demand else attempt_rate(attempt)
    if attempt.launched_at is None or rate is None:
        return None
    start = max(attempt.launched_at, since) if since is not None else attempt.launched_at
    hours = Decimal((until - start).total_seconds()) / 3600
    return money(rate * max(hours, Decimal(0)))


def attempt_settle_cost(*, attempt_pk: int) -> JobAttempt:
    """The attempt ended: its cost (and on-demand equivalent) from launch to end, and the
    job's sums. Returns the attempt with both costs set (None when it never launched)."""
    attempt = JobAttempt.objects.get(pk=attempt_pk)
    if attempt.ended_at is not None:
        attempt.cost = rented_cost(attempt, until=attempt.ended_at)
        attempt.on_demand_cost = rented_cost(attempt, until=attempt.ended_at, on_demand=True)
    if attempt.cost is not None:
        JobAttempt.objects.filter(pk=attempt.pk).update(
            cost=attempt.cost, on_demand_cost=attempt.on_demand_cost
        )
    job_costs_refresh(job_pk=attempt.job_id)
    return attempt


def job_costs_refresh(*, job_pk: int) -> None:
    sums = JobAttempt.objects.filter(job_id=job_pk).aggregate(
        estimated=Sum("estimated_cost"), cost=Sum("cost"), on_demand=Sum("on_demand_cost")
    )
    TrainingJob.objects.filter(pk=job_pk).update(
        estimated_cost=sums["estimated"], cost=sums["cost"], on_demand_cost=sums["on_demand"]
    )
