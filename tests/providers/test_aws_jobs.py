"""An ``aws`` job through the services and tasks with the real adapter, on moto's EC2 over real
HTTP (the session's moto server), with the session's loopback OpenSSH server standing in for
the instance: placement reads the offers, the launch rents the instance with the attempt's key
pair, the poll starts the executor over SSH, a cancel terminates the instance, and the
reconciler terminates exactly the tagged instances no live attempt owns; a spot job rents spot,
and an interruption requeues it as preempted.

The test plays the instance's boot (it appends the attempt's public key, which EC2 would put
in the login's authorized_keys from the key pair, to the sshd's) and moves the SSH address EC2
reports (a public IP, port 22, ubuntu) to the loopback sshd."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from jobs import tasks
from jobs.models import JobAttempt, TrainingJob
from jobs.services.accounts.projects import credential_create
from jobs.services.cloud import reconcile, remote
from jobs.services.core.attempts import attempt_end, attempt_start, machine_name
from jobs.services.core.jobs import job_cancel
from jobs.states import EndReason, JobStatus
from providers import aws
from providers.aws.api import TAG_MANAGED, split_handle
from providers.base import SshAddress
from trainhub.shared_redis import redis_client

pytestmark = [pytest.mark.django_db]
SECRETS = {"access_key_id": "AKIDTRAINHUBTEST", "secret_access_key": "trainhub-test-secret"}


@pytest.fixture(autouse=True)
def _no_sends(monkeypatch: pytest.MonkeyPatch) -> None:
    """Follow-up tasks are called by the test itself, never sent."""
    from trainhub.celery import app

    monkeypatch.setattr(app, "send_task", lambda *args, **kwargs: None)


@pytest.fixture(autouse=True)
def _fresh_offers() -> None:
    client = redis_client()
    for pattern in ("trainhub:offers:*", "trainhub:ratelimit:*"):
        for key in client.scan_iter(pattern):
            client.delete(key)


@pytest.fixture
def aws_settings(settings: Any, s3_endpoint: str, tmp_path: Path) -> Iterator[Path]:
    """The aws target on moto, in a region of this test alone (moto's state lives as long as
    the session), and rented machines whose executor runs from a temporary directory."""
    root = tmp_path / "remote"
    settings.TRAINHUB_AWS_ENDPOINT_URL = s3_endpoint
    settings.TRAINHUB_AWS_INSTANCE_TYPES = ["g5.xlarge", "p5.48xlarge"]
    settings.TRAINHUB_AWS_AMI_ID = ""
    settings.TRAINHUB_AWS_AMI_NAME = "*"  # moto has no Deep Learning AMI: any of Amazon's
    settings.TRAINHUB_AWS_SSH_CIDR = "192.0.2.0/24"
    settings.TRAINHUB_AWS_PRICES = {}
    settings.TRAINHUB_PUBLIC_URL = "http://127.0.0.1:9"  # nothing listens: the run fails fast
    settings.TRAINHUB_REMOTE_DIR = str(root)
    settings.TRAINHUB_REMOTE_PYTHON = sys.executable
    settings.TRAINHUB_REMOTE_SETUP = ""
    settings.TRAINHUB_OPERATOR_API_KEYS = {}
    yield root
    for pid_file in root.glob("*/pid"):  # what terminating the instance does to its processes
        with contextlib.suppress(OSError, ValueError):
            os.killpg(int(pid_file.read_text()), signal.SIGKILL)


def ec2(endpoint: str, region: str) -> Any:
    return boto3.client("ec2", region_name=region, endpoint_url=endpoint)


def described(endpoint: str, provider_id: str) -> dict[str, Any]:
    region, instance_id = split_handle(provider_id)
    answer = ec2(endpoint, region).describe_instances(InstanceIds=[instance_id])
    return dict(answer["Reservations"][0]["Instances"][0])


def poll(target: str = "aws") -> None:
    JobAttempt.objects.update(next_poll_at=None)
    tasks.poll_target(target)


def test_an_aws_job_is_launched_started_over_ssh_and_terminated_on_cancel(
    aws_settings: Path,
    settings: Any,
    s3_endpoint: str,
    make_job: Any,
    project: Any,
    sshd: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings.TRAINHUB_AWS_REGIONS = ["sa-east-1"]
    credential_create(project=project, provider="aws", name="main", secrets=SECRETS)
    job = make_job(target="aws", gpu={"count": 1})
    tasks.place_job(job.pk)

    attempt = JobAttempt.objects.get(job=job, ended_at__isnull=True)
    assert attempt.provider_instance_id.startswith("sa-east-1/i-")
    assert attempt.offer["offer_id"] == "g5.xlarge@sa-east-1", "the cheapest that fits"
    instance = described(s3_endpoint, attempt.provider_instance_id)
    assert instance["InstanceType"] == "g5.xlarge"
    assert instance["KeyName"] == machine_name(attempt)
    tags = {t["Key"]: t["Value"] for t in instance["Tags"]}
    assert tags["Name"] == machine_name(attempt) and tags[TAG_MANAGED] == "true"
    public_key = remote.attempt_public_key(attempt)
    (key,) = ec2(s3_endpoint, "sa-east-1").describe_key_pairs(
        KeyNames=[machine_name(attempt)], IncludePublicKey=True
    )["KeyPairs"]
    assert key["PublicKey"].split()[:2] == public_key.split()[:2], "the attempt's own key"

    with sshd.authorized_keys.open("a") as out:  # the instance's boot installs the key
        out.write(public_key + "\n")
    real_state = aws.instance_state
    addresses: list[SshAddress | None] = []

    def on_loopback(instance: object, **kwargs: Any) -> Any:
        state = real_state(instance, **kwargs)
        addresses.append(state.ssh)
        if state.ssh is None:
            return state
        moved = dataclasses.replace(state.ssh, host="127.0.0.1", port=sshd.port, username="root")
        return dataclasses.replace(state, ssh=moved)

    monkeypatch.setattr(aws, "instance_state", on_loopback)
    poll()
    attempt.refresh_from_db()
    if attempt.claimed_at is None:  # moto's instance may still have been pending
        poll()
        attempt.refresh_from_db()
    assert addresses[-1] == SshAddress(instance["PublicIpAddress"], 22, "ubuntu")
    assert attempt.claimed_at is not None, "the executor was started over SSH"
    assert (attempt.ssh_host, attempt.ssh_port) == ("127.0.0.1", sshd.port)
    assert str(attempt.billed_rate_per_hour) == "1.0060", "the table's on-demand price"

    job_cancel(job=TrainingJob.objects.get(pk=job.pk))
    tasks.stop_machines(job.pk)
    assert described(s3_endpoint, attempt.provider_instance_id)["State"]["Name"] in (
        "shutting-down",
        "terminated",
    )
    poll()
    attempt.refresh_from_db()
    assert attempt.ended_at is not None
    assert TrainingJob.objects.get(pk=job.pk).status == JobStatus.CANCELLED


def test_the_reconciler_terminates_the_tagged_instances_no_live_attempt_owns(
    aws_settings: Path, settings: Any, s3_endpoint: str, make_job: Any, project: Any
) -> None:
    region = "eu-north-1"
    settings.TRAINHUB_AWS_REGIONS = [region]
    credential_create(project=project, provider="aws", name="main", secrets=SECRETS)
    client = ec2(s3_endpoint, region)
    image = client.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]

    def run(name: str, managed: bool = True) -> str:
        tags = [{"Key": "Name", "Value": name}]
        if managed:
            tags.append({"Key": TAG_MANAGED, "Value": "true"})
        answer = client.run_instances(
            ImageId=image,
            InstanceType="g5.xlarge",
            MinCount=1,
            MaxCount=1,
            TagSpecifications=[{"ResourceType": "instance", "Tags": tags}],
        )
        return f"{region}/{answer['Instances'][0]['InstanceId']}"

    def attempt_on_instance(*, ended: bool) -> tuple[JobAttempt, str]:
        """An attempt whose instance EC2 started (and, ``ended``, an attempt over since)."""
        attempt = attempt_start(job=make_job(target="aws", max_attempts=1), target="aws")
        instance = run(machine_name(attempt))
        JobAttempt.objects.filter(pk=attempt.pk).update(provider_instance_id=instance)
        attempt.refresh_from_db()
        if ended:
            attempt_end(attempt=attempt, reason=EndReason.WORKER_LOST, message="the host went away")
        return attempt, instance

    live, live_id = attempt_on_instance(ended=False)
    _ended, ended_id = attempt_on_instance(ended=True)
    orphan_id = run(f"trainhub-ftjob-{uuid.uuid4().hex[:12]}-a1")
    theirs_id = run("trainhub-lookalike-but-untagged", managed=False)

    terminated = reconcile.providers_reconcile()

    assert terminated == 2
    states = {
        i: described(s3_endpoint, i)["State"]["Name"]
        for i in (live_id, ended_id, orphan_id, theirs_id)
    }
    assert states[live_id] == "running" and states[theirs_id] == "running"
    assert states[ended_id] in ("shutting-down", "terminated")
    assert states[orphan_id] in ("shutting-down", "terminated")
    assert JobAttempt.objects.get(pk=live.pk).ended_at is None


def test_a_spot_job_rents_spot_and_an_interruption_requeues_it_as_preempted(
    aws_settings: Path,
    settings: Any,
    s3_endpoint: str,
    make_job: Any,
    project: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    region = "eu-west-3"
    settings.TRAINHUB_AWS_REGIONS = [region]
    credential_create(project=project, provider="aws", name="main", secrets=SECRETS)
    job = make_job(target="aws", gpu={"count": 1}, capacity="spot", max_attempts=3)
    tasks.place_job(job.pk)

    attempt = JobAttempt.objects.get(job=job, ended_at__isnull=True)
    assert attempt.capacity == "spot"
    instance = described(s3_endpoint, attempt.provider_instance_id)
    assert instance["InstanceLifecycle"] == "spot"

    # EC2 takes the instance back: moto terminates it; the reason is what EC2 would say.
    region_name, instance_id = split_handle(attempt.provider_instance_id)
    ec2(s3_endpoint, region_name).terminate_instances(InstanceIds=[instance_id])
    real_state = aws.instance_state

    def reclaimed(instance: Any, **kwargs: Any) -> Any:
        if instance.get("InstanceId") == instance_id:
            instance = {**instance, "StateReason": {"Code": "Server.SpotInstanceTermination"}}
        return real_state(instance, **kwargs)

    monkeypatch.setattr(aws, "instance_state", reclaimed)
    poll()
    attempt.refresh_from_db()
    assert attempt.ended_at is not None and attempt.end_reason == EndReason.PREEMPTED
    assert TrainingJob.objects.get(pk=job.pk).status == JobStatus.QUEUED, "attempts remain"
