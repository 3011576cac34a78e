"""jobs.services.cloud.launch on the real database and Redis: a queued cloud job's next attempt
launched at the provider (the scripted fake, registered as a real target), on the first
candidate offer that takes it, within the project's spend ceiling; the launch error family
(retried, checked, or ending the attempt with a reason); a cancel before or during the launch.
The same paths through the Celery tasks: the last section here and test_services_placement."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from jobs import storage, tasks
from jobs.models import JobAttempt, JobEvent, TrainingJob
from jobs.services.cloud import launch, offers, remote
from jobs.services.core.attempts import attempt_start, machine_name
from jobs.services.core.jobs import job_cancel
from jobs.states import EndReason, JobStatus
from providers import registry
from providers.base import Offer, RemoteStatus
from providers.errors import (
    InvalidCredentials,
    NoCapacity,
    PermanentProviderError,
    RateLimited,
    TransientProviderError,
)
from tests.support.cloud import launched
from tests.support.db import fresh
from tests.support.factories import JobAttemptFactory, TrainingJobFactory
from tests.support.fakes.adapter import FakeAdapter, register_fake
from trainhub_contract import celery_conf as cc

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fresh_provider_state", "sent")]
S = JobStatus


@pytest.fixture
def priced(settings) -> Iterator[FakeAdapter]:
    """A cloud with a price list (placement hands its offers to the launch as candidates)."""
    settings.TRAINHUB_PUBLIC_URL = "http://127.0.0.1:8000"
    adapter = register_fake("priced-cloud", has_offers=True)
    yield adapter
    registry.unregister("priced-cloud")


@pytest.fixture
def ssh_cloud(settings) -> Iterator[FakeAdapter]:
    """A cloud of VMs whose executor the control plane starts over SSH."""
    from providers.registry import TargetKind

    settings.TRAINHUB_PUBLIC_URL = "http://127.0.0.1:8000"
    adapter = register_fake("ssh-cloud", kind=TargetKind.SSH_MACHINE)
    yield adapter
    registry.unregister("ssh-cloud")


def job_of(attempt: JobAttempt) -> TrainingJob:
    return TrainingJob.objects.get(pk=attempt.job_id)


def messages(job: TrainingJob) -> list[str]:
    return list(
        JobEvent.objects.filter(job=job).order_by("number").values_list("message", flat=True)
    )


def started(make_job, target: str = "fake-cloud", **fields) -> JobAttempt:
    """A queued job's attempt started (provisioning) but not launched yet."""
    return attempt_start(job=make_job(target=target, **fields), target=target)


# --- how an offer is named --------------------------------------------------------------------


def test_an_offer_is_named_by_target_id_machine_and_price() -> None:
    offer = Offer("vastai", "4821", "RTX 4090", 1, 24.0, 0.35)
    assert launch.offer_label(offer) == "vastai 4821 (1x RTX 4090 24 GB, $0.35/h)"
    abroad = Offer("lambda", "gpu_8x_h100@us-east-1", "H100", 8, 80.0, 23.92, region="us-east-1")
    assert launch.offer_label(abroad) == (
        "lambda gpu_8x_h100@us-east-1 (8x H100 80 GB in us-east-1, $23.92/h)"
    )


# --- a launch that the provider accepts -------------------------------------------------------


def test_a_queued_cloud_job_is_launched_as_its_next_attempt(fake_cloud, make_job) -> None:
    from jobs.services.cloud.polling import POLL_EVERY

    job = make_job(target="fake-cloud", max_runtime_seconds=7200)
    attempt = launch.attempt_launch(job=job)

    assert attempt is not None and attempt.number == 1 and attempt.target == "fake-cloud"
    attempt = fresh(attempt)
    assert attempt.provider_instance_id == "fake-cloud-i1"
    assert attempt.launched_at is not None and attempt.launch_unconfirmed_at is None
    assert attempt.estimated_cost is None, "no offer, no quoted rate"
    assert attempt.next_poll_at - timezone.now() == pytest.approx(
        timedelta(seconds=POLL_EVERY[RemoteStatus.PENDING]), abs=timedelta(seconds=3)
    )
    assert job_of(attempt).status == S.PROVISIONING

    (request,) = fake_cloud.launches
    assert (request.job_id, request.attempt, request.name) == (
        job.public_id,
        1,
        machine_name(attempt),
    )
    assert request.max_runtime_seconds == 7200 and request.offer is None
    assert request.spec["job_id"] == job.public_id, "a handler-style provider runs the spec"
    assert request.ssh_public_key == ""
    assert request.webhook_url.startswith("http://127.0.0.1:8000/api/v1/webhooks/provider/")
    assert "Attempt 1: fake-cloud accepted the launch as fake-cloud-i1." in messages(job)


def test_a_job_on_the_own_fleet_is_not_launched(fake_cloud, make_job) -> None:
    job = make_job(target="local")
    assert launch.attempt_launch(job=job) is None
    assert not JobAttempt.objects.filter(job=job).exists() and fake_cloud.launches == []


def test_a_job_that_is_no_longer_queued_is_not_launched_again(fake_cloud, make_job) -> None:
    job = make_job(target="fake-cloud")
    assert launch.attempt_launch(job=job) is not None
    assert launch.attempt_launch(job=job) is None  # a duplicate delivery of the same task
    assert len(fake_cloud.launches) == 1 and JobAttempt.objects.filter(job=job).count() == 1


def test_a_machine_driven_over_ssh_gets_the_attempts_own_key_and_no_spec(
    ssh_cloud, make_job
) -> None:
    attempt = launch.attempt_launch(job=make_job(target="ssh-cloud"))
    assert attempt is not None
    attempt = fresh(attempt)
    assert attempt.ssh_private_key_ciphertext
    assert "PRIVATE KEY" not in attempt.ssh_private_key_ciphertext, "stored encrypted"
    (request,) = ssh_cloud.launches
    assert request.spec == {}, "the spec goes over SSH once the machine is up"
    assert request.ssh_public_key == remote.attempt_public_key(attempt)
    assert request.ssh_public_key.endswith(" " + machine_name(attempt))


# --- candidate offers -------------------------------------------------------------------------


def test_the_first_candidate_that_takes_it_is_rented_and_its_cost_estimated(
    priced, make_job
) -> None:
    full = priced.add_offer("c-full", 0.20)
    taken = priced.add_offer("c-free", 0.40, region="EU")
    priced.full.add("c-full")
    job = make_job(target="priced-cloud", max_runtime_seconds=5400)

    attempt = launch.attempt_launch(job=job, candidates=[full, taken])

    assert attempt is not None
    attempt = fresh(attempt)
    assert attempt.number == 1 and attempt.offer["offer_id"] == "c-free"
    assert [r.offer.offer_id for r in priced.launches if r.offer] == ["c-full", "c-free"]
    assert {r.attempt for r in priced.launches} == {1}, "the next offer, in the same attempt"
    assert attempt.estimated_cost == Decimal("0.6000")  # $0.40/h x 1.5 h max runtime
    assert job_of(attempt).estimated_cost == Decimal("0.6000")
    assert offers.refused_reasons([full, taken]) == {
        ("priced-cloud", "c-full"): "no capacity: offer c-full has no machine free"
    }
    accepted = JobEvent.objects.get(job=job, message__contains="accepted the launch")
    assert accepted.data["offer"]["offer_id"] == "c-free"
    assert launch.offer_label(taken) in accepted.message


def test_when_no_candidate_takes_it_the_attempt_ends_no_capacity_naming_each(
    priced, make_job
) -> None:
    first, second = priced.add_offer("c1", 0.10), priced.add_offer("c2", 0.30)
    priced.full.update({"c1", "c2"})
    job = make_job(target="priced-cloud", max_attempts=1)

    attempt = launch.attempt_launch(job=job, candidates=[first, second])

    assert attempt is not None and fresh(attempt).end_reason == EndReason.NO_CAPACITY
    job.refresh_from_db()
    assert (job.status, job.error_code) == (S.FAILED, "no_capacity")
    assert job.error_message.startswith("no offer took the launch: ")
    assert launch.offer_label(first) in job.error_message
    assert launch.offer_label(second) in job.error_message


def test_an_offer_over_the_projects_spend_ceiling_is_skipped_not_launched(
    priced, make_job, project
) -> None:
    project.max_spend_per_hour = Decimal("1.00")
    project.save()
    # The project already rents a machine billed at $0.80/h.
    running = TrainingJobFactory(project=project, target="priced-cloud", status=S.RUNNING)
    JobAttemptFactory(job=running, billed_rate_per_hour=Decimal("0.80"))
    dear, cheap = priced.add_offer("c-dear", 0.50), priced.add_offer("c-cheap", 0.15)

    attempt = launch.attempt_launch(job=make_job(target="priced-cloud"), candidates=[dear, cheap])

    assert attempt is not None and fresh(attempt).offer["offer_id"] == "c-cheap"
    assert [r.offer.offer_id for r in priced.launches if r.offer] == ["c-cheap"]
    assert offers.refused_reasons([dear]) == {}, "a ceiling says nothing about the offer"


def test_when_the_ceiling_leaves_no_candidate_the_attempt_says_so(
    priced, make_job, project
) -> None:
    project.max_spend_per_hour = Decimal("0.10")
    project.save()
    dear = priced.add_offer("c-dear", 0.50)
    job = make_job(target="priced-cloud", max_attempts=1)

    attempt = launch.attempt_launch(job=job, candidates=[dear])

    assert attempt is not None and fresh(attempt).end_reason == EndReason.NO_CAPACITY
    assert priced.launches == []
    assert "would exceed its ceiling of $0.10/h" in job_of(attempt).error_message


# --- the launch error family ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "try_number", "delay"),
    [
        (TransientProviderError("HTTP 503", maybe_applied=False), 0, 5),
        (TransientProviderError("HTTP 503", maybe_applied=False), 2, 30),
        (RateLimited("HTTP 429", retry_after=42), 0, 42),
        (RateLimited("HTTP 429", retry_after=1), 3, 60),
    ],
)
def test_a_launch_that_surely_did_not_happen_is_sent_again_after_a_backoff(
    fake_cloud, make_job, sent, django_capture_on_commit_callbacks, error, try_number, delay
) -> None:
    fake_cloud.launch_error = error
    attempt = started(make_job)
    with django_capture_on_commit_callbacks(execute=True):
        launch.attempt_provision(attempt_pk=attempt.pk, try_number=try_number)

    assert sent.named(cc.PROVISION_ATTEMPT) == [[attempt.pk, try_number + 1]]
    assert sent.countdowns(cc.PROVISION_ATTEMPT) == [delay]
    attempt = fresh(attempt)
    assert attempt.ended_at is None and attempt.provider_instance_id == ""
    assert attempt.launch_unconfirmed_at is None


def test_past_the_backoff_schedule_the_attempt_ends_with_the_providers_error(
    fake_cloud, make_job, sent
) -> None:
    fake_cloud.launch_error = TransientProviderError("HTTP 503", maybe_applied=False)
    attempt = started(make_job, max_attempts=1)
    launch.attempt_provision(attempt_pk=attempt.pk, try_number=len(launch.LAUNCH_RETRY_SECONDS))

    assert fresh(attempt).end_reason == EndReason.PROVIDER_ERROR
    assert job_of(attempt).error_message.startswith("launch failed: HTTP 503")
    assert sent.named(cc.PROVISION_ATTEMPT) == []


def test_a_launch_that_may_have_happened_is_marked_and_looked_at_later(
    fake_cloud, make_job, sent, django_capture_on_commit_callbacks
) -> None:
    fake_cloud.launch_error = TransientProviderError("read timeout", maybe_applied=True)
    attempt = started(make_job)
    with django_capture_on_commit_callbacks(execute=True):
        launch.attempt_provision(attempt_pk=attempt.pk)

    assert fresh(attempt).launch_unconfirmed_at is not None
    assert sent.named(cc.PROVISION_ATTEMPT) == [[attempt.pk, 1]]
    assert sent.countdowns(cc.PROVISION_ATTEMPT) == [launch.UNCONFIRMED_WAIT_SECONDS]
    warning = JobEvent.objects.get(job_id=attempt.job_id, level="warning")
    assert "may have accepted the launch without answering (read timeout)" in warning.message


def test_on_a_machine_driven_over_ssh_a_maybe_applied_launch_is_simply_retried(
    ssh_cloud, make_job, sent, django_capture_on_commit_callbacks
) -> None:
    # The machine is found by its name next time, so there is no output to look at first.
    ssh_cloud.launch_error = TransientProviderError("read timeout", maybe_applied=True)
    attempt = started(make_job, target="ssh-cloud")
    with django_capture_on_commit_callbacks(execute=True):
        launch.attempt_provision(attempt_pk=attempt.pk)

    assert fresh(attempt).launch_unconfirmed_at is None
    assert sent.countdowns(cc.PROVISION_ATTEMPT) == [launch.LAUNCH_RETRY_SECONDS[0]]


@pytest.mark.parametrize(
    ("error", "reason", "message"),
    [
        (
            InvalidCredentials("HTTP 401: invalid api key"),
            EndReason.PROVIDER_ERROR,
            "fake-cloud refused the project's credential: HTTP 401: invalid api key",
        ),
        (
            PermanentProviderError("HTTP 400: unknown gpu type"),
            EndReason.PROVIDER_ERROR,
            "launch failed: HTTP 400: unknown gpu type",
        ),
        (NoCapacity("no H100 in any data centre"), EndReason.NO_CAPACITY, "no H100"),
    ],
    ids=["credentials", "permanent", "no-capacity"],
)
def test_a_launch_the_provider_refused_ends_the_attempt_with_a_reason(
    fake_cloud, make_job, sent, error, reason, message
) -> None:
    fake_cloud.launch_error = error
    attempt = started(make_job, max_attempts=1)
    launch.attempt_provision(attempt_pk=attempt.pk)

    assert fresh(attempt).end_reason == reason
    assert message in job_of(attempt).error_message
    assert sent.named(cc.PROVISION_ATTEMPT) == []


def test_a_credential_deleted_before_the_launch_ends_the_attempt_saying_so(
    make_job, project, settings
) -> None:
    from jobs.services.accounts.projects import credential_create

    settings.TRAINHUB_PUBLIC_URL = "http://127.0.0.1:8000"
    keyed = register_fake("keyed-cloud", credential_kind="runpod")
    try:
        credential_create(project=project, provider="runpod", name="k", secrets={"api_key": "k"})
        attempt = started(make_job, target="keyed-cloud", max_attempts=1)
        project.credentials.all().delete()
        launch.attempt_provision(attempt_pk=attempt.pk)
    finally:
        registry.unregister("keyed-cloud")

    assert keyed.launches == []
    assert fresh(attempt).end_reason == EndReason.PROVIDER_ERROR
    assert "has no 'runpod' credential any more" in job_of(attempt).error_message


# --- provisioning an attempt again ------------------------------------------------------------


def test_an_attempt_launched_or_ended_is_not_provisioned_again(fake_cloud, make_job) -> None:
    launched = launch.attempt_launch(job=make_job(target="fake-cloud"))
    assert launched is not None
    launch.attempt_provision(attempt_pk=launched.pk)  # a redelivered provision task

    ended = started(make_job)
    JobAttempt.objects.filter(pk=ended.pk).update(ended_at=timezone.now(), end_reason="oom")
    launch.attempt_provision(attempt_pk=ended.pk)

    assert [r.job_id for r in fake_cloud.launches] == [launched.job.public_id]


def test_a_retried_attempt_launches_on_the_offer_it_holds(priced, make_job) -> None:
    held = priced.add_offer("c-held", 0.25)
    priced.add_offer("c-other", 0.05)
    attempt = started(make_job, target="priced-cloud")
    JobAttempt.objects.filter(pk=attempt.pk).update(offer=dataclasses.asdict(held))

    launch.attempt_provision(attempt_pk=attempt.pk, try_number=1)

    (request,) = priced.launches
    assert request.offer == held
    assert fresh(attempt).provider_instance_id == "priced-cloud-i1"


def test_a_job_cancelled_before_the_launch_is_not_launched(fake_cloud, make_job) -> None:
    attempt = started(make_job)
    job_cancel(job=job_of(attempt))

    launch.attempt_provision(attempt_pk=attempt.pk)

    assert fake_cloud.launches == []
    attempt = fresh(attempt)
    assert attempt.end_reason == EndReason.CANCELLED
    assert attempt.job.status == S.CANCELLED
    assert "Attempt 1 ended: cancelled before launch." in messages(attempt.job)


def test_a_cancel_during_the_launch_call_stops_the_machine_it_made(
    fake_cloud, make_job, sent, django_capture_on_commit_callbacks
) -> None:
    job = make_job(target="fake-cloud")
    fake_cloud.on_launch = lambda request: job_cancel(job=TrainingJob.objects.get(pk=job.pk))

    with django_capture_on_commit_callbacks(execute=True):
        attempt = launch.attempt_launch(job=job)

    assert attempt is not None
    assert fresh(attempt).provider_instance_id == "fake-cloud-i1", "kept, so it can be stopped"
    assert job_of(attempt).status == S.CANCELLING
    # Once from the cancel (no instance known yet), once after the launch returned one.
    assert sent.named(cc.STOP_MACHINES) == [[job.pk], [job.pk]]


def test_an_unknown_target_ends_the_attempt(make_job, settings) -> None:
    settings.TRAINHUB_PUBLIC_URL = "http://127.0.0.1:8000"
    register_fake("gone-cloud")
    try:
        attempt = started(make_job, target="gone-cloud", max_attempts=1)
    finally:
        registry.unregister("gone-cloud")
    launch.attempt_provision(attempt_pk=attempt.pk)
    assert fresh(attempt).end_reason == EndReason.PROVIDER_ERROR
    assert job_of(attempt).error_message.startswith("unknown target")


# --- the same paths through the Celery tasks --------------------------------------------------


def test_no_capacity_requeues_and_rejected_credentials_fail(
    fake_cloud, make_job, django_capture_on_commit_callbacks, sent
) -> None:
    fake_cloud.launch_error = NoCapacity("no H100 in any data centre")
    job = make_job(target="fake-cloud")
    tasks.place_job(job.pk)
    assert fresh(job).status == S.QUEUED
    assert JobAttempt.objects.get(job=job).end_reason == "no_capacity"

    fake_cloud.launch_error = InvalidCredentials("HTTP 401: invalid api key")
    tasks.place_job(job.pk)
    job.refresh_from_db()
    assert (job.status, job.error_code) == (S.FAILED, "provider_error")
    assert "refused the project's credential" in job.error_message


def test_a_launch_that_surely_did_not_happen_is_retried_with_backoff(
    fake_cloud, make_job, sent, django_capture_on_commit_callbacks
) -> None:
    fake_cloud.launch_error = RateLimited("HTTP 429", retry_after=42)
    with django_capture_on_commit_callbacks(execute=True):  # the task's work commits
        job, attempt = launched(make_job)
    assert sent.named(cc.PROVISION_ATTEMPT) == [[attempt.pk, 1]]
    assert fresh(job).status == S.PROVISIONING and attempt.provider_instance_id == ""

    fake_cloud.launch_error = None
    tasks.provision_attempt(attempt.pk, 1)
    assert fresh(attempt).provider_instance_id == "fake-cloud-i1"
    assert len(fake_cloud.launches) == 2 and {r.attempt for r in fake_cloud.launches} == {1}


def test_retries_stop_after_the_backoff_schedule(fake_cloud, make_job, sent) -> None:
    fake_cloud.launch_error = TransientProviderError("HTTP 503", maybe_applied=False)
    job, attempt = launched(make_job, max_attempts=1)
    tasks.provision_attempt(attempt.pk, len(launch.LAUNCH_RETRY_SECONDS))
    job.refresh_from_db()
    assert (job.status, job.error_code) == (S.FAILED, "provider_error")


def test_an_unconfirmed_launch_is_checked_before_submitting_again(
    fake_cloud, make_job, sent, django_capture_on_commit_callbacks
) -> None:
    fake_cloud.launch_error = TransientProviderError("HTTP 502 after sending", maybe_applied=True)
    with django_capture_on_commit_callbacks(execute=True):  # the task's work commits
        job, attempt = launched(make_job)

    assert fresh(attempt).launch_unconfirmed_at is not None
    assert sent.named(cc.PROVISION_ATTEMPT) == [[attempt.pk, 1]]
    warning = JobEvent.objects.filter(job=job, level="warning").last()
    assert "may have accepted the launch" in warning.message

    # No output appeared for the attempt: it is submitted again, as the same attempt.
    fake_cloud.launch_error = None
    tasks.provision_attempt(attempt.pk, 1)
    attempt.refresh_from_db()
    assert attempt.provider_instance_id == "fake-cloud-i1"
    assert attempt.launch_unconfirmed_at is None
    assert [r.attempt for r in fake_cloud.launches] == [1, 1]


def test_an_unconfirmed_launch_whose_bundle_arrived_is_verified_not_relaunched(
    fake_cloud, make_job, django_capture_on_commit_callbacks, sent
) -> None:
    fake_cloud.launch_error = TransientProviderError("read timeout", maybe_applied=True)
    job, attempt = launched(make_job)
    key = storage.bundle_key(job.project_id, job.public_id, attempt.number)
    storage.save_stream(key, [b"the lost run's bundle"])

    with django_capture_on_commit_callbacks(execute=True):
        tasks.provision_attempt(attempt.pk, 1)

    assert len(fake_cloud.launches) == 1, "no second paid run"
    assert fresh(job).status == S.FINALIZING
    assert sent.named(cc.INGEST_ARTIFACT) == [[attempt.pk, ""]]
