"""End to end through a REAL Celery worker process on the real broker and the test database:
upload → on_commit → send_task → worker validate_file → the waiting job is queued. (Executor
events no longer travel through the broker: test_node_client.py posts them over real HTTP.)"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from jobs.models import JobAttempt, JobEvent, TrainingFile, TrainingJob
from jobs.services.core.attempts import attempt_start
from tests.support.api import upload
from tests.support.processes import database_url, quiesce
from trainhub_contract import celery_conf as cc

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parents[2]
DEADLINE_S = 30
WORKER_NAME = f"pytest-{os.getpid()}"


class Worker:
    def __init__(self, proc: subprocess.Popen, log: Path, storage: Path) -> None:
        self.proc, self.log, self.storage = proc, log, storage

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]

    def wait_for(self, what: str, check: Callable[[], bool]) -> None:
        """Poll the database until ``check()`` holds; fail with the worker's log otherwise."""
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline:
            if check():
                return
            if self.proc.poll() is not None:
                pytest.fail(
                    f"the worker exited ({self.proc.returncode}) before {what}:\n{self.tail()}"
                )
            time.sleep(0.1)
        pytest.fail(
            f"timed out after {DEADLINE_S} s waiting for {what}; worker log:\n{self.tail()}"
        )


@pytest.fixture(scope="module")
def worker(django_db_setup, django_db_blocker, tmp_path_factory) -> Iterator[Worker]:
    if connection.vendor != "postgresql":
        pytest.skip("a worker process needs a shared server database (PostgreSQL)")
    from trainhub.celery import app

    base = tmp_path_factory.mktemp("worker")
    storage = base / "storage"
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "trainhub.settings",
        "DATABASE_URL": database_url(connection.settings_dict),  # the pytest test database
        "CELERY_BROKER_URL": settings.CELERY_BROKER_URL,
        "TRAINHUB_STORAGE_DIR": str(storage),
        "TRAINHUB_VAR_DIR": str(base / "var"),
        "TRAINHUB_LOG_LEVEL": "INFO",
    }
    with app.connection_for_write() as conn:  # leftovers of earlier runs must not be consumed
        conn.default_channel.queue_purge(cc.DEFAULT_QUEUE)
    log = base / "worker.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "trainhub", "worker", "-Q", cc.DEFAULT_QUEUE,
             "-c", "1", "-P", "solo", "--without-heartbeat", "--without-gossip", "--without-mingle",
             "-l", "info", "-n", f"{WORKER_NAME}@%h"],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        yield Worker(proc, log, storage)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@pytest.fixture(autouse=True)
def _quiet_worker_before_flush(transactional_db, worker) -> Iterator[None]:
    yield
    quiesce(f"{WORKER_NAME}@{socket.gethostname()}", cc.DEFAULT_QUEUE)


@pytest.fixture
def shared_storage(worker, settings) -> None:
    settings.TRAINHUB_STORAGE_DIR = worker.storage  # the worker reads what the API stored


def _send_expire_leases() -> None:
    from trainhub.celery import app

    app.send_task(cc.EXPIRE_LEASES)


class RowLock:
    """Holds ``SELECT … FOR UPDATE`` on a job row from another connection until released."""

    def __init__(self, job_pk: int) -> None:
        self.job_pk = job_pk
        self.locked, self.release = threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self._hold, daemon=True)

    def _hold(self) -> None:
        try:
            with transaction.atomic():
                TrainingJob.objects.select_for_update().filter(pk=self.job_pk).values_list(
                    "pk"
                ).get()
                self.locked.set()
                self.release.wait(DEADLINE_S)
        finally:
            connection.close()

    def __enter__(self) -> RowLock:
        self.thread.start()
        assert self.locked.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self.thread.join(10)


def test_job_waiting_for_validation_is_queued_by_the_worker(
    worker, shared_storage, api, make_job, demo_dataset
) -> None:
    # The worker takes one message at a time, in order: ending an expired attempt of a job whose
    # row we hold locked keeps it busy, so the upload's validation surely runs after the job
    # exists.
    blocker = make_job()
    stuck = attempt_start(job=blocker, target="local")
    JobAttempt.objects.filter(pk=stuck.pk).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1)
    )

    with RowLock(blocker.pk):
        _send_expire_leases()
        uploaded = upload(api, demo_dataset)
        assert uploaded.status_code == 201, uploaded.content
        file_id = uploaded.json()["id"]

        created = api.post(
            "/api/v1/jobs/", {"model": "acme/tiny-llama", "training_file": file_id}, format="json"
        )
        assert created.status_code == 201, created.content
        assert created.json()["status"] == "validating_files"
        time.sleep(0.3)  # give a wrongly ordered worker the chance to show itself
        assert TrainingFile.objects.get(public_id=file_id).status == "uploaded"

    job = TrainingJob.objects.get(public_id=created.json()["id"])
    worker.wait_for(
        "the job to be queued", lambda: TrainingJob.objects.get(pk=job.pk).status == "queued"
    )

    record = TrainingFile.objects.get(public_id=file_id)
    assert record.status == "processed" and record.example_count > 0
    assert JobAttempt.objects.get(pk=stuck.pk).end_reason == "lease_expired", "ran first"
    statuses = list(
        JobEvent.objects.filter(job=job, type="status")
        .order_by("number")
        .values_list("data__status", flat=True)
    )
    assert statuses == ["validating_files", "queued"]
    assert api.get(f"/api/v1/jobs/{job.public_id}/").json()["status"] == "queued"
