"""A ``runpod-pod`` job end to end: the real control worker launches a pod on a fake RunPod
(REST v2 over loopback HTTP) whose "machine" is a real OpenSSH server on loopback; the worker
starts the real executor over SSH on the tiny model, tails its events file, ingests the bundle
the executor uploaded to the public transfer URL, and deletes the pod.

The test process plays beat (it sends the poll task) and RunPod's image (it appends each pod's
``PUBLIC_KEY`` to the sshd's authorized_keys, as RunPod's images do at boot)."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from jobs.models import JobAttempt, JobEvent, TrainingJob
from jobs.services.accounts.projects import credential_create
from tests.e2e.conftest import Process, submit_tiny_job, wait_for
from tests.e2e.test_fleet import TRAIN_TIMEOUT
from tests.support.api import download
from tests.support.fakes.runpod_api import API_KEY, FakeRunpod
from trainhub_contract import celery_conf as cc
from trainhub_contract.bundle import verify_bundle

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]
TARGET = "runpod-pod"


@pytest.fixture(scope="module")
def fake_runpod(sshd) -> Iterator[FakeRunpod]:
    with FakeRunpod(ssh_address=(sshd.host, sshd.port), pod_ready_seconds=0.5) as fake:
        yield fake


@pytest.fixture(scope="module")
def control_worker_env(fake_runpod, live_server, shared_dir) -> dict[str, str]:
    return {
        "RUNPOD_REST_URL": fake_runpod.url,
        "TRAINHUB_PUBLIC_URL": live_server.url,  # the rented machine fetches and uploads here
        "TRAINHUB_REMOTE_PYTHON": sys.executable,
        "TRAINHUB_REMOTE_DIR": str(shared_dir / "remote"),
    }


@pytest.fixture
def pod_plane(plane, settings, control_worker_env, project) -> Process:
    for name, value in control_worker_env.items():
        setattr(settings, name, value)
    credential_create(project=project, provider="runpod", name="main", secrets={"api_key": API_KEY})
    return plane


@pytest.fixture(scope="module", autouse=True)
def _machines_die_with_their_pods(control_worker_env) -> Iterator[None]:
    yield
    _kill_executors(Path(control_worker_env["TRAINHUB_REMOTE_DIR"]).glob("*"))


def _kill_executors(attempt_dirs: Iterable[Path]) -> None:
    """What deleting a pod does to its processes; the "pod" here is this machine's sshd."""
    for directory in attempt_dirs:
        with contextlib.suppress(OSError, ValueError):
            os.killpg(int((directory / "pid").read_text()), signal.SIGKILL)


def _beat(fake: FakeRunpod, sshd: Any) -> None:
    """One tick: RunPod's image installs the pods' keys, and a deleted pod's processes die;
    beat asks for a poll (every attempt due now, so the test does not wait out the 15-30 s
    poll intervals)."""
    from trainhub.celery import app

    keys = sshd.authorized_keys.read_text()
    for pod in fake.live_pods():
        key = (pod.get("env") or {}).get("PUBLIC_KEY", "")
        if key and key not in keys:
            with sshd.authorized_keys.open("a") as out:
                out.write(key + "\n")
    remote = Path(settings.TRAINHUB_REMOTE_DIR)
    gone = [p for p in fake.pods(include_terminated=True) if p["status"] == "TERMINATED"]
    _kill_executors(remote / p["name"].removeprefix("trainhub-") for p in gone)
    JobAttempt.objects.filter(ended_at__isnull=True).update(next_poll_at=None)
    app.send_task(cc.POLL_TARGET, args=[TARGET])


def _run_until(what: str, check: Any, fake: FakeRunpod, sshd: Any, plane: Process) -> None:
    def tick() -> object:
        _beat(fake, sshd)
        time.sleep(0.5)
        return check()

    wait_for(what, tick, TRAIN_TIMEOUT, plane)


def _statuses(job: TrainingJob) -> list[str]:
    rows = JobEvent.objects.filter(job=job, type="status", attempt=0).order_by("number")
    return [e.data["status"] for e in rows if "status" in e.data]


def test_a_pod_job_trains_over_ssh_and_the_pod_is_deleted(
    pod_plane, api, demo_dataset, tiny_model_dir, fake_runpod, sshd
) -> None:
    job_id = submit_tiny_job(api, tiny_model_dir, demo_dataset, target=TARGET)
    job = TrainingJob.objects.get(public_id=job_id)

    _run_until(
        "the pod job to end",
        lambda: TrainingJob.objects.get(pk=job.pk).status in ("succeeded", "failed", "cancelled"),
        fake_runpod,
        sshd,
        pod_plane,
    )
    job.refresh_from_db()
    assert job.status == "succeeded", (job.error_code, job.error_message)
    assert _statuses(job) == [
        "validating_files", "queued", "provisioning", "running", "finalizing", "succeeded"
    ]  # fmt: skip
    attempt = JobAttempt.objects.get(job=job)
    assert attempt.end_reason == "succeeded"
    assert attempt.ssh_host_key == sshd.host_key, "trusted on first use and stored"
    assert (attempt.ssh_host, attempt.ssh_port) == (sshd.host, sshd.port)
    assert attempt.ssh_private_key_ciphertext and "PRIVATE KEY" not in (
        attempt.ssh_private_key_ciphertext
    )
    assert JobEvent.objects.filter(job=job, attempt=1, type="metrics").exists()

    listed = api.get(f"/api/v1/jobs/{job_id}/artifacts/").json()["data"]
    got = download(api, listed[0]["id"])
    assert verify_bundle([got.body]).sha256 == listed[0]["sha256"]

    # Exactly one pod was rented for the attempt, and it is gone once the attempt ended.
    assert fake_runpod.created_names().count(f"trainhub-{job_id}-a1") == 1
    wait_for("the pod to be deleted", lambda: not _pods_of(fake_runpod, job_id), 30, pod_plane)


def test_cancel_while_training_deletes_the_pod_then_cancels(
    pod_plane, api, demo_dataset, tiny_model_dir, fake_runpod, sshd
) -> None:
    job_id = submit_tiny_job(
        api,
        tiny_model_dir,
        demo_dataset,
        target=TARGET,
        hyperparameters={"n_epochs": 50, "batch_size": 1, "max_seq_length": 128},
    )
    job = TrainingJob.objects.get(public_id=job_id)
    _run_until(
        "training to start",
        lambda: TrainingJob.objects.get(pk=job.pk).status == "running",
        fake_runpod,
        sshd,
        pod_plane,
    )
    assert api.post(f"/api/v1/jobs/{job_id}/cancel/").status_code == 200
    _run_until(
        "the cancel to be confirmed",
        lambda: TrainingJob.objects.get(pk=job.pk).status == "cancelled",
        fake_runpod,
        sshd,
        pod_plane,
    )
    assert not _pods_of(fake_runpod, job_id)
    _beat(fake_runpod, sshd)  # the deleted pod's processes die with it
    assert JobAttempt.objects.get(job=job).end_reason == "cancelled"
    assert _statuses(job)[-2:] == ["cancelling", "cancelled"]


def _pods_of(fake: FakeRunpod, job_id: str) -> list[dict[str, Any]]:
    return [p for p in fake.live_pods() if p["name"].startswith(f"trainhub-{job_id}-")]
