"""Pause and resume on the real database (OpenAI's fine_tuning.jobs.pause / resume): a paused
job's attempt is asked to save a checkpoint and stop (mode "pause" on a node, the cancel file
over SSH, a plain stop on serverless), its end leaves the job paused and frees its machine,
resume queues it again and the next attempt resumes from the newest checkpoint without the
paused attempt counting against max_attempts. Celery messages are recorded (``sent``)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.utils import timezone

from jobs import storage, tasks
from jobs.errors import Conflict
from jobs.models import GpuNode, JobAttempt, JobEvent, TrainingJob
from jobs.services.cloud import remote
from jobs.services.core import stopping
from jobs.services.core.attempts import attempt_record_events, attempt_start, attempts_expire_leases
from jobs.services.core.jobs import job_cancel, job_pause, job_resume
from jobs.services.fleet import nodes
from jobs.services.scheduling import dispatch
from jobs.states import EndReason, JobStatus
from providers import registry
from providers.base import RemoteStatus, SshAddress
from tests.support.cloud import launched, poll_due
from tests.support.db import fresh
from tests.support.fakes.adapter import FakeAdapter, register_fake
from tests.support.fleet import attempt_of, expire_lease, node_status
from trainhub_contract import celery_conf as cc

pytestmark = pytest.mark.django_db
S = JobStatus
N = GpuNode.Status


def _report(job: TrainingJob, seq: int, status: str, number: int = 1, **data: object) -> None:
    """What the attempt's executor reports (through the node's events endpoint)."""
    event = {"seq": seq, "type": "status", "message": status, "data": {"status": status, **data}}
    attempt_record_events(job_id=job.public_id, attempt_number=number, events=[event])


def _stop(job_id: str, attempt: int = 1, mode: str = "pause") -> dict:
    return {"job_id": job_id, "attempt": attempt, "mode": mode}


def _statuses(job: TrainingJob) -> list[str]:
    events = JobEvent.objects.filter(job=job, type="status", attempt=0).order_by("number")
    return [e.data["status"] for e in events if "status" in e.data]


@pytest.fixture
def training(claimed):
    """``claimed``, with its executor reporting that training started."""
    _report(claimed.job, 0, "running")
    assert fresh(claimed.job).status == S.RUNNING
    return claimed


# --- on an own GPU node -----------------------------------------------------------------------


def test_pause_of_a_running_job_asks_its_node_to_checkpoint_and_stop(training) -> None:
    job = job_pause(job=training.job)

    assert job.status == fresh(job).status == S.PAUSED
    assert _statuses(job)[-1] == "paused"
    attempt = fresh(training.attempt)
    assert attempt.ended_at is None, "it ends when the node confirms the stop"
    assert attempt.pause_requested_at is not None
    job_id = job.public_id
    assert nodes.node_stop_requests(node=training.node) == [_stop(job_id)]
    assert nodes.node_stop_requests(node=training.node, running=(job_id, 1)) == [_stop(job_id)], (
        "the attempt it runs is listed once, to pause (not also to cancel)"
    )
    assert node_status(training.node) == N.BUSY


def test_the_end_of_a_paused_jobs_attempt_keeps_it_paused_and_frees_the_node(training) -> None:
    job = job_pause(job=training.job)
    _report(job, 1, "checkpoint_ignored")  # an unknown status moves nothing
    _report(job, 2, "cancelled")  # what the executor reports after its checkpoint

    assert fresh(job).status == S.PAUSED
    attempt = fresh(training.attempt)
    assert attempt.ended_at is not None and attempt.end_reason == EndReason.PAUSED
    assert node_status(training.node) == N.IDLE
    assert nodes.node_stop_requests(node=training.node) == []
    assert nodes.node_stop_requests(node=training.node, running=(job.public_id, 1)) == [
        _stop(job.public_id, mode="cancel")
    ], "an ended attempt the node still runs stops at once"


def test_resume_queues_the_job_and_the_next_attempt_resumes_from_the_checkpoint(
    training, dispatch_now, sent
) -> None:
    job = job_pause(job=training.job)
    checkpoint = storage.checkpoint_key(job.project_id, job.public_id, 1)
    storage.save_stream(checkpoint, [b"the checkpoint the paused attempt uploaded"])
    _report(job, 1, "cancelled")

    job = job_resume(job=fresh(job))

    assert job.status == fresh(job).status == S.QUEUED
    assert _statuses(job)[-2:] == ["paused", "queued"]
    assert fresh(job).attempt_budget_start == 1, "the paused attempt is not counted"
    assert dispatch_now() == 1
    claim = dispatch.attempt_claim(node=training.node, job_id=job.public_id, attempt_number=2)
    assert claim is not None
    assert claim.spec["outputs"]["resume_url"], "resumes from the sealed checkpoint"


def test_resume_while_the_attempt_is_still_saving_is_refused(training) -> None:
    job = job_pause(job=training.job)

    with pytest.raises(Conflict) as raised:
        job_resume(job=job)

    assert (raised.value.code, raised.value.http_status) == ("job_still_pausing", 409)
    assert "few seconds" in raised.value.message
    assert fresh(job).status == S.PAUSED
    assert JobAttempt.objects.filter(job=job).count() == 1


def test_a_paused_job_not_yet_claimed_by_its_node_stops_at_once(placed) -> None:
    job_pause(job=placed.job)

    attempt = fresh(placed.attempt)
    assert attempt.end_reason == EndReason.PAUSED, "nothing ran: nothing to save"
    assert fresh(placed.job).status == S.PAUSED
    assert node_status(placed.node) == N.IDLE
    assert (
        dispatch.attempt_claim(node=placed.node, job_id=placed.job.public_id, attempt_number=1)
        is None
    ), "the node's claim of it is refused"


@pytest.mark.parametrize("status", [S.QUEUED, S.SUCCEEDED, S.CANCELLING, S.PAUSED])
def test_only_provisioning_or_running_jobs_can_be_paused(make_job, status: JobStatus) -> None:
    job = make_job()
    TrainingJob.objects.filter(pk=job.pk).update(status=status)

    with pytest.raises(Conflict) as raised:
        job_pause(job=fresh(job))

    assert (raised.value.code, raised.value.http_status) == ("job_not_pausable", 409)
    assert f"is {status}" in raised.value.message
    assert fresh(job).status == status


@pytest.mark.parametrize("status", [S.QUEUED, S.RUNNING, S.CANCELLED])
def test_only_paused_jobs_can_be_resumed(make_job, status: JobStatus) -> None:
    job = make_job()
    TrainingJob.objects.filter(pk=job.pk).update(status=status)

    with pytest.raises(Conflict) as raised:
        job_resume(job=fresh(job))

    assert (raised.value.code, raised.value.http_status) == ("job_not_resumable", 409)
    assert f"is {status}" in raised.value.message


def test_cancel_of_a_paused_job_cancels_it_at_once(training) -> None:
    job = job_pause(job=training.job)
    _report(job, 1, "cancelled")

    job_cancel(job=fresh(job))

    assert fresh(job).status == S.CANCELLED
    assert _statuses(job)[-2:] == ["cancelling", "cancelled"]


def test_cancel_of_a_job_still_pausing_makes_its_node_stop_now(training) -> None:
    job = job_pause(job=training.job)

    job_cancel(job=fresh(job))

    assert fresh(job).status == S.CANCELLING
    assert nodes.node_stop_requests(node=training.node) == [_stop(job.public_id, mode="cancel")]
    _report(job, 1, "cancelled")
    assert fresh(job).status == S.CANCELLED
    assert fresh(training.attempt).end_reason == EndReason.CANCELLED


def test_a_lost_attempt_leaves_the_job_paused_a_permanent_failure_fails_it(
    training, make_job
) -> None:
    job = job_pause(job=training.job)
    expire_lease(training.attempt)
    assert attempts_expire_leases() == 1
    assert fresh(job).status == S.PAUSED, "it was to stop anyway: nothing to retry"

    other = make_job()
    attempt_start(job=other, target="local")
    _report(other, 0, "running")
    job_pause(job=fresh(other))
    _report(other, 1, "failed", code="oom")
    other = fresh(other)
    assert (other.status, other.error_code) == (S.FAILED, "oom"), "a resume would meet it again"
    assert "while pausing" in other.error_message


def test_a_run_that_finished_before_the_pause_reached_it_keeps_its_adapter(
    training, sent, django_capture_on_commit_callbacks
) -> None:
    job = job_pause(job=training.job)
    with django_capture_on_commit_callbacks(execute=True):
        _report(job, 1, "succeeded", sha256="0" * 64)
    assert fresh(job).status == S.FINALIZING
    assert sent.named(cc.INGEST_ARTIFACT) == [[training.attempt.pk, "0" * 64]]


def test_a_resumed_job_gets_its_full_retry_budget_back_from_the_pause(
    make_job, dispatch_now, claimed, sent
) -> None:
    """max_attempts=2: attempt 1 paused, attempt 2 lost → requeued (1 of 2 used), where
    counting the paused attempt would have failed the job."""
    TrainingJob.objects.filter(pk=claimed.job.pk).update(max_attempts=2)
    _report(claimed.job, 0, "running")
    job = job_pause(job=fresh(claimed.job))
    _report(job, 1, "cancelled")
    job_resume(job=fresh(job))
    assert dispatch_now() == 1
    second = attempt_of(job, 2)

    expire_lease(second)
    attempts_expire_leases()

    job = fresh(job)
    assert job.status == S.QUEUED, job.error_message
    assert "1 attempt(s) left" in JobEvent.objects.filter(job=job).last().message


# --- on rented machines -----------------------------------------------------------------------


def test_a_paused_serverless_attempt_is_stopped_like_a_cancelled_one(
    fake_cloud, make_job, django_capture_on_commit_callbacks, sent
) -> None:
    job, attempt = launched(make_job)
    fake_cloud.set_state(attempt.provider_instance_id, RemoteStatus.RUNNING)
    poll_due()
    assert fresh(job).status == S.RUNNING
    sent.clear()

    with django_capture_on_commit_callbacks(execute=True):
        job_pause(job=fresh(job))
    assert sent.named(cc.STOP_MACHINES) == [[job.pk]]
    tasks.stop_machines(job.pk)
    assert fake_cloud.cancelled_ids == [attempt.provider_instance_id], "no signal: a stop"

    fake_cloud.set_state(attempt.provider_instance_id, RemoteStatus.CANCELLED)
    poll_due()
    assert fresh(attempt).end_reason == EndReason.PAUSED
    assert fresh(job).status == S.PAUSED


@pytest.fixture
def fake_vm(settings) -> Iterator[FakeAdapter]:
    """A scripted SSH-driven target (the control plane runs the executor over SSH)."""
    settings.TRAINHUB_PUBLIC_URL = "http://127.0.0.1:8000"
    adapter = register_fake("fake-vm", kind=registry.TargetKind.SSH_MACHINE)
    yield adapter
    registry.unregister("fake-vm")


def test_a_paused_ssh_machine_checkpoints_in_place_then_is_terminated(
    fake_vm, make_job, monkeypatch, django_capture_on_commit_callbacks, sent
) -> None:
    drives: list[bool] = []
    monkeypatch.setattr(
        remote, "attempt_drive", lambda *, attempt, state, pause=False: drives.append(pause)
    )
    job, attempt = launched(make_job, target="fake-vm")
    running = {"ssh": SshAddress("127.0.0.1", 22)}
    fake_vm.set_state(attempt.provider_instance_id, RemoteStatus.RUNNING, **running)
    JobAttempt.objects.filter(pk=attempt.pk).update(claimed_at=timezone.now())  # started
    attempt_record_events(
        job_id=job.public_id,
        attempt_number=1,
        events=[{"seq": 0, "type": "status", "data": {"status": "running"}}],
    )

    with django_capture_on_commit_callbacks(execute=True):
        job_pause(job=fresh(job))
    tasks.stop_machines(job.pk)
    assert fake_vm.cancels == [], "left running to save its checkpoint"
    poll_due("fake-vm")
    assert drives == [True], "polled: the cancel file says pause"

    # The grace ran out: the machine bills, so it is terminated all the same.
    JobAttempt.objects.filter(pk=attempt.pk).update(
        pause_requested_at=timezone.now() - timedelta(seconds=stopping.PAUSE_GRACE_SECONDS + 1)
    )
    poll_due("fake-vm")
    assert fake_vm.cancelled_ids == [attempt.provider_instance_id]
    fake_vm.set_state(attempt.provider_instance_id, RemoteStatus.CANCELLED)
    poll_due("fake-vm")
    assert fresh(attempt).end_reason == EndReason.PAUSED
    assert fresh(job).status == S.PAUSED


# --- the admin actions --------------------------------------------------------------------------


def test_the_admin_pause_and_resume_actions_use_the_services(admin_client, training) -> None:
    job = training.job
    url = "/admin/jobs/trainingjob/"
    response = admin_client.post(
        url, {"action": "pause_jobs", "_selected_action": [job.pk]}, follow=True
    )
    assert "Paused 1 job(s)." in response.content.decode()
    assert fresh(job).status == S.PAUSED

    response = admin_client.post(
        url, {"action": "resume_jobs", "_selected_action": [job.pk]}, follow=True
    )
    assert "still pausing" in response.content.decode(), "refused until the attempt ended"
    _report(job, 1, "cancelled")
    admin_client.post(url, {"action": "resume_jobs", "_selected_action": [job.pk]})
    assert fresh(job).status == S.QUEUED
