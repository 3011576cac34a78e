"""Attempts: start, the one-live-attempt guard, executor reports, leases, cancel and retry."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from jobs.errors import Conflict, InvalidTransition
from jobs.models import JobAttempt, JobEvent, TrainingJob
from jobs.services.core.attempts import attempt_record_events, attempt_start, attempts_expire_leases
from jobs.services.core.events import MAX_EVENTS_PER_BATCH
from jobs.services.core.jobs import job_cancel, job_retry
from jobs.states import JobStatus
from tests.support.factories import JobAttemptFactory
from trainhub_contract import celery_conf as cc

S = JobStatus


def _status(event_status: str, seq: int, **data: object) -> dict:
    return {
        "seq": seq,
        "type": "status",
        "message": event_status,
        "data": {"status": event_status, **data},
    }


def _expire(attempt: JobAttempt) -> None:
    JobAttempt.objects.filter(pk=attempt.pk).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1)
    )


def _fresh(obj):
    obj.refresh_from_db()
    return obj


@pytest.fixture
def queued(make_job) -> TrainingJob:
    job = make_job()
    assert job.status == S.QUEUED
    return job


@pytest.fixture
def running(queued) -> tuple[TrainingJob, JobAttempt]:
    # No node: who may report for a node's attempt is the events endpoint's to decide (the
    # attempt's report token, tests/api/test_api_nodes.py); the service stores what it gets.
    attempt = attempt_start(job=queued, target="local")
    attempt_record_events(job_id=queued.public_id, attempt_number=1, events=[_status("running", 0)])
    return _fresh(queued), attempt


# --- start and the one-live-attempt guard -----------------------------------------------------


def test_attempt_start_creates_attempt_one_with_a_lease(queued) -> None:
    before = timezone.now()
    attempt = attempt_start(job=queued, target="local", node_name="node-a")

    assert attempt.number == 1 and attempt.ended_at is None
    assert attempt.node_name == "node-a" and attempt.target == "local"
    ttl = timedelta(seconds=settings.TRAINHUB_LEASE_TTL_SECONDS)
    assert before + ttl <= attempt.lease_expires_at <= timezone.now() + ttl
    assert _fresh(queued).status == S.PROVISIONING
    last = JobEvent.objects.filter(job=queued).latest("number")
    assert last.data == {"status": "provisioning", "attempt": 1, "target": "local"}


def test_attempt_start_refuses_a_job_that_is_not_queued(queued) -> None:
    attempt_start(job=queued, target="local")
    with pytest.raises(InvalidTransition):
        attempt_start(job=queued, target="local")
    assert JobAttempt.objects.filter(job=queued).count() == 1


def test_partial_unique_constraint_forbids_two_live_attempts(queued) -> None:
    first = attempt_start(job=queued, target="local")
    with pytest.raises(IntegrityError), transaction.atomic():
        JobAttemptFactory(job=queued, number=2, target="local")
    # Once the first has ended, the next live attempt is fine.
    JobAttempt.objects.filter(pk=first.pk).update(ended_at=timezone.now(), end_reason="worker_lost")
    JobAttemptFactory(job=queued, number=2, target="local")
    with pytest.raises(IntegrityError), transaction.atomic():  # numbers stay unique too
        JobAttemptFactory(job=queued, number=2, target="local", ended_at=timezone.now())


# --- executor events --------------------------------------------------------------------------


def test_running_report_moves_the_job_to_running(queued) -> None:
    attempt = attempt_start(job=queued, target="local")
    JobAttempt.objects.filter(pk=attempt.pk).update(
        lease_expires_at=timezone.now() + timedelta(seconds=5)
    )

    stored = attempt_record_events(
        job_id=queued.public_id,
        attempt_number=1,
        events=[{"seq": 0, "type": "log", "message": "loading model"}, _status("running", 1)],
    )

    assert stored == 2
    queued.refresh_from_db()
    attempt.refresh_from_db()
    assert queued.status == S.RUNNING and queued.started_at is not None
    assert attempt.started_at is not None
    assert attempt.lease_expires_at > timezone.now() + timedelta(seconds=60), (
        "a report renews the lease"
    )
    executor = JobEvent.objects.filter(job=queued, attempt=1).order_by("number")
    assert [(e.seq, e.type) for e in executor] == [(0, "log"), (1, "status")]
    numbers = list(
        JobEvent.objects.filter(job=queued).order_by("number").values_list("number", flat=True)
    )
    assert numbers == list(range(1, len(numbers) + 1)), "public numbers are gap-free"


def test_metrics_update_latest_metrics(running) -> None:
    job, _ = running
    metrics = [
        {"seq": 1, "type": "metrics", "data": {"step": 1, "total_steps": 10, "loss": 2.5}},
        {"seq": 2, "type": "metrics",
         "data": {"step": 2, "total_steps": 10, "loss": 2.0, "lr": 1e-4, "trained_tokens": 512, "junk": 1}},
    ]  # fmt: skip
    assert attempt_record_events(job_id=job.public_id, attempt_number=1, events=metrics) == 2
    job.refresh_from_db()
    assert job.latest_metrics == {"step": 2, "total_steps": 10, "loss": 2.0, "lr": 1e-4}
    assert job.trained_tokens == 512


def test_succeeded_report_moves_to_finalizing_and_queues_ingest(
    running, django_capture_on_commit_callbacks, sent
) -> None:
    job, attempt = running
    with django_capture_on_commit_callbacks(execute=True):
        attempt_record_events(
            job_id=job.public_id,
            attempt_number=1,
            events=[_status("succeeded", 1, sha256="ab" * 32)],
        )
    assert _fresh(job).status == S.FINALIZING
    assert sent.named(cc.INGEST_ARTIFACT) == [[attempt.pk, "ab" * 32]]
    assert _fresh(attempt).ended_at is None, "the attempt ends when the artifact is verified"


@pytest.mark.parametrize(
    "event",
    [
        {
            "seq": 1,
            "type": "error",
            "level": "error",
            "message": "CUDA out of memory",
            "data": {"code": "oom"},
        },
        {
            "seq": 1,
            "type": "status",
            "message": "CUDA out of memory",
            "data": {"status": "failed", "code": "oom"},
        },
    ],
    ids=["error-event", "failed-status"],
)
def test_oom_fails_the_job_with_code_oom(running, event) -> None:
    job, attempt = running
    attempt_record_events(job_id=job.public_id, attempt_number=1, events=[event])
    job.refresh_from_db()
    attempt.refresh_from_db()
    assert job.status == S.FAILED
    assert job.error_code == "oom"
    assert "CUDA out of memory" in job.error_message
    assert attempt.end_reason == "oom" and attempt.ended_at is not None
    assert JobAttempt.objects.filter(job=job).count() == 1, "oom is permanent: no new attempt"


def test_unknown_error_code_fails_as_internal_error(running) -> None:
    job, _ = running
    attempt_record_events(
        job_id=job.public_id, attempt_number=1,
        events=[{"seq": 1, "type": "error", "message": "boom", "data": {"code": "no-such-code"}}],
    )  # fmt: skip
    job.refresh_from_db()
    assert (job.status, job.error_code) == (S.FAILED, "internal_error")


def test_resent_events_are_stored_once(running) -> None:
    job, _ = running
    batch = [
        {"seq": 5, "type": "log", "message": "step 5"},
        {"seq": 6, "type": "log", "message": "step 6"},
    ]
    assert attempt_record_events(job_id=job.public_id, attempt_number=1, events=batch) == 2
    counter = _fresh(job).event_counter
    assert attempt_record_events(job_id=job.public_id, attempt_number=1, events=batch) == 0
    # A partly new batch stores only the new one; a duplicate inside one batch counts once.
    again = [
        *batch,
        {"seq": 7, "type": "log", "message": "step 7"},
        {"seq": 7, "type": "log", "message": "dup"},
    ]
    assert attempt_record_events(job_id=job.public_id, attempt_number=1, events=again) == 1
    assert _fresh(job).event_counter == counter + 1
    seqs = list(
        JobEvent.objects.filter(job=job, attempt=1).order_by("number").values_list("seq", flat=True)
    )
    assert seqs == [0, 5, 6, 7]


def test_resent_failure_is_not_applied_twice(running) -> None:
    job, _ = running
    fail = [{"seq": 1, "type": "error", "message": "oom", "data": {"code": "oom"}}]
    attempt_record_events(job_id=job.public_id, attempt_number=1, events=fail)
    events = JobEvent.objects.filter(job=job).count()
    assert attempt_record_events(job_id=job.public_id, attempt_number=1, events=fail) == 0
    assert JobEvent.objects.filter(job=job).count() == events


def test_events_of_an_outdated_or_ended_attempt_are_dropped(running) -> None:
    job, attempt = running
    snapshot = (S.RUNNING, _fresh(job).event_counter)

    # A number that is not the live attempt's.
    for number in (0, 2, 99):
        assert (
            attempt_record_events(
                job_id=job.public_id,
                attempt_number=number,
                events=[_status("succeeded", 9), _status("cancelled", 10)],
            )
            == 0
        )
    job.refresh_from_db()
    assert (job.status, job.event_counter) == snapshot

    # The live attempt is lost; the job goes back to the queue and attempt 2 starts.
    _expire(attempt)
    assert attempts_expire_leases() == 1
    attempt_start(job=job, target="local")
    counter = _fresh(job).event_counter
    late = [
        _status("running", 20),
        {"seq": 21, "type": "error", "message": "x", "data": {"code": "oom"}},
    ]
    assert attempt_record_events(job_id=job.public_id, attempt_number=1, events=late) == 0
    job.refresh_from_db()
    assert (job.status, job.event_counter) == (S.PROVISIONING, counter)
    assert not JobEvent.objects.filter(job=job, attempt=1, seq__in=[20, 21]).exists()

    assert attempt_record_events(job_id="ftjob-unknown", attempt_number=1, events=late) == 0


def test_malformed_events_are_skipped(running) -> None:
    job, _ = running
    bad = [
        "not a dict",
        None,
        {"type": "log", "message": "no seq"},
        {"seq": "3", "type": "log"},
        {"seq": True, "type": "log"},
        {"seq": -1, "type": "log"},
        {"seq": 4, "type": "no-such-type"},
        {"seq": 5, "type": "log", "level": "shouting"},
        {"seq": 6, "type": "metrics", "data": ["not", "a", "mapping"]},
    ]
    good = {"seq": 7, "type": "log", "message": "x" * 10_000}
    assert attempt_record_events(job_id=job.public_id, attempt_number=1, events=[*bad, good]) == 1
    stored = JobEvent.objects.get(job=job, attempt=1, seq=7)
    assert len(stored.message) == 4000
    assert _fresh(job).status == S.RUNNING


def test_a_flood_of_events_is_capped_but_its_final_status_still_applies(running) -> None:
    """An executor (a node or rented host) may be hostile: one batch stores at most
    MAX_EVENTS_PER_BATCH routine events, and never drops the status that ends the attempt."""
    job, attempt = running
    flood = [{"seq": i, "type": "log", "message": f"spam {i}"} for i in range(1, 2001)]
    failed = {"seq": 5000, "type": "error", "message": "OOM", "data": {"code": "oom"}}

    stored = attempt_record_events(job_id=job.public_id, attempt_number=1, events=[*flood, failed])

    assert stored == MAX_EVENTS_PER_BATCH + 1
    assert JobEvent.objects.filter(job=job, attempt=1, type="log").count() == MAX_EVENTS_PER_BATCH
    assert (_fresh(job).status, job.error_code) == (S.FAILED, "oom")
    assert _fresh(attempt).ended_at is not None


# --- leases -----------------------------------------------------------------------------------


def test_expired_lease_requeues_then_fails_after_max_attempts(make_job) -> None:
    job = make_job(max_attempts=2)
    live_lease = attempt_start(job=make_job(), target="local")  # another job, lease still valid

    first = attempt_start(job=job, target="local")
    _expire(first)
    assert attempts_expire_leases() == 1
    first.refresh_from_db()
    assert first.end_reason == "lease_expired" and first.ended_at is not None
    job.refresh_from_db()
    assert job.status == S.QUEUED and job.error_code == ""
    assert "1 attempt(s) left" in JobEvent.objects.filter(job=job).latest("number").message

    second = attempt_start(job=job, target="local")
    assert second.number == 2
    _expire(second)
    assert attempts_expire_leases() == 1
    job.refresh_from_db()
    assert job.status == S.FAILED
    assert job.error_code == "lease_expired"
    assert "after 2 attempt(s)" in job.error_message
    assert attempts_expire_leases() == 0, "an ended attempt never ends twice"
    assert _fresh(live_lease).ended_at is None


def test_cancelling_job_whose_lease_expires_is_cancelled(queued, sent) -> None:
    attempt = attempt_start(job=queued, target="local")
    job_cancel(job=queued)
    assert _fresh(queued).status == S.CANCELLING
    _expire(attempt)
    assert attempts_expire_leases() == 1
    assert _fresh(queued).status == S.CANCELLED
    assert _fresh(attempt).end_reason == "lease_expired"


def test_retry_after_failure_restarts_the_budget(
    make_job, django_capture_on_commit_callbacks, sent
) -> None:
    job = make_job(max_attempts=1)
    _expire(attempt_start(job=job, target="local"))
    attempts_expire_leases()
    job.refresh_from_db()
    assert (job.status, job.error_code) == (S.FAILED, "lease_expired")

    with django_capture_on_commit_callbacks(execute=True):
        job_retry(job=job)
    job.refresh_from_db()
    assert job.status == S.QUEUED
    assert (job.error_code, job.error_message, job.finished_at) == ("", "", None)
    assert job.attempt_budget_start == 1
    assert sent.calls == [(cc.DISPATCH, [])], "a local job goes to the node dispatcher"

    second = attempt_start(job=job, target="local")
    assert second.number == 2, "attempt numbers continue across retries"
    _expire(second)
    attempts_expire_leases()
    job.refresh_from_db()
    assert job.status == S.FAILED and "after 1 attempt(s)" in job.error_message


def test_retry_budget_counts_from_the_retry(make_job, sent) -> None:
    job = make_job(max_attempts=2)
    for _ in range(2):
        _expire(attempt_start(job=job, target="local"))
        attempts_expire_leases()
    assert _fresh(job).status == S.FAILED
    job_retry(job=job)
    third = attempt_start(job=job, target="local")
    _expire(third)
    attempts_expire_leases()
    assert _fresh(job).status == S.QUEUED, "attempt 3 is the first of the new budget of 2"
    _expire(attempt_start(job=job, target="local"))
    attempts_expire_leases()
    job.refresh_from_db()
    assert job.status == S.FAILED and "after 2 attempt(s)" in job.error_message


def test_only_failed_or_cancelled_jobs_can_be_retried(queued) -> None:
    with pytest.raises(Conflict) as raised:
        job_retry(job=queued)
    assert raised.value.code == "job_not_retryable"
    assert _fresh(queued).status == S.QUEUED


# --- cancel -----------------------------------------------------------------------------------


def test_cancel_with_a_live_attempt_waits_for_the_executor(
    running, django_capture_on_commit_callbacks, sent
) -> None:
    job, attempt = running
    with django_capture_on_commit_callbacks(execute=True):
        job_cancel(job=job)
    assert _fresh(job).status == S.CANCELLING, "not cancelled until the stop is confirmed"
    assert sent.named(cc.STOP_MACHINES) == [[job.pk]]

    # A late progress report does not undo the cancel.
    attempt_record_events(job_id=job.public_id, attempt_number=1, events=[_status("running", 1)])
    assert _fresh(job).status == S.CANCELLING

    attempt_record_events(job_id=job.public_id, attempt_number=1, events=[_status("cancelled", 2)])
    job.refresh_from_db()
    assert job.status == S.CANCELLED and job.finished_at is not None
    assert _fresh(attempt).end_reason == "cancelled"
    statuses = [
        e.data["status"]
        for e in JobEvent.objects.filter(job=job, attempt=0, data__has_key="status").order_by(
            "number"
        )
    ]
    assert statuses[-2:] == ["cancelling", "cancelled"]


def test_cancel_without_a_live_attempt_is_immediate(
    queued, django_capture_on_commit_callbacks, sent
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        job_cancel(job=queued)
    assert _fresh(queued).status == S.CANCELLED
    assert [name for name, _ in sent.calls] == [cc.NOTIFY_JOB]  # nothing to stop
    with pytest.raises(Conflict) as raised:
        job_cancel(job=queued)
    assert raised.value.code == "job_not_cancellable"
