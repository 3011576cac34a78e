"""jobs.services.core.costs on the real database: the rate an attempt is billed at, its cost when
it ends, the sums on its job, and a project's spend per hour against its ceiling. Rows come
from tests/support/factories.py (the launch and poll paths that write them: test_services_launch,
test_services_placement)."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from jobs.models import JobAttempt, TrainingJob
from jobs.services.core import costs
from jobs.states import JobStatus
from tests.support.factories import (
    JobAttemptFactory,
    ProjectFactory,
    TrainingJobFactory,
    offer_dict,
)

pytestmark = pytest.mark.django_db
S = JobStatus


def rented(project=None, **fields) -> JobAttempt:
    """A live attempt on a rented machine of ``project`` (a new one if None)."""
    job = TrainingJobFactory(
        project=project or ProjectFactory(), target="fake-cloud", status=S.RUNNING
    )
    return JobAttemptFactory(job=job, **fields)


# --- money and rates --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [(0.1 + 0.2, "0.3000"), ("1.23456", "1.2346"), (2, "2.0000"), (Decimal("0.35"), "0.3500")],
)
def test_money_is_a_decimal_to_a_hundredth_of_a_cent(value, expected) -> None:
    assert costs.money(value) == Decimal(expected)
    assert str(costs.money(value)) == expected


def test_the_billed_rate_wins_over_the_quoted_one() -> None:
    quoted = JobAttemptFactory.build(offer=offer_dict(price_per_hour=0.35))
    assert costs.attempt_rate(quoted) == Decimal("0.3500")
    quoted.billed_rate_per_hour = Decimal("0.4100")
    assert costs.attempt_rate(quoted) == Decimal("0.4100")


def test_a_spot_attempt_is_quoted_at_the_spot_price_and_knows_its_on_demand_rate() -> None:
    offer = offer_dict(price_per_hour=1.0, spot_price_per_hour=0.3)
    spot = JobAttemptFactory.build(
        offer=offer, capacity="spot", on_demand_rate_per_hour=Decimal("1.0000")
    )
    assert costs.attempt_rate(spot) == Decimal("0.3000")
    assert costs.on_demand_rate(spot) == Decimal("1.0000")
    on_demand = JobAttemptFactory.build(offer=offer, capacity="on_demand")
    assert costs.attempt_rate(on_demand) == costs.on_demand_rate(on_demand) == Decimal("1.0000")


def test_an_attempt_without_an_offer_or_a_bill_has_no_rate() -> None:
    assert costs.attempt_rate(JobAttemptFactory.build(offer={})) is None
    assert costs.attempt_rate(JobAttemptFactory.build(offer={"offer_id": "x"})) is None


def test_a_reported_rate_is_stored_only_when_new_or_changed() -> None:
    attempt = rented(offer=offer_dict(price_per_hour=0.35))
    assert costs.attempt_record_rate(attempt=attempt, rate=0.41) is True
    assert JobAttempt.objects.get(pk=attempt.pk).billed_rate_per_hour == Decimal("0.4100")
    assert costs.attempt_record_rate(attempt=attempt, rate=0.41) is False
    assert costs.attempt_record_rate(attempt=attempt, rate=0.4) is True
    assert JobAttempt.objects.get(pk=attempt.pk).billed_rate_per_hour == Decimal("0.4000")


# --- the project's spend and its ceiling ------------------------------------------------------


def test_spend_per_hour_sums_the_projects_live_rented_machines() -> None:
    project = ProjectFactory()
    quoted = rented(project, offer=offer_dict(price_per_hour=0.5))
    rented(project, offer=offer_dict(price_per_hour=0.5), billed_rate_per_hour=Decimal("0.75"))
    # Not counted: an ended attempt, an attempt without a rate, another project's machine.
    rented(project, offer=offer_dict(price_per_hour=9), ended_at=timezone.now())
    rented(project, offer={})
    rented(offer=offer_dict(price_per_hour=7))

    assert costs.project_spend_per_hour(project_id=project.pk) == Decimal("1.2500")
    spend = costs.project_spend_per_hour(project_id=project.pk, exclude_attempt=quoted.pk)
    assert spend == Decimal("0.7500")


def test_a_project_without_machines_spends_nothing() -> None:
    assert costs.project_spend_per_hour(project_id=ProjectFactory().pk) == Decimal(0)


@pytest.mark.parametrize(
    ("ceiling", "spend", "price"),
    [(None, "100", 5.0), ("1.00", "0.60", 0.40), ("1.00", "0", 0.99)],
)
def test_renting_within_the_ceiling_is_allowed(ceiling, spend, price) -> None:
    limit = Decimal(ceiling) if ceiling is not None else None
    assert costs.over_ceiling(ceiling=limit, spend=Decimal(spend), price=price) == ""


def test_renting_over_the_ceiling_says_the_spend_and_the_ceiling() -> None:
    why = costs.over_ceiling(ceiling=Decimal("1.00"), spend=Decimal("0.60"), price=0.41)
    assert why == "the project spends $0.60/h; this would exceed its ceiling of $1.00/h"


# --- an ended attempt's cost and the job's sums -----------------------------------------------


def test_an_ended_attempt_costs_its_rate_times_the_time_from_launch_to_end() -> None:
    end = timezone.now()
    attempt = rented(
        offer=offer_dict(price_per_hour=2.0),
        billed_rate_per_hour=Decimal("2.4000"),
        launched_at=end - timedelta(minutes=90),
        ended_at=end,
        estimated_cost=Decimal("4.0000"),
    )
    costs.attempt_settle_cost(attempt_pk=attempt.pk)

    attempt.refresh_from_db()
    assert attempt.cost == Decimal("3.6000")  # the billed $2.40/h, not the quoted $2, for 1.5 h
    job = TrainingJob.objects.get(pk=attempt.job_id)
    assert (job.cost, job.estimated_cost) == (Decimal("3.6000"), Decimal("4.0000"))


def test_a_spot_attempt_also_settles_what_it_would_have_cost_on_demand() -> None:
    end = timezone.now()
    attempt = rented(
        offer=offer_dict(price_per_hour=2.0, spot_price_per_hour=0.6),
        capacity="spot",
        on_demand_rate_per_hour=Decimal("2.0000"),
        launched_at=end - timedelta(minutes=90),
        ended_at=end,
    )
    costs.attempt_settle_cost(attempt_pk=attempt.pk)

    attempt.refresh_from_db()
    assert (attempt.cost, attempt.on_demand_cost) == (Decimal("0.9000"), Decimal("3.0000"))
    job = TrainingJob.objects.get(pk=attempt.job_id)
    assert (job.cost, job.on_demand_cost) == (Decimal("0.9000"), Decimal("3.0000"))


def test_an_attempt_never_launched_costs_nothing_but_the_job_sums_are_refreshed() -> None:
    job = TrainingJobFactory(target="fake-cloud", status=S.RUNNING)
    JobAttemptFactory(job=job, cost=Decimal("1.0000"), ended_at=timezone.now())
    never = JobAttemptFactory(job=job, offer=offer_dict(price_per_hour=3), ended_at=timezone.now())

    costs.attempt_settle_cost(attempt_pk=never.pk)

    assert JobAttempt.objects.get(pk=never.pk).cost is None
    assert TrainingJob.objects.get(pk=job.pk).cost == Decimal("1.0000")


def test_job_sums_add_up_every_attempt() -> None:
    job = TrainingJobFactory(target="fake-cloud", status=S.RUNNING)
    ended = {"ended_at": timezone.now()}
    JobAttemptFactory(job=job, estimated_cost=Decimal("4"), cost=Decimal("0.25"),
                      on_demand_cost=Decimal("1"), **ended)  # fmt: skip
    JobAttemptFactory(job=job, estimated_cost=Decimal("3"), cost=Decimal("1.5"),
                      on_demand_cost=Decimal("1.5"), **ended)  # fmt: skip
    JobAttemptFactory(job=job, estimated_cost=Decimal("2"))  # live: no cost yet

    costs.job_costs_refresh(job_pk=job.pk)

    job.refresh_from_db()
    assert (job.estimated_cost, job.cost) == (Decimal("9.0000"), Decimal("1.7500"))
    assert job.on_demand_cost == Decimal("2.5000")


def test_a_job_without_priced_attempts_has_no_sums() -> None:
    job = TrainingJobFactory(estimated_cost=Decimal("1"), cost=Decimal("1"))
    JobAttemptFactory(job=job)
    costs.job_costs_refresh(job_pk=job.pk)
    job.refresh_from_db()
    assert (job.estimated_cost, job.cost) == (None, None)
