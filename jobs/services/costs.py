"""What rented machines cost: the rate each attempt is billed at, its cost when it ends, the
sums on its job, and a project's spend per hour (its ceiling is checked at placement).

An attempt's cost is its billed rate (else the quoted offer rate) times the time from the
provider accepting the launch to the attempt's end, when the stop is sent. Providers bill a
little past that (until the machine is gone), so this is a close lower bound, not an invoice.
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

from django.db.models import Sum

from jobs.models import JobAttempt, TrainingJob

CENTS = Decimal("0.0001")


def money(value: float | Decimal | str) -> Decimal:
    return Decimal(str(value)).quantize(CENTS)


def attempt_rate(attempt: JobAttempt) -> Decimal | None:
    """What the attempt's machine costs per hour: as billed, else as quoted by its offer."""
    if attempt.billed_rate_per_hour is not None:
        return attempt.billed_rate_per_hour
    quoted = (attempt.offer or {}).get("price_per_hour")
    return money(quoted) if quoted is not None else None


def project_spend_per_hour(*, project_id: int, exclude_attempt: int | None = None) -> Decimal:
    """USD per hour of the project's live rented machines (launched or being launched)."""
    live = JobAttempt.objects.filter(job__project_id=project_id, ended_at__isnull=True)
    if exclude_attempt is not None:
        live = live.exclude(pk=exclude_attempt)
    rates = (attempt_rate(a) for a in live.only("billed_rate_per_hour", "offer"))
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
    attempt: JobAttempt, *, until: datetime, since: datetime | None = None
) -> Decimal | None:
    """What the attempt's machine costs from its launch (or ``since``, if later) to ``until``:
    its rate x the time. None when it never launched or has no rate. The one rule for a cost
    settled at the end and for a live machine's cost so far (the admin's job page, dashboard)."""
    rate = attempt_rate(attempt)
    if attempt.launched_at is None or rate is None:
        return None
    start = max(attempt.launched_at, since) if since is not None else attempt.launched_at
    hours = Decimal((until - start).total_seconds()) / 3600
    return money(rate * max(hours, Decimal(0)))


def attempt_settle_cost(*, attempt_pk: int) -> None:
    """The attempt ended: its cost from launch to end, and the job's sums."""
    attempt = JobAttempt.objects.get(pk=attempt_pk)
    cost = rented_cost(attempt, until=attempt.ended_at) if attempt.ended_at else None
    if cost is not None:
        JobAttempt.objects.filter(pk=attempt.pk).update(cost=cost)
    job_costs_refresh(job_pk=attempt.job_id)


def job_costs_refresh(*, job_pk: int) -> None:
    sums = JobAttempt.objects.filter(job_id=job_pk).aggregate(
        estimated=Sum("estimated_cost"), cost=Sum("cost")
    )
    TrainingJob.objects.filter(pk=job_pk).update(
        estimated_cost=sums["estimated"], cost=sums["cost"]
    )
