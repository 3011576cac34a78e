"""The stall watchdog: an attempt whose executor heartbeats but reports nothing else for its
bound (loading: TRAINHUB_STALL_SECONDS; training: that, or TRAINHUB_STALL_STEPS times its
slowest step) ends ``stalled``, a retried end reason, and what runs it is told to stop."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from jobs.models import JobAttempt, JobEvent, TrainingJob
from jobs.services.core.attempts import (
    attempt_record_events,
    attempt_start,
    attempts_end_stalled,
    stall_bound_seconds,
)
from jobs.services.fleet import nodes
from jobs.states import EndReason, JobStatus
from tests.support.db import fresh

pytestmark = pytest.mark.django_db
S = JobStatus


class Executor:
    """An attempt's executor as the control plane hears it: numbered events."""

    def __init__(self, job: TrainingJob, attempt: int = 1) -> None:
        self.job, self.attempt, self.seq = job, attempt, 0

    def send(self, type_: str, message: str = "", **data: object) -> None:
        event = {"seq": self.seq, "type": type_, "message": message, "data": data}
        self.seq += 1
        attempt_record_events(job_id=self.job.public_id, attempt_number=self.attempt,
                              events=[event])  # fmt: skip


@pytest.fixture
def running(make_job) -> tuple[TrainingJob, JobAttempt, Executor]:
    job = make_job()
    attempt = attempt_start(job=job, target="local")
    executor = Executor(job)
    executor.send("status", "running", status="running")
    return fresh(job), attempt, executor


def _silent_for(attempt: JobAttempt, seconds: float) -> None:
    """As if its last event other than a heartbeat came ``seconds`` ago."""
    JobAttempt.objects.filter(pk=attempt.pk).update(
        progress_at=timezone.now() - timedelta(seconds=seconds)
    )


def test_steps_are_timed_and_heartbeats_are_not_progress(running) -> None:
    _, attempt, executor = running
    executor.send("metrics", step=1, loss=2.0)
    JobAttempt.objects.filter(pk=attempt.pk).update(step_at=timezone.now() - timedelta(seconds=30))
    executor.send("metrics", step=4, loss=1.9)  # three steps in about 30 s
    timed = fresh(attempt)
    assert timed.progress_step == 4 and 9.9 < timed.step_seconds < 11
    JobAttempt.objects.filter(pk=attempt.pk).update(step_at=timezone.now() - timedelta(seconds=4))
    executor.send("metrics", step=6, loss=1.8)  # faster now: the slowest step is kept
    assert 9.9 < fresh(attempt).step_seconds < 11

    _silent_for(attempt, 700)
    executor.send("heartbeat")
    assert (timezone.now() - fresh(attempt).progress_at).total_seconds() > 690
    executor.send("log", "Saving a checkpoint at step 6.")
    assert (timezone.now() - fresh(attempt).progress_at).total_seconds() < 5
    assert fresh(attempt).progress_step == 6, "a log is progress, not a step"


def test_a_run_silent_while_loading_ends_stalled_and_the_job_is_retried(running, settings) -> None:
    settings.TRAINHUB_STALL_SECONDS = 600
    job, attempt, executor = running
    executor.send("log", "Loading weights")
    _silent_for(attempt, 590)
    assert attempts_end_stalled() == 0, "within the loading floor"

    _silent_for(attempt, 610)
    executor.send("heartbeat")  # alive, and still nothing else
    assert attempts_end_stalled() == 1
    ended = fresh(attempt)
    assert ended.end_reason == EndReason.STALLED and EndReason.STALLED.retryable
    assert fresh(job).status == S.QUEUED
    said = JobEvent.objects.filter(job=job, data__end_reason="stalled").get().message
    assert "no progress for 61" in said and "before the first training step (loading)" in said
    assert attempts_end_stalled() == 0, "ended once"


def test_the_bound_grows_with_the_slowest_step(running, settings) -> None:
    settings.TRAINHUB_STALL_SECONDS, settings.TRAINHUB_STALL_STEPS = 600, 20
    job, attempt, executor = running
    executor.send("metrics", step=1)
    JobAttempt.objects.filter(pk=attempt.pk).update(step_at=timezone.now() - timedelta(seconds=50))
    executor.send("metrics", step=2)  # a 50 s step: the bound is 20 x 50 = 1,000 s
    assert 999 < stall_bound_seconds(fresh(attempt)) < 1010

    _silent_for(attempt, 900)
    assert attempts_end_stalled() == 0
    _silent_for(attempt, 1100)
    assert attempts_end_stalled() == 1
    said = JobEvent.objects.filter(job=job, data__end_reason="stalled").get().message
    assert "after step 2" in said


def test_jobs_not_training_and_attempts_never_heard_from_are_left_to_the_lease(
    make_job, running, settings
) -> None:
    settings.TRAINHUB_STALL_SECONDS = 600
    job, attempt, _ = running
    _silent_for(attempt, 10_000)
    for status in (S.FINALIZING, S.CANCELLING, S.PAUSED):  # checking its adapter, stopping
        TrainingJob.objects.filter(pk=job.pk).update(status=status)
        assert attempts_end_stalled() == 0
    quiet = make_job()
    attempt_start(job=quiet, target="local")  # no event at all yet: progress_at is unset
    assert attempts_end_stalled() == 0
    assert JobAttempt.objects.filter(ended_at__isnull=False).count() == 0


def test_a_node_is_told_to_stop_the_stalled_run_it_still_runs(claimed, settings) -> None:
    settings.TRAINHUB_STALL_SECONDS = 600
    executor = Executor(claimed.job)
    executor.send("status", "running", status="running")
    executor.send("metrics", step=3)
    _silent_for(claimed.attempt, 700)
    assert attempts_end_stalled() == 1

    job_id = claimed.job.public_id
    stop = {"job_id": job_id, "attempt": 1, "mode": "cancel"}
    assert nodes.node_stop_requests(node=claimed.node, running=(job_id, 1)) == [stop]
    assert fresh(claimed.job).status == S.QUEUED
