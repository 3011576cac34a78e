"""An ``aws`` job end to end: the real control worker places the job on an EC2 offer and
launches the instance on moto's EC2 (real HTTP, the session's moto server); the instance's
"machine" is the loopback OpenSSH server. The worker starts the real executor over SSH on the
tiny model, tails its events, ingests and verifies the bundle the executor uploaded, and
terminates the instance.

Between the worker and moto sits a small pass-through that only rewrites the public IP EC2
reports (moto makes one up) to 127.0.0.1; the SSH port and login are settings
(TRAINHUB_AWS_SSH_PORT, TRAINHUB_AWS_SSH_USER) pointed at the loopback sshd. The test process
plays beat (it sends the poll task) and the AMI's boot (it installs the key pair's public key
in the sshd's authorized_keys, as cloud-init does with the instance's key pair)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import boto3
import pytest
from django.conf import settings

from gpu_worker import celery_conf as cc
from gpu_worker.bundle import verify_bundle
from jobs.models import JobAttempt, JobEvent, TrainingJob
from jobs.services.projects import credential_create
from tests.e2e.conftest import Process, submit_tiny_job, wait_for
from tests.e2e.test_fleet import TRAIN_TIMEOUT
from tests.jobs._api import download

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]
TARGET = "aws"
REGION = "ap-southeast-2"  # this module's alone: moto's state lives as long as the session
SECRETS = {"access_key_id": "AKIDTRAINHUBTEST", "secret_access_key": "trainhub-test-secret"}
_IP = re.compile(rb"<ipAddress>[^<]*</ipAddress>")


class LoopbackFront(ThreadingHTTPServer):
    """EC2's Query API passed through to moto, with every instance's public IP made loopback."""

    def __init__(self, upstream: str) -> None:
        super().__init__(("127.0.0.1", 0), _Forward)
        self.upstream = upstream

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Forward(BaseHTTPRequestHandler):
    server: LoopbackFront

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        headers = {
            k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")
        }
        url = self.server.upstream + self.path  # moto's loopback endpoint
        request = urllib.request.Request(url, body, headers, method="POST")  # noqa: S310
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:  # noqa: S310
                status, data = answer.status, answer.read()
        except urllib.error.HTTPError as refusal:
            status, data = refusal.code, refusal.read()
        data = _IP.sub(b"<ipAddress>127.0.0.1</ipAddress>", data)
        self.send_response(status)
        self.send_header("Content-Type", "text/xml")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def ec2_front(s3_endpoint: str) -> Iterator[LoopbackFront]:
    front = LoopbackFront(s3_endpoint)
    thread = threading.Thread(target=front.serve_forever, daemon=True)
    thread.start()
    yield front
    front.shutdown()
    front.server_close()


@pytest.fixture(scope="module")
def control_worker_env(ec2_front, sshd, live_server, shared_dir) -> dict[str, str]:
    return {
        "TRAINHUB_AWS_ENDPOINT_URL": ec2_front.url,
        "TRAINHUB_AWS_REGIONS": REGION,
        "TRAINHUB_AWS_INSTANCE_TYPES": "g5.xlarge",
        "TRAINHUB_AWS_AMI_NAME": "*",  # moto has no Deep Learning AMI: any of Amazon's
        "TRAINHUB_AWS_SSH_CIDR": "127.0.0.1/32",
        "TRAINHUB_AWS_SSH_USER": sshd.username,
        "TRAINHUB_AWS_SSH_PORT": str(sshd.port),
        "TRAINHUB_PUBLIC_URL": live_server.url,  # the rented machine fetches and uploads here
        "TRAINHUB_REMOTE_PYTHON": sys.executable,
        "TRAINHUB_REMOTE_DIR": str(shared_dir / "remote-aws"),
    }


@pytest.fixture
def aws_plane(plane, settings, control_worker_env, project) -> Process:
    for name, value in control_worker_env.items():
        setattr(settings, name, value)
    settings.TRAINHUB_AWS_REGIONS = [REGION]
    settings.TRAINHUB_AWS_INSTANCE_TYPES = ["g5.xlarge"]
    settings.TRAINHUB_AWS_SSH_PORT = int(control_worker_env["TRAINHUB_AWS_SSH_PORT"])
    credential_create(project=project, provider="aws", name="main", secrets=SECRETS)
    return plane


@pytest.fixture(scope="module", autouse=True)
def _machines_die_with_their_instances(control_worker_env) -> Iterator[None]:
    yield
    _kill_executors(Path(control_worker_env["TRAINHUB_REMOTE_DIR"]).glob("*"))


def _ec2(endpoint: str) -> Any:
    return boto3.client("ec2", region_name=REGION, endpoint_url=endpoint)


def _kill_executors(attempt_dirs: Iterable[Path]) -> None:
    """What terminating an instance does to its processes; the "instance" is this sshd."""
    for directory in attempt_dirs:
        with contextlib.suppress(OSError, ValueError):
            os.killpg(int((directory / "pid").read_text()), signal.SIGKILL)


def _instances(endpoint: str, job_id: str) -> list[dict[str, Any]]:
    answer = _ec2(endpoint).describe_instances(
        Filters=[{"Name": "tag:Name", "Values": [f"trainhub-{job_id}-a*"]}]
    )
    return [i for r in answer["Reservations"] for i in r["Instances"]]


def _beat(endpoint: str, sshd: Any) -> None:
    """One tick: the instances' boot installs their key pairs' keys, a terminated instance's
    processes die; beat asks for a poll of every attempt due now."""
    from trainhub.celery import app

    keys = sshd.authorized_keys.read_text()
    pairs = _ec2(endpoint).describe_key_pairs(IncludePublicKey=True)["KeyPairs"]
    for pair in pairs:
        key = str(pair.get("PublicKey") or "").strip()
        if pair["KeyName"].startswith("trainhub-") and key and key not in keys:
            with sshd.authorized_keys.open("a") as out:
                out.write(key + "\n")
    answer = _ec2(endpoint).describe_instances(
        Filters=[{"Name": "instance-state-name", "Values": ["shutting-down", "terminated"]}]
    )
    gone = [i for r in answer["Reservations"] for i in r["Instances"]]
    remote = Path(settings.TRAINHUB_REMOTE_DIR)
    names = [t["Value"] for i in gone for t in i.get("Tags") or [] if t["Key"] == "Name"]
    _kill_executors(remote / n.removeprefix("trainhub-") for n in names)
    JobAttempt.objects.filter(ended_at__isnull=True).update(next_poll_at=None)
    app.send_task(cc.POLL_TARGET, args=[TARGET])


def _statuses(job: TrainingJob) -> list[str]:
    rows = JobEvent.objects.filter(job=job, type="status", attempt=0).order_by("number")
    return [e.data["status"] for e in rows if "status" in e.data]


def test_an_aws_job_trains_over_ssh_and_the_instance_is_terminated(
    aws_plane, api, demo_dataset, tiny_model_dir, s3_endpoint, sshd
) -> None:
    job_id = submit_tiny_job(api, tiny_model_dir, demo_dataset, target=TARGET)
    job = TrainingJob.objects.get(public_id=job_id)

    def ended() -> bool:
        _beat(s3_endpoint, sshd)
        time.sleep(0.5)
        return TrainingJob.objects.get(pk=job.pk).status in ("succeeded", "failed", "cancelled")

    wait_for("the aws job to end", ended, TRAIN_TIMEOUT, aws_plane)
    job.refresh_from_db()
    assert job.status == "succeeded", (job.error_code, job.error_message)
    assert _statuses(job) == [
        "validating_files", "queued", "provisioning", "running", "finalizing", "succeeded"
    ]  # fmt: skip
    attempt = JobAttempt.objects.get(job=job)
    assert attempt.end_reason == "succeeded"
    assert attempt.provider_instance_id.startswith(f"{REGION}/i-")
    assert (attempt.ssh_host, attempt.ssh_port) == ("127.0.0.1", sshd.port)
    assert attempt.ssh_host_key == sshd.host_key, "trusted on first use and stored"
    assert str(attempt.billed_rate_per_hour) == "1.0060", "g5.xlarge's on-demand price"

    listed = api.get(f"/api/v1/jobs/{job_id}/artifacts/").json()["data"]
    got = download(api, listed[0]["id"])
    assert verify_bundle([got.body]).sha256 == listed[0]["sha256"]

    # One instance was rented for the attempt, and it is terminated once the attempt ended.
    def terminated() -> bool:
        return all(
            i["State"]["Name"] in ("shutting-down", "terminated")
            for i in _instances(s3_endpoint, job_id)
        )

    assert len(_instances(s3_endpoint, job_id)) == 1
    wait_for("the instance to be terminated", terminated, 30, aws_plane)
