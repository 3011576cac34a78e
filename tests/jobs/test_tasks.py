"""Celery tasks, called as plain functions: the cloud flow through a fake provider, the beat
fan-out, the per-target Redis locks (real Redis) and the single-beat guard."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from jobs import tasks
from jobs.locks import try_lock
from jobs.models import JobAttempt, JobEvent, TrainingJob
from jobs.services.core.attempts import attempt_start
from jobs.services.core.jobs import job_cancel, job_retry
from jobs.states import JobStatus
from providers import registry
from providers.base import RemoteStatus
from providers.errors import PermanentProviderError
from tests.support.cloud import poll_due
from tests.support.db import fresh
from tests.support.fakes.adapter import register_fake
from trainhub.shared_redis import redis_client
from trainhub_contract import celery_conf as cc

S = JobStatus

POLL_LOCK = "poll:fake-cloud"
EXPIRE_LOCK = "expire-leases"


@pytest.fixture(autouse=True)
def _no_stale_locks() -> None:
    # A test run killed while holding a lock would otherwise skip polls until the TTL ends.
    redis_client().delete(f"trainhub:lock:{POLL_LOCK}", f"trainhub:lock:{EXPIRE_LOCK}")


@pytest.fixture
def cloud_job(fake_cloud, make_job, django_capture_on_commit_callbacks, sent) -> TrainingJob:
    """A queued job on the fake target; creating it sent PLACE_JOB on commit."""
    with django_capture_on_commit_callbacks(execute=True):
        job = make_job(target="fake-cloud")
    assert job.status == S.QUEUED
    assert sent.named(cc.PLACE_JOB) == [[job.pk]]
    sent.clear()
    return job


@pytest.fixture
def launched(cloud_job, fake_cloud) -> tuple[TrainingJob, JobAttempt]:
    tasks.place_job(cloud_job.pk)
    return fresh(cloud_job), JobAttempt.objects.get(job=cloud_job, number=1)


# --- cloud flow ---------------------------------------------------------------------------------


def test_submit_launches_a_named_machine_and_stores_its_id(cloud_job, fake_cloud) -> None:
    tasks.place_job(cloud_job.pk)

    [request] = fake_cloud.launches
    assert request.name == f"trainhub-{cloud_job.public_id}-a1"
    assert (request.job_id, request.attempt) == (cloud_job.public_id, 1)
    assert request.max_runtime_seconds == cloud_job.max_runtime_seconds
    attempt = JobAttempt.objects.get(job=cloud_job)
    assert attempt.number == 1 and attempt.target == "fake-cloud"
    assert attempt.provider_instance_id == "fake-cloud-i1"
    assert fresh(cloud_job).status == S.PROVISIONING

    # A redelivered SUBMIT_ATTEMPT must not rent a second machine.
    tasks.place_job(cloud_job.pk)
    assert len(fake_cloud.launches) == 1
    assert JobAttempt.objects.filter(job=cloud_job).count() == 1


def test_poll_running_moves_the_job_and_renews_the_lease(launched, fake_cloud) -> None:
    job, attempt = launched
    JobAttempt.objects.filter(pk=attempt.pk).update(
        lease_expires_at=timezone.now() + timedelta(seconds=5)
    )
    fake_cloud.set_state(
        attempt.provider_instance_id,
        RemoteStatus.RUNNING,
        events=({"seq": 0, "type": "metrics", "data": {"step": 3, "loss": 1.5}},),
    )

    poll_due()

    assert [h.instance_id for h in fake_cloud.polls[-1]] == [attempt.provider_instance_id]
    assert fake_cloud.polls[-1][0].name == f"trainhub-{job.public_id}-a1"
    job.refresh_from_db()
    attempt.refresh_from_db()
    assert job.status == S.RUNNING
    assert attempt.lease_expires_at > timezone.now() + timedelta(seconds=60)
    assert job.latest_metrics == {"step": 3, "loss": 1.5}
    assert JobEvent.objects.filter(job=job, attempt=1, seq=0).exists()


def test_poll_pending_renews_the_lease_only(launched, fake_cloud) -> None:
    job, attempt = launched
    JobAttempt.objects.filter(pk=attempt.pk).update(
        lease_expires_at=timezone.now() + timedelta(seconds=5)
    )
    poll_due()  # the fake reports a fresh launch as pending
    assert fresh(job).status == S.PROVISIONING
    assert fresh(attempt).lease_expires_at > timezone.now() + timedelta(seconds=60)


def test_poll_lost_requeues_and_stops_only_the_lost_machine(
    launched, fake_cloud, django_capture_on_commit_callbacks, sent
) -> None:
    job, first = launched
    fake_cloud.set_state(first.provider_instance_id, RemoteStatus.LOST, "instance vanished")

    with django_capture_on_commit_callbacks(execute=True):
        poll_due()

    first.refresh_from_db()
    assert first.end_reason == "worker_lost" and first.ended_at is not None
    assert fresh(job).status == S.QUEUED
    assert sent.named(cc.PLACE_JOB) == [[job.pk]]
    assert sent.named(cc.STOP_MACHINES) == [[job.pk]], "the lost machine is terminated"

    # The broker may run the two follow-ups in either order; here the relaunch wins.
    tasks.place_job(job.pk)
    second = JobAttempt.objects.get(job=job, number=2)
    assert fake_cloud.launches[-1].name == f"trainhub-{job.public_id}-a2"
    tasks.stop_machines(job.pk)

    assert fake_cloud.cancelled_ids == [first.provider_instance_id]
    assert fresh(second).ended_at is None, "the stop of attempt 1 leaves attempt 2 running"
    assert fresh(job).status == S.PROVISIONING


def test_instance_missing_from_the_poll_counts_as_lost(launched, fake_cloud, sent) -> None:
    job, attempt = launched
    del fake_cloud.states[attempt.provider_instance_id]
    poll_due()
    assert fresh(attempt).end_reason == "worker_lost"
    assert fresh(job).status == S.QUEUED


def test_lost_on_the_last_attempt_fails_the_job(fake_cloud, make_job, sent) -> None:
    job = make_job(target="fake-cloud", max_attempts=1)
    tasks.place_job(job.pk)
    fake_cloud.set_state("fake-cloud-i1", RemoteStatus.LOST)
    poll_due()
    job.refresh_from_db()
    assert (job.status, job.error_code) == (S.FAILED, "worker_lost")
    assert "after 1 attempt(s)" in job.error_message


def test_poll_succeeded_and_failed_reports(
    fake_cloud, make_job, django_capture_on_commit_callbacks, sent
) -> None:
    ok, bad = make_job(target="fake-cloud"), make_job(target="fake-cloud")
    for job in (ok, bad):
        tasks.place_job(job.pk)
        JobAttempt.objects.filter(job=job).update(started_at=timezone.now())
    fake_cloud.set_state("fake-cloud-i1", RemoteStatus.RUNNING)
    fake_cloud.set_state("fake-cloud-i2", RemoteStatus.RUNNING)
    poll_due()
    assert len(fake_cloud.polls[-1]) == 2, "one batched call for every live attempt of the target"

    fake_cloud.set_state("fake-cloud-i1", RemoteStatus.SUCCEEDED)
    fake_cloud.set_state(
        "fake-cloud-i2", RemoteStatus.FAILED, "CUDA out of memory", error_code="oom"
    )
    with django_capture_on_commit_callbacks(execute=True):
        poll_due()

    assert fresh(ok).status == S.FINALIZING
    assert sent.named(cc.INGEST_ARTIFACT) == [[JobAttempt.objects.get(job=ok).pk, ""]]
    bad.refresh_from_db()
    assert (bad.status, bad.error_code) == (S.FAILED, "oom")
    assert "CUDA out of memory" in bad.error_message
    assert sent.named(cc.STOP_MACHINES) == [[bad.pk]], "a failed attempt's machine stops billing"
    tasks.stop_machines(bad.pk)
    assert fake_cloud.cancelled_ids == ["fake-cloud-i2"]


def test_cancel_stops_the_machine_and_cancels_the_job(
    launched, fake_cloud, django_capture_on_commit_callbacks, sent
) -> None:
    job, attempt = launched
    with django_capture_on_commit_callbacks(execute=True):
        job_cancel(job=job)
    assert fresh(job).status == S.CANCELLING
    assert sent.named(cc.STOP_MACHINES) == [[job.pk]]

    tasks.stop_machines(job.pk)

    assert fake_cloud.cancelled_ids == [attempt.provider_instance_id]
    assert fake_cloud.cancels[0].name == f"trainhub-{job.public_id}-a1"
    attempt.refresh_from_db()
    assert attempt.ended_at is None and attempt.stop_requested_at is not None
    assert fresh(job).status == S.CANCELLING, "cancelling until the provider confirms"

    poll_due()  # the provider now reports the machine cancelled: the stop is confirmed
    attempt.refresh_from_db()
    assert attempt.end_reason == "cancelled" and attempt.ended_at is not None
    job.refresh_from_db()
    assert job.status == S.CANCELLED and job.finished_at is not None
    tasks.stop_machines(job.pk)  # a repeat is harmless (cancel is idempotent)
    assert fresh(job).status == S.CANCELLED


@pytest.mark.django_db(transaction=True)
def test_cancel_while_the_launch_is_in_flight_still_stops_the_machine(
    fake_cloud, make_job, sent
) -> None:
    # Committed for real, so each on_commit follow-up is sent the moment its transaction ends.
    job = make_job(target="fake-cloud")
    sent.clear()

    def cancel_meanwhile(_request) -> None:
        # The user cancels before the provider call returns, and another worker runs that
        # stop at once: the attempt has no instance id yet, so it has nothing to terminate.
        job_cancel(job=TrainingJob.objects.get(pk=job.pk))
        assert sent.named(cc.STOP_MACHINES) == [[job.pk]]
        tasks.stop_machines(job.pk)
        sent.clear()

    fake_cloud.on_launch = cancel_meanwhile
    tasks.place_job(job.pk)
    assert fake_cloud.cancels == []
    assert sent.named(cc.STOP_MACHINES) == [[job.pk]], "the launch asks for the stop it missed"

    tasks.stop_machines(job.pk)
    assert fake_cloud.cancelled_ids == ["fake-cloud-i1"]
    poll_due()
    assert fresh(job).status == S.CANCELLED


def test_failed_launch_fails_the_job_with_the_provider_error(
    cloud_job, fake_cloud, django_capture_on_commit_callbacks, sent
) -> None:
    fake_cloud.launch_error = PermanentProviderError("HTTP 403: no access to the H100 pool")
    with django_capture_on_commit_callbacks(execute=True):
        tasks.place_job(cloud_job.pk)

    attempt = JobAttempt.objects.get(job=cloud_job)
    assert attempt.end_reason == "provider_error" and attempt.provider_instance_id == ""
    cloud_job.refresh_from_db()
    assert cloud_job.status == S.FAILED
    assert cloud_job.error_code == "provider_error"
    assert cloud_job.error_message == "launch failed: HTTP 403: no access to the H100 pool"
    # Only the creator's notification of the end (services/notifications).
    assert [name for name, _ in sent.calls] == [cc.NOTIFY_JOB], "nothing to stop or relaunch"

    # A retry relaunches on the same target as attempt 2.
    fake_cloud.launch_error = None
    with django_capture_on_commit_callbacks(execute=True):
        job_retry(job=cloud_job)
    assert sent.named(cc.PLACE_JOB) == [[cloud_job.pk]]
    tasks.place_job(cloud_job.pk)
    assert fake_cloud.launches[-1].name == f"trainhub-{cloud_job.public_id}-a2"
    assert fresh(cloud_job).status == S.PROVISIONING


def test_submit_ignores_jobs_that_are_not_queued_or_not_cloud(
    cloud_job, make_job, fake_cloud, sent
) -> None:
    job_cancel(job=cloud_job)
    tasks.place_job(cloud_job.pk)
    local = make_job()
    tasks.place_job(local.pk)
    assert fake_cloud.launches == []
    assert fresh(local).status == S.QUEUED
    assert not JobAttempt.objects.exists()


# --- beat fan-out and locks ----------------------------------------------------------------------


def test_poll_active_attempts_fans_out_one_expiring_poll_per_cloud_target(monkeypatch) -> None:
    from trainhub.celery import app

    register_fake("fake-a")
    register_fake("fake-b")
    calls: list[dict] = []
    monkeypatch.setattr(app, "send_task", lambda name, **kw: calls.append({"name": name, **kw}))
    try:
        expected = sorted(t.name for t in registry.cloud_targets())
        tasks.poll_active_attempts()
    finally:
        registry.unregister("fake-a")
        registry.unregister("fake-b")

    targets = sorted(c["args"][0] for c in calls)
    assert targets == expected
    assert {"fake-a", "fake-b"} <= set(targets) and "local" not in targets
    assert all(c["expires"] == cc.POLL_INTERVAL_SECONDS for c in calls)
    assert {c["name"] for c in calls} == {cc.POLL_TARGET}


def test_poll_target_skips_while_another_poller_holds_the_lock(launched, fake_cloud) -> None:
    job, attempt = launched
    fake_cloud.set_state(attempt.provider_instance_id, RemoteStatus.RUNNING)
    polls = len(fake_cloud.polls)

    with try_lock(POLL_LOCK, ttl_seconds=30) as held:
        assert held
        assert redis_client().exists(f"trainhub:lock:{POLL_LOCK}")
        poll_due()
        assert len(fake_cloud.polls) == polls
        assert fresh(job).status == S.PROVISIONING

    poll_due()
    assert len(fake_cloud.polls) == polls + 1
    assert fresh(job).status == S.RUNNING
    assert not redis_client().exists(f"trainhub:lock:{POLL_LOCK}"), "released after the cycle"


def test_expire_leases_skips_while_the_lock_is_held(make_job) -> None:
    job = make_job()
    attempt = attempt_start(job=job, target="local")
    JobAttempt.objects.filter(pk=attempt.pk).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1)
    )

    with try_lock(EXPIRE_LOCK, ttl_seconds=30) as held:
        assert held
        tasks.expire_leases()
        assert fresh(attempt).ended_at is None

    tasks.expire_leases()
    assert fresh(attempt).end_reason == "lease_expired"
    assert fresh(job).status == S.QUEUED


def test_tasks_are_registered_by_name_and_routed_to_their_queues() -> None:
    from trainhub.celery import app

    names = [cc.VALIDATE_FILE, cc.PLACE_JOB, cc.POLL_ACTIVE_ATTEMPTS, cc.POLL_TARGET,
             cc.STOP_MACHINES, cc.INGEST_ARTIFACT, cc.EXPIRE_LEASES, cc.DISPATCH, cc.FLEET_TICK,
             cc.PURGE_STORAGE, cc.STORAGE_SWEEP, cc.PROVISION_ATTEMPT, cc.POLL_ATTEMPT,
             cc.RECONCILE_PROVIDERS, cc.DELIVER_WEBHOOK, cc.WEBHOOKS_DUE]  # fmt: skip
    for name in names:
        assert name in app.tasks, name
        assert app.tasks[name].ignore_result
        route = app.amqp.router.route({}, name)
        # Deliveries wait on receivers: their own queue, so they never hold up a poll or stop.
        expected = cc.WEBHOOKS_QUEUE if name == cc.DELIVER_WEBHOOK else cc.DEFAULT_QUEUE
        assert route["queue"].name == expected, name
    scheduled = {entry["task"] for entry in app.conf.beat_schedule.values()}
    assert scheduled == {
        cc.POLL_ACTIVE_ATTEMPTS, cc.EXPIRE_LEASES, cc.FLEET_TICK, cc.STORAGE_SWEEP,
        cc.RECONCILE_PROVIDERS, cc.PLACE_WAITING, cc.WEBHOOKS_DUE,
    }  # fmt: skip
    assert app.conf.broker_transport_options["visibility_timeout"] > cc.LONGEST_JOB_SECONDS


def test_the_control_plane_has_no_task_a_node_could_send() -> None:
    """Nodes speak over HTTPS with their token (api.node_views) and cannot publish to the
    broker: the tasks they once sent (events, registration, heartbeats) are gone for good."""
    from trainhub.celery import app

    removed = {"trainhub.record_events", "trainhub.node_register", "trainhub.node_heartbeat",
               "trainhub.node_stopping"}  # fmt: skip
    assert removed.isdisjoint(app.tasks)
    assert not hasattr(cc, "RECORD_EVENTS") and not hasattr(cc, "CANCEL_ATTEMPT_COMMAND")


# --- single beat ---------------------------------------------------------------------------------


def _beat_lock_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "beat-lock"]


def test_a_second_beat_refuses_to_start(monkeypatch) -> None:
    import trainhub.celery as beat

    # A short TTL so the refresher's cycle (TTL / 3) can be watched within the test.
    monkeypatch.setattr(beat, "BEAT_LOCK_TTL_SECONDS", 3)
    client = redis_client()
    client.delete(beat.BEAT_LOCK_KEY)
    before = set(_beat_lock_threads())
    try:
        beat._refuse_second_beat()
        owner = client.get(beat.BEAT_LOCK_KEY)
        assert owner and 0 < client.ttl(beat.BEAT_LOCK_KEY) <= 3, (
            "the lock frees itself if the beat dies"
        )
        with pytest.raises(SystemExit) as refused:
            beat._refuse_second_beat()
        assert "already running" in str(refused.value.code)
        assert client.get(beat.BEAT_LOCK_KEY) == owner

        time.sleep(2.2)  # past the TTL: alive only because the refresher extended it
        assert client.get(beat.BEAT_LOCK_KEY) == owner

        # The key is taken over (this beat stalled past the TTL): it must not be stolen back.
        client.set(beat.BEAT_LOCK_KEY, "other-host:1", ex=30)
        [refresher] = set(_beat_lock_threads()) - before
        refresher.join(timeout=3)
        assert not refresher.is_alive(), "the refresher stops once the lock is not its own"
        assert client.get(beat.BEAT_LOCK_KEY) == b"other-host:1"
    finally:
        client.delete(beat.BEAT_LOCK_KEY)
