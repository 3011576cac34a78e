"""The status table: every (from, to) pair through the one status writer, on PostgreSQL and SQLite."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from django.db import connection
from django.utils import timezone

from jobs.errors import InvalidTransition
from jobs.models import JobEvent, TrainingJob
from jobs.services.core.jobs import job_transition
from jobs.states import ALLOWED_FROM, LIVE, TERMINAL, JobStatus, can_transition

S = JobStatus
ROOT = Path(__file__).resolve().parents[4]
PAIRS = list(itertools.product(JobStatus, JobStatus))


def _kind(src: JobStatus, dst: JobStatus) -> str:
    if src == dst:
        return "repeat"
    return "allowed" if src in ALLOWED_FROM[dst] else "illegal"


def _status_events(job: TrainingJob) -> list[JobEvent]:
    return list(JobEvent.objects.filter(job=job, type="status").order_by("number"))


@pytest.fixture
def job(make_job) -> TrainingJob:
    return make_job()


def _put_in(job: TrainingJob, status: JobStatus) -> TrainingJob:
    fields: dict[str, object] = {"status": status}
    if status == S.FAILED:
        fields.update(error_code="oom", error_message="out of memory", finished_at=timezone.now())
    elif status in TERMINAL:
        fields["finished_at"] = timezone.now()
    TrainingJob.objects.filter(pk=job.pk).update(**fields)
    return TrainingJob.objects.get(pk=job.pk)


@pytest.mark.parametrize(("src", "dst"), PAIRS, ids=[f"{a}->{b}" for a, b in PAIRS])
def test_transition_table(job, src: JobStatus, dst: JobStatus) -> None:
    job = _put_in(job, src)
    before = _status_events(job)
    counter = job.event_counter
    kind = _kind(src, dst)

    if kind == "illegal":
        with pytest.raises(InvalidTransition) as raised:
            job_transition(job=job, to=dst, message="x")
        assert raised.value.http_status == 409
        assert raised.value.code == "invalid_status_transition"
        assert (raised.value.current, raised.value.target) == (src, dst)
        assert f"'{src}'" in raised.value.message and f"'{dst}'" in raised.value.message
    else:
        moved = job_transition(job=job, to=dst, message="moved by the table test")
        assert moved is (kind == "allowed")

    stored = TrainingJob.objects.get(pk=job.pk)
    after = _status_events(job)
    if kind != "allowed":
        assert stored.status == src
        assert after == before and stored.event_counter == counter
        return

    assert stored.status == dst
    assert job.status == dst  # the caller's object follows
    assert len(after) == len(before) + 1
    event = after[-1]
    assert event.data["status"] == dst
    assert event.number == counter + 1 and stored.event_counter == counter + 1
    assert event.attempt == 0
    assert (stored.finished_at is not None) is (dst in TERMINAL)
    if dst == S.FAILED:
        assert stored.error_code == "internal_error"  # no code given: never blank
        assert event.level == "error"
    if dst == S.QUEUED:  # a retry clears the previous failure
        assert (stored.error_code, stored.error_message) == ("", "")
    if dst == S.RUNNING:
        assert stored.started_at is not None


def test_table_matches_design() -> None:
    """DESIGN's status table, written out once more; ALLOWED_FROM must agree with it."""
    design = {
        (S.VALIDATING_FILES, S.QUEUED),
        (S.QUEUED, S.PROVISIONING),
        (S.PROVISIONING, S.RUNNING),
        (S.PROVISIONING, S.QUEUED),
        (S.RUNNING, S.QUEUED),
        (S.RUNNING, S.FINALIZING),
        (S.FINALIZING, S.SUCCEEDED),
        # pause: from an attempt that is starting or training; resume queues it again; a run
        # that finished before the pause reached it still delivers its adapter
        (S.PROVISIONING, S.PAUSED),
        (S.RUNNING, S.PAUSED),
        (S.PAUSED, S.QUEUED),
        (S.PAUSED, S.FINALIZING),
        *((s, S.FAILED) for s in LIVE),
        *((s, S.CANCELLING) for s in LIVE - {S.CANCELLING}),
        (S.CANCELLING, S.CANCELLED),
        (S.VALIDATING_FILES, S.CANCELLED),
        (S.FAILED, S.QUEUED),
        (S.CANCELLED, S.QUEUED),
    }
    allowed = {(a, b) for a, b in PAIRS if can_transition(a, b)}
    assert allowed - design == set()
    assert design - allowed == set()
    assert not any(can_transition(t, s) for t in TERMINAL for s in set(S) - {S.QUEUED})


def test_failed_keeps_the_given_code_and_message(job) -> None:
    assert job_transition(job=job, to=S.FAILED, error_code="oom", message="CUDA out of memory")
    job.refresh_from_db()
    assert (job.error_code, job.error_message) == ("oom", "CUDA out of memory")
    assert _status_events(job)[-1].data == {"status": "failed", "code": "oom"}


@pytest.mark.django_db(transaction=True)
def test_concurrent_queued_to_provisioning_has_one_winner(make_job) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("row-lock race is checked on PostgreSQL")
    job = make_job()
    assert job.status == S.QUEUED
    barrier = threading.Barrier(2)
    results: list[object] = []

    def race() -> None:
        try:
            mine = TrainingJob.objects.get(pk=job.pk)
            barrier.wait(timeout=10)
            results.append(job_transition(job=mine, to=S.PROVISIONING, message="race"))
        except InvalidTransition as exc:
            results.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=race) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)

    assert len(results) == 2
    assert results.count(True) == 1, results
    loser = next(r for r in results if r is not True)
    assert loser is False or isinstance(loser, InvalidTransition)
    job.refresh_from_db()
    assert job.status == S.PROVISIONING
    events = JobEvent.objects.filter(job=job, type="status", data__status="provisioning")
    assert events.count() == 1
    numbers = list(
        JobEvent.objects.filter(job=job).order_by("number").values_list("number", flat=True)
    )
    assert numbers == list(range(1, len(numbers) + 1))


def test_transition_table_on_sqlite(tmp_path: Path) -> None:
    """The same table on the embedded default (SQLite, WAL, immediate transactions)."""
    env = {
        **os.environ,
        "DATABASE_URL": f"sqlite:///{tmp_path / 't.sqlite3'}",
        "TRAINHUB_VAR_DIR": str(tmp_path),
    }
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "tests/jobs/services/core/test_status.py",
            "-k",
            "not sqlite",
            "-q",
            "-p",
            "no:cacheprovider",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    assert "passed" in output
    assert "failed" not in output.splitlines()[-1]
