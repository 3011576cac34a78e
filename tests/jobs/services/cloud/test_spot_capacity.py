"""Spot capacity and preemption: a job's ``capacity`` (on_demand, spot, any) decides how offers
are priced and rented, a preempted spot attempt requeues the job without using up
``max_attempts`` (up to ``max_preemptions``) and the next attempt resumes from the newest
checkpoint, and the job's cost sums its attempts beside what they would have cost on demand.
Two scripted clouds with priced offers (tests.support.fakes.adapter), the real database and Redis."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.utils import timezone

from jobs import storage, tasks
from jobs.errors import InvalidRequest
from jobs.models import GpuNode, JobAttempt, TrainingJob
from jobs.services.core import costs, specs
from jobs.services.core.attempts import attempt_end
from jobs.services.core.jobs import job_retry
from jobs.services.fleet import nodes
from jobs.states import EndReason, JobCapacity, JobStatus
from providers import registry
from providers.base import CapacityType, Offer
from tests.support.api import assert_error
from tests.support.cloud import poll_due
from tests.support.fakes.adapter import FakeAdapter, register_fake
from trainhub.shared_redis import redis_client

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fresh_provider_state")]
S = JobStatus
CHEAP = "cheap-cloud"


def live_attempt(job: TrainingJob) -> JobAttempt:
    return JobAttempt.objects.get(job=job, ended_at__isnull=True)


def place(job: TrainingJob) -> JobAttempt:
    tasks.place_job(job.pk)
    return live_attempt(job)


def reloaded(job: TrainingJob) -> TrainingJob:
    return TrainingJob.objects.get(pk=job.pk)


def forget_offers() -> None:
    """Drop the cached offers, so placement asks the clouds again."""
    for key in redis_client().scan_iter("trainhub:offers:*"):
        redis_client().delete(key)


def preempt(cloud: FakeAdapter, attempt: JobAttempt, target: str = CHEAP) -> JobAttempt:
    """The provider takes the attempt's spot machine back; a poll sees it."""
    cloud.preempt(attempt.provider_instance_id)
    poll_due(target)
    return JobAttempt.objects.get(pk=attempt.pk)


# --- pricing by capacity (pure) ---------------------------------------------------------------


def _offer(price: float, spot: float | None) -> Offer:
    return Offer("c", "o", "RTX 4090", 1, 24, price, spot_price_per_hour=spot)


@pytest.mark.parametrize(
    ("capacity", "price", "spot", "terms"),
    [
        ("on_demand", 1.0, 0.3, (CapacityType.ON_DEMAND, 1.0)),
        ("spot", 1.0, 0.3, (CapacityType.SPOT, 0.3)),
        ("spot", 1.0, None, None),
        ("any", 1.0, 0.3, (CapacityType.SPOT, 0.3)),
        ("any", 1.0, None, (CapacityType.ON_DEMAND, 1.0)),
        ("any", 0.5, 0.6, (CapacityType.ON_DEMAND, 0.5)),  # a spot price above on-demand: not taken
    ],
)
def test_rental_terms_price_an_offer_by_the_jobs_capacity(capacity, price, spot, terms) -> None:
    assert costs.rental_terms(_offer(price, spot), capacity) == terms


# --- create: validation -----------------------------------------------------------------------


def test_capacity_defaults_to_on_demand_with_a_preemption_allowance(make_job) -> None:
    job = make_job()
    assert (job.capacity, job.max_preemptions, job.preemptions) == ("on_demand", 5, 0)
    assert make_job(capacity="any", max_preemptions=0).max_preemptions == 0


@pytest.mark.parametrize(
    ("value", "code"),
    [("cheap", "invalid_value"), ("SPOT", "invalid_value"), (1, "invalid_type"), ("", None)],
)
def test_an_unknown_capacity_is_refused_naming_it(make_job, value, code) -> None:
    with pytest.raises(InvalidRequest) as caught:
        make_job(capacity=value)
    assert caught.value.param == "capacity"
    assert "on_demand, spot, any" in caught.value.message
    if code:
        assert caught.value.code == code


def test_max_preemptions_is_bounded(make_job) -> None:
    with pytest.raises(InvalidRequest) as caught:
        make_job(max_preemptions=101)
    assert caught.value.param == "max_preemptions"


def test_spot_on_a_target_without_a_price_list_is_refused(make_job, fake_cloud) -> None:
    with pytest.raises(InvalidRequest) as caught:
        make_job(target="fake-cloud", capacity="spot")
    assert caught.value.param == "capacity" and "no price list" in caught.value.message
    # any: rents on demand there; the own fleet ignores capacity
    assert make_job(target="fake-cloud", capacity="any").capacity == "any"
    assert make_job(target="local", capacity="spot").capacity == "spot"


def test_the_api_refuses_a_bad_capacity_with_a_400_naming_it(api, make_file) -> None:
    body = {"model": "acme/tiny-llama", "training_file": make_file().public_id, "capacity": "x"}
    for path in ("/api/v1/jobs/", "/v1/fine_tuning/jobs"):
        assert_error(api.post(path, body, format="json"), 400, param="capacity")


# --- placement --------------------------------------------------------------------------------


def test_on_demand_ignores_spot_prices(clouds, make_job) -> None:
    clouds[CHEAP].add_offer("od", 0.50, spot=0.10)
    clouds["dear-cloud"].add_offer("od2", 0.40)
    attempt = place(make_job(target="auto"))

    assert attempt.offer["offer_id"] == "od2" and attempt.capacity == CapacityType.ON_DEMAND
    (request,) = clouds["dear-cloud"].launches
    assert request.capacity == CapacityType.ON_DEMAND
    assert attempt.on_demand_rate_per_hour == Decimal("0.4000")


def test_spot_takes_only_offers_with_a_spot_price_priced_at_it(clouds, make_job) -> None:
    clouds[CHEAP].add_offer("no-spot", 0.20)
    clouds["dear-cloud"].add_offer("spotty", 0.90, spot=0.35)
    job = make_job(target="auto", capacity="spot")
    attempt = place(job)

    assert attempt.target == "dear-cloud" and attempt.offer["offer_id"] == "spotty"
    assert attempt.capacity == CapacityType.SPOT
    assert attempt.on_demand_rate_per_hour == Decimal("0.9000")
    (request,) = clouds["dear-cloud"].launches
    assert request.capacity == CapacityType.SPOT and request.offer is not None
    assert request.offer.offer_id == "spotty"
    assert clouds[CHEAP].launches == []
    # quoted and estimated at the spot price
    assert costs.attempt_rate(attempt) == Decimal("0.3500")
    assert attempt.estimated_cost == costs.money(
        Decimal("0.3500") * Decimal(job.max_runtime_seconds) / 3600
    )
    placement = job.events.get(message__startswith="Placement:")
    assert "$0.35/h spot" in placement.message and "not offered as spot" in placement.message
    assert placement.data["capacity"] == "spot"


def test_any_takes_the_cheapest_of_either_kind(clouds, make_job) -> None:
    clouds[CHEAP].add_offer("od-cheap", 0.30)  # no spot
    clouds["dear-cloud"].add_offer("spot-cheaper", 0.80, spot=0.25)
    attempt = place(make_job(target="auto", capacity="any"))
    assert attempt.offer["offer_id"] == "spot-cheaper" and attempt.capacity == CapacityType.SPOT

    clouds["dear-cloud"].offer_list.clear()
    clouds["dear-cloud"].add_offer("spot-dearer", 0.80, spot=0.31)
    forget_offers()
    other = place(make_job(target="auto", capacity="any"))
    assert other.offer["offer_id"] == "od-cheap" and other.capacity == CapacityType.ON_DEMAND
    assert clouds[CHEAP].launches[-1].capacity == CapacityType.ON_DEMAND


def test_the_price_cap_is_compared_with_the_price_paid(clouds, make_job) -> None:
    clouds[CHEAP].add_offer("c1", 2.00, spot=0.60)
    # on demand: $2/h is over the cap; spot: $0.60/h is within it
    on_demand = make_job(target=CHEAP, max_price_per_hour="1.00")
    tasks.place_job(on_demand.pk)
    assert not JobAttempt.objects.filter(job=on_demand).exists()
    assert "max_price_per_hour of $1.00/h" in reloaded(on_demand).waiting_reason

    spot = place(make_job(target=CHEAP, max_price_per_hour="1.00", capacity="spot"))
    assert spot.capacity == CapacityType.SPOT and spot.offer["offer_id"] == "c1"

    capped = make_job(target=CHEAP, max_price_per_hour="0.50", capacity="spot")
    tasks.place_job(capped.pk)
    assert "at its spot price" in reloaded(capped).waiting_reason


def test_the_waiting_reason_says_no_spot_offer_fits(clouds, make_job, api) -> None:
    clouds[CHEAP].add_offer("c1", 0.20)
    clouds[CHEAP].add_offer("c2", 0.30)
    job = make_job(target=CHEAP, capacity="spot")
    tasks.place_job(job.pk)

    job = reloaded(job)
    assert job.status == S.QUEUED and not job.attempts.exists()
    assert job.waiting_reason.startswith("No spot offer can take this job now")
    assert "2 offer(s) not offered as spot" in job.waiting_reason
    shown = api.get(f"/v1/fine_tuning/jobs/{job.public_id}").json()["waiting_reason"]
    assert shown == job.waiting_reason  # told to the project as written (no node names in it)


def test_the_own_fleet_ignores_capacity(make_job, dispatch_now) -> None:
    node, _ = nodes.node_create(name="gpu-a", actor="ops")
    gpus = [{"name": "NVIDIA H100 80GB HBM3", "vram_mb": 81559}]
    report = {"capabilities": {"gpus": gpus, "gpu_count": 1}, "labels": {}}
    nodes.node_register(node=node, report={**report, "celery_hostname": "n@gpu-a"})
    assert GpuNode.objects.get(pk=node.pk).status == GpuNode.Status.IDLE
    job = make_job(target="local", capacity="spot")
    dispatch_now()
    attempt = live_attempt(job)
    assert attempt.node_name == "gpu-a" and attempt.capacity == ""


# --- preemption -------------------------------------------------------------------------------


def test_a_preempted_attempt_requeues_without_using_max_attempts(clouds, make_job) -> None:
    clouds[CHEAP].add_offer("c1", 1.00, spot=0.30)
    job = make_job(target=CHEAP, capacity="spot", max_attempts=1, max_preemptions=2)
    first = preempt(clouds[CHEAP], place(job))

    assert first.end_reason == EndReason.PREEMPTED
    job = reloaded(job)
    assert job.status == S.QUEUED and job.preemptions == 1
    requeued = job.events.filter(message__startswith="Requeued after attempt 1").get()
    assert "preemption 1 of 2 not counted; 1 attempt(s) left" in requeued.message
    # the preempted machine is no reason to avoid its offer
    second = preempt(clouds[CHEAP], place(job))
    assert second.number == 2 and second.offer["offer_id"] == "c1"
    assert reloaded(job).status == S.QUEUED and reloaded(job).preemptions == 2

    # beyond max_preemptions a preemption counts: the one attempt of max_attempts is used
    third = preempt(clouds[CHEAP], place(job))
    job = reloaded(job)
    assert third.number == 3 and job.preemptions == 2
    assert job.status == S.FAILED and job.error_code == "preempted"
    assert "after 1 attempt(s)" in job.error_message

    # a manual retry gives a fresh allowance
    job_retry(job=job)
    job = reloaded(job)
    assert (job.status, job.preemptions) == (S.QUEUED, 0)
    preempt(clouds[CHEAP], place(job))
    assert reloaded(job).status == S.QUEUED


def test_other_losses_still_count_after_free_preemptions(clouds, make_job) -> None:
    for offer_id in ("c1", "c2", "c3"):  # a lost machine's offer is avoided afterwards
        clouds[CHEAP].add_offer(offer_id, 1.00, spot=0.30)
    job = make_job(target=CHEAP, capacity="spot", max_attempts=2)
    preempt(clouds[CHEAP], place(job))
    attempt_end(attempt=place(job), reason=EndReason.WORKER_LOST)
    job = reloaded(job)
    assert job.status == S.QUEUED  # attempt 2 is the first counted
    attempt_end(attempt=place(job), reason=EndReason.WORKER_LOST)
    job = reloaded(job)
    assert job.status == S.FAILED and job.error_code == "worker_lost"


def test_max_preemptions_zero_counts_every_preemption(clouds, make_job) -> None:
    clouds[CHEAP].add_offer("c1", 1.00, spot=0.30)
    job = make_job(target=CHEAP, capacity="spot", max_attempts=1, max_preemptions=0)
    preempt(clouds[CHEAP], place(job))
    job = reloaded(job)
    assert job.status == S.FAILED and job.error_code == "preempted" and job.preemptions == 0


def test_the_next_attempt_resumes_from_the_preempted_attempts_checkpoint(clouds, make_job) -> None:
    clouds[CHEAP].add_offer("c1", 1.00, spot=0.30)
    job = make_job(target=CHEAP, capacity="spot")
    first = place(job)
    key = storage.checkpoint_key(job.project_id, job.public_id, first.number)
    storage.save_stream(key, [b"step-40 weights"])
    preempt(clouds[CHEAP], first)

    second = place(job)
    url = specs.attempt_spec(second)["outputs"]["resume_url"]
    sealed = storage.sealed_key(key)
    assert url is not None and storage.exists(sealed)
    assert b"".join(storage.read_chunks(sealed)) == b"step-40 weights"


# --- cost -------------------------------------------------------------------------------------


def _ran_for(attempt: JobAttempt, hours: float) -> None:
    launched = timezone.now() - timedelta(hours=hours)
    JobAttempt.objects.filter(pk=attempt.pk).update(launched_at=launched)


def test_job_cost_sums_attempts_and_shows_the_on_demand_equivalent(clouds, make_job, api) -> None:
    clouds[CHEAP].add_offer("c1", 1.00, spot=0.25)
    clouds["dear-cloud"].add_offer("d1", 2.00)  # on demand only
    job = make_job(target="auto", capacity="any")
    first = place(job)
    _ran_for(first, 2)
    first = preempt(clouds[CHEAP], first)
    assert first.capacity == CapacityType.SPOT
    assert first.cost == pytest.approx(Decimal("0.50"), abs=Decimal("0.001"))
    assert first.on_demand_cost == pytest.approx(Decimal("2.00"), abs=Decimal("0.001"))
    saving = job.events.get(message__startswith="Attempt 1 ran on spot")
    assert "on demand it would have cost $2.00 (saved $1.50)" in saving.message

    clouds[CHEAP].offer_list.clear()  # no spot left: the second attempt rents on demand
    forget_offers()
    second = place(job)
    assert second.capacity == CapacityType.ON_DEMAND and second.target == "dear-cloud"
    _ran_for(second, 1)
    attempt_end(attempt=second, reason=EndReason.WORKER_LOST)
    second.refresh_from_db()
    assert second.cost == second.on_demand_cost
    assert second.cost == pytest.approx(Decimal("2.00"), abs=Decimal("0.001"))

    job = reloaded(job)
    assert job.cost == first.cost + second.cost
    assert job.on_demand_cost == first.on_demand_cost + second.on_demand_cost
    for path in (f"/api/v1/jobs/{job.public_id}/", f"/v1/fine_tuning/jobs/{job.public_id}"):
        shown: dict[str, Any] = api.get(path).json()
        assert shown["capacity"] == "any" and shown["preemptions"] == 1
        assert shown["max_preemptions"] == 5
        assert shown["cost"] == pytest.approx(2.5, abs=0.01)
        assert shown["on_demand_cost"] == pytest.approx(4.0, abs=0.01)


def test_the_api_creates_a_spot_job_and_shows_it(api, make_file, settings) -> None:
    settings.TRAINHUB_PUBLIC_URL = "http://127.0.0.1:8000"
    register_fake("priced-cloud", has_offers=True)
    try:
        body = {
            "model": "acme/tiny-llama",
            "training_file": make_file().public_id,
            "target": "priced-cloud",
            "capacity": "spot",
            "max_preemptions": 3,
        }
        response = api.post("/v1/fine_tuning/jobs", body, format="json")
    finally:
        registry.unregister("priced-cloud")
    assert response.status_code == 201, response.content
    job = response.json()
    assert (job["capacity"], job["max_preemptions"], job["preemptions"]) == ("spot", 3, 0)
    assert (job["cost"], job["on_demand_cost"]) == (None, None)
    assert TrainingJob.objects.get(public_id=job["id"]).capacity == JobCapacity.SPOT
