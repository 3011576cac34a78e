"""Cloud attempts through the services and tasks, on the real database, with the scripted
fake provider: credentials, the launch error family, poll scheduling, two-phase stop, the
webhook and the reconciler. (The real adapters are tested against RunPod-shaped payloads in
tests/providers; the SSH path end to end in tests/e2e.)"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from gpu_worker import celery_conf as cc
from jobs import storage, tasks
from jobs.models import JobAttempt, JobEvent, TrainingJob
from jobs.services import launch, polling, reconcile, stopping
from jobs.services.attempts import machine_name
from jobs.services.jobs import job_cancel
from jobs.services.projects import credential_create
from jobs.states import JobStatus
from providers import registry
from providers.base import RemoteStatus
from providers.errors import (
    InvalidCredentials,
    NoCapacity,
    RateLimited,
    TransientProviderError,
)
from tests.fakes.adapter import FakeAdapter, register_fake

S = JobStatus


@pytest.fixture
def keyed_cloud(settings) -> FakeAdapter:
    """A fake target that needs a 'runpod' credential, like the real RunPod targets."""
    settings.TRAINHUB_PUBLIC_URL = "http://127.0.0.1:8000"
    adapter = register_fake("keyed-cloud", credential_kind="runpod")
    yield adapter
    registry.unregister("keyed-cloud")


def poll_due(target: str = "fake-cloud") -> None:
    JobAttempt.objects.update(next_poll_at=None)
    tasks.poll_target(target)


def launched(make_job, **fields) -> tuple[TrainingJob, JobAttempt]:
    job = make_job(target=fields.pop("target", "fake-cloud"), **fields)
    tasks.place_job(job.pk)
    return job, JobAttempt.objects.get(job=job, ended_at__isnull=True)


def fresh(obj):
    obj.refresh_from_db()
    return obj


# --- credentials ------------------------------------------------------------------------------


def test_the_projects_newest_credential_is_used_then_the_operators(
    keyed_cloud, make_job, project, settings, sent
) -> None:
    settings.TRAINHUB_OPERATOR_API_KEYS = {"runpod": "rp-operator"}
    project.operator_credential_providers = ["runpod"]
    project.save()
    job = make_job(target="keyed-cloud")  # accepted on the operator's key alone
    tasks.place_job(job.pk)
    assert keyed_cloud.secrets_seen[-1] == {"api_key": "rp-operator"}

    credential_create(project=project, provider="runpod", name="old", secrets={"api_key": "k1"})
    credential_create(project=project, provider="runpod", name="new", secrets={"api_key": "k2"})
    poll_due("keyed-cloud")
    assert keyed_cloud.secrets_seen[-1] == {"api_key": "k2"}, "the project's own key wins"


def test_an_attempt_whose_credential_vanished_ends_with_a_clear_reason(
    keyed_cloud, make_job, project, sent
) -> None:
    credential_create(project=project, provider="runpod", name="main", secrets={"api_key": "k"})
    job, _attempt = launched(make_job, target="keyed-cloud", max_attempts=1)
    project.credentials.all().delete()

    poll_due("keyed-cloud")

    job.refresh_from_db()
    assert (job.status, job.error_code) == (S.FAILED, "provider_error")
    assert "has no 'runpod' credential any more" in job.error_message


def test_an_unconfigured_target_is_refused_at_submit(api, make_file, settings) -> None:
    settings.RUNPOD_ENDPOINT_ID = ""
    settings.TRAINHUB_PUBLIC_URL = "https://trainhub.example.org"
    body = {"model": "acme/tiny", "training_file": make_file().public_id}
    response = api.post("/api/v1/jobs/", {**body, "target": "runpod-serverless"}, format="json")
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["code"], error["param"]) == ("target_unavailable", "target")
    assert "RUNPOD_ENDPOINT_ID" in error["message"]


# --- the launch error family ------------------------------------------------------------------


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


# --- polls ------------------------------------------------------------------------------------


def test_polls_take_the_least_recently_polled_attempts_within_the_budget(
    make_job, settings, sent
) -> None:
    settings.TRAINHUB_PUBLIC_URL = "http://127.0.0.1:8000"
    fake = register_fake("small-budget", poll_batch=2)
    try:
        attempts = [launched(make_job, target="small-budget")[1] for _ in range(3)]
        now = timezone.now()
        for minutes, attempt in zip((1, 3, 2), attempts, strict=True):
            JobAttempt.objects.filter(pk=attempt.pk).update(
                next_poll_at=now, polled_at=now - timedelta(minutes=minutes)
            )
        fake.set_state(attempts[1].provider_instance_id, RemoteStatus.RUNNING)

        tasks.poll_target("small-budget")

        assert [h.instance_id for h in fake.polls[-1]] == [
            attempts[1].provider_instance_id,
            attempts[2].provider_instance_id,
        ]
        running, pending = fresh(attempts[1]), fresh(attempts[2])
        assert running.next_poll_at - timezone.now() == pytest.approx(
            timedelta(seconds=polling.POLL_EVERY[RemoteStatus.RUNNING]), abs=timedelta(seconds=3)
        )
        assert pending.next_poll_at - timezone.now() == pytest.approx(
            timedelta(seconds=polling.POLL_EVERY[RemoteStatus.PENDING]), abs=timedelta(seconds=3)
        )
        tasks.poll_target("small-budget")  # only the overdue one is left
        assert [h.instance_id for h in fake.polls[-1]] == [attempts[0].provider_instance_id]
    finally:
        registry.unregister("small-budget")


def test_a_status_unknown_this_cycle_is_neither_lost_nor_renewed(
    fake_cloud, make_job, sent
) -> None:
    _job, attempt = launched(make_job)
    lease = fresh(attempt).lease_expires_at
    fake_cloud.unknown.add(attempt.provider_instance_id)
    poll_due()
    attempt.refresh_from_db()
    assert attempt.ended_at is None and attempt.lease_expires_at == lease


def test_repeated_provider_events_are_stored_once(fake_cloud, make_job, sent) -> None:
    job, attempt = launched(make_job)
    window = tuple(
        {"seq": i, "type": "metrics", "data": {"step": i, "loss": 2.0 - i / 10}} for i in range(3)
    )
    fake_cloud.set_state(attempt.provider_instance_id, RemoteStatus.RUNNING, events=window)
    poll_due()
    poll_due()
    fake_cloud.set_state(
        attempt.provider_instance_id,
        RemoteStatus.RUNNING,
        events=(*window[1:], {"seq": 3, "type": "metrics", "data": {"step": 3}}),
    )
    poll_due()
    assert list(
        JobEvent.objects.filter(job=job, attempt=1).order_by("seq").values_list("seq", flat=True)
    ) == [0, 1, 2, 3]
    assert fresh(job).status == S.RUNNING


# --- stop -------------------------------------------------------------------------------------


def test_a_cancel_racing_completion_ends_in_exactly_one_terminal_state(
    fake_cloud, make_job, django_capture_on_commit_callbacks, sent
) -> None:
    job, attempt = launched(make_job)
    fake_cloud.set_state(attempt.provider_instance_id, RemoteStatus.RUNNING)
    poll_due()
    with django_capture_on_commit_callbacks(execute=True):
        job_cancel(job=fresh(job))
    # The run finished at the provider before the cancel reached it.
    fake_cloud.set_state(attempt.provider_instance_id, RemoteStatus.SUCCEEDED)
    tasks.stop_machines(job.pk)
    fake_cloud.set_state(attempt.provider_instance_id, RemoteStatus.SUCCEEDED)
    poll_due()

    job.refresh_from_db()
    assert job.status == S.CANCELLED
    assert fresh(attempt).end_reason == "cancelled"
    assert sent.named(cc.INGEST_ARTIFACT) == []
    statuses = JobEvent.objects.filter(job=job, type="status", attempt=0)
    terminal = [
        e.data["status"]
        for e in statuses
        if e.data.get("status") in ("succeeded", "cancelled", "failed")
    ]
    assert terminal == ["cancelled"]


def test_a_stop_the_provider_did_not_confirm_is_sent_again(
    fake_cloud, make_job, django_capture_on_commit_callbacks, sent
) -> None:
    job, attempt = launched(make_job)
    with django_capture_on_commit_callbacks(execute=True):
        job_cancel(job=fresh(job))
    tasks.stop_machines(job.pk)
    # The provider ignored the stop: the machine still runs.
    fake_cloud.set_state(attempt.provider_instance_id, RemoteStatus.RUNNING)
    poll_due()
    assert len(fake_cloud.cancels) == 1, "not re-sent within the resend interval"
    JobAttempt.objects.filter(pk=attempt.pk).update(
        stop_requested_at=timezone.now() - timedelta(seconds=stopping.STOP_RESEND_SECONDS + 1)
    )
    poll_due()
    assert len(fake_cloud.cancels) == 2
    assert fresh(job).status == S.CANCELLING


# --- webhook ----------------------------------------------------------------------------------


def test_the_webhook_polls_its_attempt_at_once(
    fake_cloud, make_job, client, sent, django_capture_on_commit_callbacks
) -> None:
    job, attempt = launched(make_job)
    request = fake_cloud.launches[-1]
    assert request.webhook_url.startswith("http://127.0.0.1:8000/api/v1/webhooks/provider/")

    path = request.webhook_url.removeprefix("http://127.0.0.1:8000")
    with django_capture_on_commit_callbacks(execute=True):  # the request commits
        response = client.post(path, {"id": "anything", "status": "COMPLETED"}, format="json")
    assert response.status_code == 200
    assert sent.named(cc.POLL_ATTEMPT) == [[attempt.pk]]

    forged = path.replace(path.split("/")[-2], f"{attempt.pk}:forged")
    response = client.post(forged, {}, content_type="application/json")
    assert response.status_code == 404 and response.json()["error"]["code"] == "not_found"

    fake_cloud.set_state(attempt.provider_instance_id, RemoteStatus.RUNNING)
    tasks.poll_attempt(attempt.pk)
    assert fresh(job).status == S.RUNNING


# --- reconciler -------------------------------------------------------------------------------


def test_the_reconciler_terminates_only_machines_no_live_attempt_owns(
    fake_cloud, make_job, sent
) -> None:
    _live_job, live = launched(make_job)
    ended_job, ended = launched(make_job)
    JobAttempt.objects.filter(pk=ended.pk).update(ended_at=timezone.now(), end_reason="oom")
    fake_cloud.states["stranger"] = fake_cloud.states[live.provider_instance_id]
    fake_cloud.names["stranger"] = "trainhub-ftjob-unknown-a1"
    # A launch in flight: the machine exists, the attempt has not stored its id yet.
    flight_job = make_job(target="fake-cloud")
    fake_cloud.on_launch = lambda request: None
    from jobs.services.attempts import attempt_start

    flight = attempt_start(job=flight_job, target="fake-cloud")
    fake_cloud.states["in-flight"] = fake_cloud.states[live.provider_instance_id]
    fake_cloud.names["in-flight"] = machine_name(flight)

    assert reconcile.providers_reconcile() == 2

    assert sorted(fake_cloud.cancelled_ids) == sorted([ended.provider_instance_id, "stranger"])
    note = JobEvent.objects.filter(job=ended_job, message__startswith="Reconciler").get()
    assert "attempt 1 ended (oom)" in note.message
    assert fresh(live).ended_at is None


def test_a_succeeded_attempts_machine_stops_billing_too(
    fake_cloud, make_job, django_capture_on_commit_callbacks, sent
) -> None:
    from jobs.services.attempts import attempt_end
    from jobs.states import EndReason

    job, attempt = launched(make_job)
    with django_capture_on_commit_callbacks(execute=True):
        attempt_end(attempt=fresh(attempt), reason=EndReason.SUCCEEDED, message="adapter verified")
    assert sent.named(cc.STOP_MACHINES) == [[job.pk]]
    tasks.stop_machines(job.pk)
    assert fake_cloud.cancelled_ids == [attempt.provider_instance_id]
    tasks.stop_machines(job.pk)  # an ended attempt whose stop was sent is not asked again
    assert len(fake_cloud.cancels) == 1
