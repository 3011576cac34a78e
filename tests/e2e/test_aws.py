"""``aws`` jobs end to end: the real control worker places the job on an EC2 offer and
launches the instance on moto's EC2 (real HTTP, the session's moto server); the instance's
"machine" is the loopback OpenSSH server. The worker starts the real executor over SSH on the
tiny model, tails its events, ingests and verifies the bundle the executor uploaded, and
terminates the instance. A spot job is interrupted mid-training, with EC2's two-minute notice
and without, and finishes from its checkpoint on a second instance.

Between the worker and moto sits a small pass-through that rewrites the public IP EC2 reports
(moto makes one up) to 127.0.0.1, and reports the instances EC2 took back from the spot market
with their reason (``Server.SpotInstanceTermination``: moto knows only user terminations); the
SSH port and login are settings (TRAINHUB_AWS_SSH_PORT, TRAINHUB_AWS_SSH_USER) pointed at the
loopback sshd. The test process plays beat (it sends the poll task), the AMI's boot (it
installs the key pair's public key in the sshd's authorized_keys, as cloud-init does with the
instance's key pair) and each instance's metadata service (a fake IMDSv2 on loopback; the
"AMI"'s Python, a wrapper, points the executor at the machine's own path there)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import stat
import sys
import threading
import time
import urllib.error
import urllib.request
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import boto3
import pytest
from django.conf import settings

from jobs.models import JobAttempt, JobEvent, TrainingJob
from jobs.services.accounts.projects import credential_create
from tests.e2e.conftest import Process, submit_tiny_job, wait_for
from tests.e2e.test_fleet import TRAIN_TIMEOUT
from tests.support.api import download
from tests.support.fakes.imds import FakeImds, serve_imds
from trainhub_contract import celery_conf as cc
from trainhub_contract.bundle import verify_bundle

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]
TARGET = "aws"
REGION = "ap-southeast-2"  # this module's alone: moto's state lives as long as the session
SECRETS = {"access_key_id": "AKIDTRAINHUBTEST", "secret_access_key": "trainhub-test-secret"}
_IP = re.compile(rb"<ipAddress>[^<]*</ipAddress>")
EC2_NS = "http://ec2.amazonaws.com/doc/2016-11-15"
SPOT_TERMINATION = "Server.SpotInstanceTermination"
CHECKPOINT_EVERY_STEPS = 5  # the "AMI"'s executor cadence (TRAINHUB's default is 200)


class LoopbackFront(ThreadingHTTPServer):
    """EC2's Query API passed through to moto, with every instance's public IP made loopback
    and the instances in ``reclaimed`` reported as EC2 reports a spot interruption."""

    def __init__(self, upstream: str) -> None:
        super().__init__(("127.0.0.1", 0), _Forward)
        self.upstream = upstream
        self.reclaimed: set[str] = set()

    def rewrite(self, data: bytes) -> bytes:
        data = _IP.sub(b"<ipAddress>127.0.0.1</ipAddress>", data)
        if not self.reclaimed or b"<instancesSet>" not in data:
            return data
        ET.register_namespace("", EC2_NS)
        root = ET.fromstring(data)  # noqa: S314 - moto's answer, on loopback
        for item in root.iter(f"{{{EC2_NS}}}item"):
            if item.findtext(f"{{{EC2_NS}}}instanceId") not in self.reclaimed:
                continue
            reason = item.find(f"{{{EC2_NS}}}stateReason")
            if reason is not None:
                reason.find(f"{{{EC2_NS}}}code").text = SPOT_TERMINATION  # type: ignore[union-attr]
                reason.find(f"{{{EC2_NS}}}message").text = (  # type: ignore[union-attr]
                    f"{SPOT_TERMINATION}: Spot instance termination"
                )
        return ET.tostring(root, encoding="utf-8", xml_declaration=True)

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
        data = self.server.rewrite(data)
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
def imds() -> Iterator[FakeImds]:
    with serve_imds() as fake:
        yield fake


@pytest.fixture(scope="module")
def ami_python(shared_dir: Path, imds: FakeImds) -> str:
    """The rented machines' Python: the executor it runs asks the machine's own metadata
    service (its attempt directory's name is the machine's path on the fake IMDS) every 0.2 s,
    and checkpoints every CHECKPOINT_EVERY_STEPS steps."""
    wrapper = shared_dir / "ami-python"
    wrapper.write_text(
        "#!/bin/sh\n"
        f'export TRAINHUB_IMDS_URL="{imds.url}/$(basename "$PWD")"\n'
        "export TRAINHUB_PREEMPTION_POLL_SECONDS=0.2\n"
        f'exec {sys.executable} "$@" --checkpoint-every-steps {CHECKPOINT_EVERY_STEPS}\n'
    )
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    return str(wrapper)


@pytest.fixture(scope="module")
def control_worker_env(ec2_front, sshd, live_server, shared_dir, ami_python) -> dict[str, str]:
    return {
        "TRAINHUB_AWS_ENDPOINT_URL": ec2_front.url,
        "TRAINHUB_AWS_REGIONS": REGION,
        "TRAINHUB_AWS_INSTANCE_TYPES": "g5.xlarge",
        "TRAINHUB_AWS_AMI_NAME": "*",  # moto has no Deep Learning AMI: any of Amazon's
        "TRAINHUB_AWS_SSH_CIDR": "127.0.0.1/32",
        "TRAINHUB_AWS_SSH_USER": sshd.username,
        "TRAINHUB_AWS_SSH_PORT": str(sshd.port),
        "TRAINHUB_PUBLIC_URL": live_server.url,  # the rented machine fetches and uploads here
        "TRAINHUB_REMOTE_PYTHON": ami_python,
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


def _events(job: TrainingJob, attempt: int, type: str) -> list[JobEvent]:
    return list(JobEvent.objects.filter(job=job, attempt=attempt, type=type).order_by("number"))


def _steps(job: TrainingJob, attempt: int, type: str) -> list[int]:
    return [int(e.data["step"]) for e in _events(job, attempt, type) if "step" in e.data]


def _end_message(job: TrainingJob, attempt: int) -> str:
    (ended,) = [
        e
        for e in _events(job, 0, "status")
        if e.data.get("attempt") == attempt and "end_reason" in e.data
    ]
    return ended.message


SPOT_HYPERPARAMETERS = {
    "n_epochs": 6,  # 90 steps: time to be interrupted well before the end
    "batch_size": 4,
    "learning_rate": 0.002,
    "max_seq_length": 128,
    "warmup_ratio": 0.0,
    "gradient_checkpointing": False,
}


@pytest.mark.parametrize("warned", [True, False], ids=["two-minute-notice", "no-notice"])
def test_a_spot_job_interrupted_mid_training_finishes_from_its_checkpoint_on_a_second_instance(
    warned: bool,
    aws_plane: Process,
    api: Any,
    demo_dataset: bytes,
    tiny_model_dir: Path,
    s3_endpoint: str,
    sshd: Any,
    ec2_front: LoopbackFront,
    imds: FakeImds,
) -> None:
    job_id = submit_tiny_job(
        api,
        tiny_model_dir,
        demo_dataset,
        target=TARGET,
        capacity="spot",
        hyperparameters=SPOT_HYPERPARAMETERS,
    )
    job = TrainingJob.objects.get(public_id=job_id)
    machine = f"{job_id}-a1"  # the first instance's attempt directory (and IMDS path)

    def beat_until(what: str, check: Any) -> None:
        def tick() -> bool:
            _beat(s3_endpoint, sshd)
            time.sleep(0.3)
            return bool(check())

        wait_for(what, tick, TRAIN_TIMEOUT, aws_plane)

    # Mid-training on the first instance: past a periodic checkpoint (warned: past step 10).
    if warned:
        beat_until(
            "step 10 on the first instance", lambda: max(_steps(job, 1, "metrics"), default=0) >= 10
        )
        at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 120))
        imds.interrupt(machine, {"action": "terminate", "time": at})
    else:
        beat_until("a checkpoint on the first instance", lambda: _steps(job, 1, "checkpoint"))
        seen_checkpoint = max(_steps(job, 1, "checkpoint"))
        # EC2 takes the instance back without a word: it is gone, and so is its executor.
        (first_instance,) = _instances(s3_endpoint, job_id)
        _ec2(s3_endpoint).terminate_instances(InstanceIds=[first_instance["InstanceId"]])
        ec2_front.reclaimed.add(first_instance["InstanceId"])
        _kill_executors([Path(settings.TRAINHUB_REMOTE_DIR) / machine])

    beat_until(
        "the spot job to end",
        lambda: TrainingJob.objects.get(pk=job.pk).status in ("succeeded", "failed", "cancelled"),
    )
    job.refresh_from_db()
    assert job.status == "succeeded", (job.error_code, job.error_message)
    first, second = JobAttempt.objects.filter(job=job).order_by("number")
    assert (first.end_reason, second.end_reason) == ("preempted", "succeeded")
    assert first.capacity == second.capacity == "spot"
    assert job.preemptions == 1, "forgiven: not counted against max_attempts"
    assert _statuses(job) == [
        "validating_files", "queued", "provisioning", "running", "queued", "provisioning",
        "running", "finalizing", "succeeded",
    ]  # fmt: skip

    # The second instance resumed from the first one's newest checkpoint.
    (resumed,) = [int(e.data["step"]) for e in _events(job, 2, "log") if "Resuming" in e.message]
    if warned:
        (notice,) = [e for e in _events(job, 1, "log") if e.data.get("notice")]
        assert notice.data["notice"] == "spot_interruption" and notice.level == "warning"
        noticed = _steps(job, 1, "checkpoint")[-1]  # saved at once, at the next step boundary
        assert resumed == noticed >= 10
        assert _end_message(job, 1).startswith(
            f"Attempt 1 ended: Preempted during training after step {noticed}: AWS will terminate"
        )
    else:
        assert resumed >= seen_checkpoint and resumed % CHECKPOINT_EVERY_STEPS == 0
        assert "spot" in _end_message(job, 1).lower(), _end_message(job, 1)
    assert min(_steps(job, 2, "metrics")) > resumed, "no step trained twice past the checkpoint"

    # The adapter is verified, both instances were spot and both are terminated.
    listed = api.get(f"/api/v1/jobs/{job_id}/artifacts/").json()["data"]
    assert len(listed) == 1
    assert verify_bundle([download(api, listed[0]["id"]).body]).sha256 == listed[0]["sha256"]
    instances = _instances(s3_endpoint, job_id)
    assert len({i["InstanceId"] for i in instances}) == 2
    assert {i.get("InstanceLifecycle") for i in instances} == {"spot"}

    def terminated() -> bool:
        return all(
            i["State"]["Name"] in ("shutting-down", "terminated")
            for i in _instances(s3_endpoint, job_id)
        )

    wait_for("both instances to be terminated", terminated, 30, aws_plane)
    assert job.on_demand_cost is not None and job.cost is not None
    assert job.on_demand_cost > job.cost, "spot costs less than the same hours on demand"
