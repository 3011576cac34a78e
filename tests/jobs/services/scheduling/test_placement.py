"""Placement of cloud and ``auto`` jobs through the services and tasks, on the real database
and Redis, with two scripted clouds that list priced offers: the own node first, the cheapest
offer that fits, price caps, the project's spend ceiling, the next offer on no capacity, the
billed rate checked after launch, and what each attempt costs."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from jobs import tasks
from jobs.errors import InvalidRequest
from jobs.models import GpuNode, JobAttempt, JobEvent, TrainingJob
from jobs.services.fleet import nodes
from jobs.services.scheduling import placement
from jobs.states import EndReason, JobStatus
from providers import registry
from providers.base import RemoteStatus
from providers.errors import TransientProviderError
from tests.support.fakes.adapter import register_fake
from trainhub.shared_redis import redis_client
from trainhub_contract import celery_conf as cc

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fresh_provider_state")]
S = JobStatus


def idle_node(name: str = "gpu-a", vram_mb: int = 81559) -> GpuNode:
    node, _ = nodes.node_create(name=name, actor="ops")
    gpus = [{"name": "NVIDIA H100 80GB HBM3", "vram_mb": vram_mb}]
    report = {"capabilities": {"gpus": gpus, "gpu_count": 1}, "labels": {}}
    nodes.node_register(node=node, report={**report, "celery_hostname": f"n@{name}"})
    return GpuNode.objects.get(pk=node.pk)


def live_attempt(job: TrainingJob) -> JobAttempt:
    return JobAttempt.objects.get(job=job, ended_at__isnull=True)


def messages(job: TrainingJob) -> list[str]:
    return list(job.events.order_by("number").values_list("message", flat=True))


# --- where a job goes -------------------------------------------------------------------------


def test_auto_takes_an_idle_own_node_that_fits_before_any_cloud(clouds, make_job) -> None:
    clouds["cheap-cloud"].add_offer("c1", 0.10)
    node = idle_node()
    job = make_job(target="auto", gpu={"count": 1, "min_vram_gb": 40})
    tasks.place_job(job.pk)

    attempt = live_attempt(job)
    assert (attempt.target, attempt.node_name) == ("local", node.name)
    assert clouds["cheap-cloud"].launches == [] and clouds["cheap-cloud"].offer_queries == []
    assert GpuNode.objects.get(pk=node.pk).status == GpuNode.Status.BUSY


def test_auto_skips_an_own_node_that_does_not_fit_and_rents_the_cheapest_offer(
    clouds, make_job
) -> None:
    idle_node(vram_mb=16384)  # 16 GB: too small
    clouds["dear-cloud"].add_offer("d1", 0.90)
    clouds["cheap-cloud"].add_offer("c-big", 0.50)
    clouds["cheap-cloud"].add_offer("c-small", 0.20, vram_gb=16)
    job = make_job(target="auto", gpu={"count": 1, "min_vram_gb": 24})
    tasks.place_job(job.pk)

    attempt = live_attempt(job)
    assert attempt.target == "cheap-cloud" and attempt.offer["offer_id"] == "c-big"
    (request,) = clouds["cheap-cloud"].launches
    assert request.offer is not None and request.offer.offer_id == "c-big"
    assert clouds["dear-cloud"].launches == []
    assert clouds["cheap-cloud"].offer_queries == [{"count": 1, "min_vram_gb": 24}]
    placement_event = next(m for m in messages(job) if m.startswith("Placement:"))
    assert "cheap-cloud c-big" in placement_event
    assert "c-small" in placement_event and "16 GB per GPU, the job needs 24 GB" in placement_event
    assert attempt.estimated_cost == Decimal("0.5000") * job.max_runtime_seconds / 3600


def test_an_explicit_priced_target_only_rents_its_own_offers(clouds, make_job) -> None:
    clouds["cheap-cloud"].add_offer("c1", 0.10)
    clouds["dear-cloud"].add_offer("d1", 0.90)
    job = make_job(target="dear-cloud")
    tasks.place_job(job.pk)
    assert live_attempt(job).offer["offer_id"] == "d1"
    assert clouds["cheap-cloud"].offer_queries == []


def test_offers_over_the_jobs_cap_are_skipped_and_the_job_waits_saying_why(
    clouds, make_job
) -> None:
    clouds["cheap-cloud"].add_offer("c1", 1.20)
    clouds["dear-cloud"].add_offer("d1", 2.40)
    job = make_job(target="auto", max_price_per_hour=1.0)
    tasks.place_job(job.pk)

    job.refresh_from_db()
    assert job.status == S.QUEUED and not job.attempts.exists()
    assert "2 offer(s) over the job's max_price_per_hour of $1.00/h" in job.waiting_reason
    assert clouds["cheap-cloud"].launches == []

    # The beat places it once an offer under the cap appears (and the cache has expired).
    clouds["dear-cloud"].add_offer("d2", 0.95)
    redis_client().delete(*redis_client().keys("trainhub:offers:dear-cloud:*"))
    assert placement.jobs_place_waiting() == 1
    assert live_attempt(job).offer["offer_id"] == "d2"


def test_a_waiting_reason_is_recorded_once_while_nothing_changes(clouds, make_job) -> None:
    clouds["cheap-cloud"].add_offer("c1", 5.0)
    job = make_job(target="cheap-cloud", max_price_per_hour=1)
    for _ in range(3):
        tasks.place_job(job.pk)
    waits = [m for m in messages(job) if m.startswith("No offer can take this job now")]
    assert len(waits) == 1


def test_no_capacity_on_one_offer_tries_the_next_within_the_same_attempt(clouds, make_job) -> None:
    clouds["cheap-cloud"].add_offer("c1", 0.10)
    clouds["dear-cloud"].add_offer("d1", 0.30)
    clouds["cheap-cloud"].full.add("c1")
    job = make_job(target="auto")
    tasks.place_job(job.pk)

    attempt = live_attempt(job)
    assert attempt.number == 1 and attempt.target == "dear-cloud"
    assert attempt.offer["offer_id"] == "d1" and attempt.provider_instance_id
    assert [r.offer.offer_id for r in clouds["cheap-cloud"].launches] == ["c1"]
    # The refusal is remembered: the next placement does not ask c1 again.
    plan = placement.job_plan(TrainingJob.objects.get(pk=job.pk))
    assert [str(why) for o, why in plan.skipped if o.offer_id == "c1"] == [
        "refused lately (no capacity: offer c1 has no machine free)"
    ]


def test_when_every_offer_refuses_the_attempt_ends_no_capacity_naming_them(
    clouds, make_job
) -> None:
    clouds["cheap-cloud"].add_offer("c1", 0.10)
    clouds["cheap-cloud"].full.add("c1")
    job = make_job(target="cheap-cloud", max_attempts=1)
    tasks.place_job(job.pk)

    job.refresh_from_db()
    attempt = job.attempts.get()
    assert attempt.end_reason == EndReason.NO_CAPACITY and job.status == S.FAILED
    assert "cheap-cloud c1" in job.error_message and "no machine free" in job.error_message


def test_a_machine_that_failed_an_attempt_is_not_rented_again_for_the_job(clouds, make_job) -> None:
    cloud = clouds["cheap-cloud"]
    cloud.add_offer("ask-1", 0.10, machine_id="host-7")
    cloud.add_offer("ask-2", 0.12, machine_id="host-7")
    cloud.add_offer("ask-3", 0.40, machine_id="host-9")
    job = make_job(target="cheap-cloud", max_attempts=3)
    tasks.place_job(job.pk)
    first = live_attempt(job)
    cloud.set_state(first.provider_instance_id, RemoteStatus.LOST, "the host went offline")
    JobAttempt.objects.update(next_poll_at=None)
    tasks.poll_target("cheap-cloud")  # lost → requeued
    tasks.place_job(job.pk)  # what the requeue sent

    second = live_attempt(job)
    assert second.number == 2 and second.offer["offer_id"] == "ask-3"
    plan = placement.job_plan(TrainingJob.objects.get(pk=job.pk))
    assert {o.offer_id: str(why) for o, why in plan.skipped}["ask-2"] == (
        "its machine failed attempt 1 of this job"
    )


def test_the_projects_spend_ceiling_counts_its_live_machines(clouds, make_job, project) -> None:
    project.max_spend_per_hour = Decimal("1.00")
    project.save()
    clouds["cheap-cloud"].add_offer("c1", 0.60)
    first = make_job(target="cheap-cloud")
    tasks.place_job(first.pk)
    assert live_attempt(first).offer["offer_id"] == "c1"

    second = make_job(target="cheap-cloud")
    tasks.place_job(second.pk)
    second.refresh_from_db()
    assert second.status == S.QUEUED and not second.attempts.exists()
    assert "would exceed its ceiling of $1.00/h" in second.waiting_reason


def test_a_provider_that_cannot_list_offers_is_reported_and_the_others_still_place(
    clouds, make_job, monkeypatch
) -> None:
    def broken(gpu):
        raise TransientProviderError("dear-cloud GET /offers returned HTTP 503")

    monkeypatch.setattr(clouds["dear-cloud"], "offers", broken)
    clouds["cheap-cloud"].add_offer("c1", 0.50)
    job = make_job(target="auto")
    tasks.place_job(job.pk)
    assert live_attempt(job).target == "cheap-cloud"
    event = next(e for e in job.events.all() if e.message.startswith("Placement:"))
    assert event.data["unusable"] == [
        "dear-cloud could not list offers: dear-cloud GET /offers returned HTTP 503"
    ]


# --- the billed rate and cost -----------------------------------------------------------------


def test_a_billed_rate_over_the_cap_terminates_the_machine_and_tries_elsewhere(
    clouds, make_job
) -> None:
    cloud = clouds["cheap-cloud"]
    cloud.add_offer("c1", 0.80)
    cloud.add_offer("c2", 0.90)
    job = make_job(target="cheap-cloud", max_price_per_hour=1.0, max_attempts=2)
    tasks.place_job(job.pk)
    first = live_attempt(job)
    cloud.set_state(first.provider_instance_id, RemoteStatus.RUNNING, "up", price_per_hour=1.35)
    JobAttempt.objects.update(next_poll_at=None)
    tasks.poll_target("cheap-cloud")

    first.refresh_from_db()
    assert first.end_reason == EndReason.PRICE_CAP_EXCEEDED
    assert first.billed_rate_per_hour == Decimal("1.3500")
    assert any("bills $1.3500/h, above the job's max_price_per_hour" in m for m in messages(job))
    tasks.stop_machines(job.pk)  # what the attempt's end sent, and then its requeue
    tasks.place_job(job.pk)
    assert first.provider_instance_id in cloud.cancelled_ids
    second = live_attempt(job)
    assert second.offer["offer_id"] == "c2", "the offer that overbilled is not taken again"


def test_a_rate_under_the_cap_is_recorded_and_cost_is_rate_times_time_rented(
    clouds, make_job, sent
) -> None:
    cloud = clouds["cheap-cloud"]
    cloud.add_offer("c1", 2.0)
    job = make_job(target="cheap-cloud", max_price_per_hour=3, max_runtime_seconds=7200)
    tasks.place_job(job.pk)
    attempt = live_attempt(job)
    assert attempt.estimated_cost == Decimal("4.0000")  # $2/h quoted x 2 h max runtime
    cloud.set_state(attempt.provider_instance_id, RemoteStatus.RUNNING, "up", price_per_hour=2.4)
    JobAttempt.objects.update(next_poll_at=None)
    tasks.poll_target("cheap-cloud")
    attempt.refresh_from_db()
    assert attempt.billed_rate_per_hour == Decimal("2.4000") and attempt.ended_at is None

    # Ninety minutes after launch the machine is lost; the attempt is billed for them.
    JobAttempt.objects.filter(pk=attempt.pk).update(
        launched_at=timezone.now() - timedelta(minutes=90)
    )
    cloud.set_state(attempt.provider_instance_id, RemoteStatus.FAILED, "oom", error_code="oom")
    JobAttempt.objects.update(next_poll_at=None)
    tasks.poll_target("cheap-cloud")
    attempt.refresh_from_db()
    job.refresh_from_db()
    assert attempt.cost is not None and abs(attempt.cost - Decimal("3.6")) < Decimal("0.01")
    assert job.cost == attempt.cost and job.estimated_cost == Decimal("4.0000")


# --- submission -------------------------------------------------------------------------------


def test_auto_with_nowhere_to_go_is_refused_at_submit(make_job) -> None:
    with pytest.raises(InvalidRequest) as info:
        make_job(target="auto")
    assert info.value.code == "target_unavailable"
    assert "no GPU node is registered" in str(info.value)


def test_a_price_cap_on_a_target_without_prices_is_refused_at_submit(
    make_job, settings, sent
) -> None:
    settings.TRAINHUB_PUBLIC_URL = "http://127.0.0.1:8000"
    register_fake("unpriced-cloud")
    try:
        with pytest.raises(InvalidRequest) as info:
            make_job(target="unpriced-cloud", max_price_per_hour=2)
        assert info.value.param == "max_price_per_hour" and "no price list" in str(info.value)
    finally:
        registry.unregister("unpriced-cloud")


@pytest.mark.parametrize(
    ("value", "why"),
    [
        (0, "above 0"),
        (-1, "above 0"),
        ("abc", "is not a number"),
        (True, "must be a number"),
        ([1], "must be a number"),
        (10**9, "at most"),
        ("NaN", "above 0"),
    ],
)
def test_bad_price_caps_are_refused(clouds, make_job, value, why) -> None:
    with pytest.raises(InvalidRequest) as info:
        make_job(target="cheap-cloud", max_price_per_hour=value)
    assert info.value.param == "max_price_per_hour" and why in str(info.value)


def test_a_queued_auto_job_is_sent_to_placement(
    clouds, make_job, sent, django_capture_on_commit_callbacks
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        job = make_job(target="auto", gpu={"count": 1})
    assert sent.named(cc.PLACE_JOB) == [[job.pk]]
    assert JobEvent.objects.filter(job=job).exists()
