"""jobs.services.cloud.remote on the real database: each attempt's own SSH key (stored encrypted),
the attempt's directory on the machine, the deadline for a machine to accept SSH, and driving
the executor over SSH against the session's loopback OpenSSH server: a crash without a final
report, a changed host key, a key the machine refuses, a machine not answering.

The executor here is a shell script standing in for ``python -m gpu_worker run`` (one event,
then a crash), so these tests need no torch; the real executor over SSH: test_cloud_vm."""

from __future__ import annotations

import json
import socket
import stat
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from jobs import crypto
from jobs.models import JobAttempt, JobEvent, TrainingJob
from jobs.services.cloud import remote
from jobs.services.core.attempts import attempt_start, machine_name
from jobs.states import EndReason, JobStatus
from providers import registry, ssh
from providers.base import RemoteState, RemoteStatus, SshAddress
from tests.support.factories import JobAttemptFactory, TrainingJobFactory
from tests.support.fakes.adapter import FakeAdapter, register_fake

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("sent")]
S = JobStatus
CRASHING_EXECUTOR = """#!/bin/sh
# Stands in for `python -m gpu_worker run spec.json`: reports that it runs, then crashes.
test -f spec.json || exit 9
echo '{"seq": 0, "type": "status", "message": "training", "data": {"status": "running"}}' \\
  >> events.jsonl
echo 'loading acme/tiny-llama'
echo 'RuntimeError: CUDA error: out of memory'
exit 1
"""
DRIVE_TIMEOUT = 30.0


@pytest.fixture
def ssh_cloud(settings, tmp_path: Path) -> Iterator[FakeAdapter]:
    """A cloud of VMs driven over SSH, whose executor is the crashing script above."""
    from providers.registry import TargetKind

    executor = tmp_path / "crashing-executor"
    executor.write_text(CRASHING_EXECUTOR)
    executor.chmod(executor.stat().st_mode | stat.S_IXUSR)
    settings.TRAINHUB_PUBLIC_URL = "http://127.0.0.1:8000"
    settings.TRAINHUB_REMOTE_DIR = str(tmp_path / "remote")
    settings.TRAINHUB_REMOTE_PYTHON = str(executor)
    settings.TRAINHUB_REMOTE_SETUP = ""
    adapter = register_fake("ssh-cloud", kind=TargetKind.SSH_MACHINE)
    yield adapter
    registry.unregister("ssh-cloud")


def keyed_attempt(make_job, **job_fields) -> JobAttempt:
    """A started attempt on the SSH cloud holding its own key pair (as its launch leaves it)."""
    attempt = attempt_start(job=make_job(target="ssh-cloud", **job_fields), target="ssh-cloud")
    remote.attempt_new_ssh_key(attempt=attempt)
    return attempt


def authorize(sshd, attempt: JobAttempt) -> None:
    """What the machine does at boot with the attempt's public key."""
    with sshd.authorized_keys.open("a") as out:
        out.write(remote.attempt_public_key(attempt) + "\n")


def fresh(attempt: JobAttempt) -> JobAttempt:
    return JobAttempt.objects.select_related("job").get(pk=attempt.pk)


def up(sshd) -> RemoteState:
    return RemoteState(RemoteStatus.RUNNING, "up", ssh=SshAddress(sshd.host, sshd.port, "root"))


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# --- keys and directories ---------------------------------------------------------------------


def test_each_attempt_gets_its_own_key_stored_encrypted(ssh_cloud, make_job) -> None:
    first, second = keyed_attempt(make_job), keyed_attempt(make_job)

    stored = fresh(first).ssh_private_key_ciphertext
    assert stored == first.ssh_private_key_ciphertext and "PRIVATE KEY" not in stored
    private = crypto.decrypt_json(stored)["private_key"]
    assert private.startswith("-----BEGIN OPENSSH PRIVATE KEY-----")
    public = remote.attempt_public_key(first)
    assert public == ssh.public_key_of(private, comment=machine_name(first))
    assert public.startswith("ssh-ed25519 ")
    assert remote.attempt_public_key(second).split()[1] != public.split()[1]


@pytest.mark.parametrize(
    ("base", "username", "parent"),
    [
        ("/srv/trainhub", "root", "/srv/trainhub"),
        ("/srv/trainhub/", "ubuntu", "/srv/trainhub"),
        ("~", "root", "/root"),
        ("~/trainhub", "root", "/root/trainhub"),
        ("~/trainhub", "ubuntu", "/home/ubuntu/trainhub"),
    ],
)
def test_the_attempts_directory_is_a_path_with_no_tilde_left(
    settings, base, username, parent
) -> None:
    settings.TRAINHUB_REMOTE_DIR = base
    attempt = JobAttemptFactory.build(job=TrainingJobFactory.build(), number=2)
    directory = remote.remote_dir(attempt, SshAddress("203.0.113.7", 22, username))
    assert directory == f"{parent}/{attempt.job.public_id}-a2"


# --- a machine not accepting SSH --------------------------------------------------------------


@pytest.mark.parametrize(
    "state",
    [
        RemoteState(RemoteStatus.PENDING, "pulling the image"),
        RemoteState(RemoteStatus.RUNNING, "booting", ssh=None),
    ],
    ids=["pending", "running-without-ssh"],
)
def test_a_machine_that_never_accepts_ssh_is_given_up_after_the_deadline(
    ssh_cloud, make_job, settings, state
) -> None:
    settings.TRAINHUB_MACHINE_READY_TIMEOUT_SECONDS = 600
    attempt = keyed_attempt(make_job, max_attempts=1)
    remote.attempt_drive(attempt=fresh(attempt), state=state)
    assert fresh(attempt).ended_at is None, "within the deadline it may still come up"

    JobAttempt.objects.filter(pk=attempt.pk).update(
        created_at=timezone.now() - timedelta(seconds=601)
    )
    remote.attempt_drive(attempt=fresh(attempt), state=state)

    attempt = fresh(attempt)
    assert attempt.end_reason == EndReason.NO_CAPACITY
    assert attempt.job.error_message.startswith(
        "the machine did not accept SSH within 600 s; terminated"
    )


def test_the_deadline_does_not_apply_once_the_executor_was_started(
    ssh_cloud, make_job, settings
) -> None:
    settings.TRAINHUB_MACHINE_READY_TIMEOUT_SECONDS = 60
    attempt = keyed_attempt(make_job)
    JobAttempt.objects.filter(pk=attempt.pk).update(
        created_at=timezone.now() - timedelta(hours=2), claimed_at=timezone.now()
    )
    remote.attempt_drive(
        attempt=fresh(attempt), state=RemoteState(RemoteStatus.PENDING, "restarting")
    )
    assert fresh(attempt).ended_at is None


def test_a_machine_that_does_not_answer_is_tried_again_next_poll(ssh_cloud, make_job) -> None:
    attempt = keyed_attempt(make_job)
    state = RemoteState(RemoteStatus.RUNNING, "up", ssh=SshAddress("127.0.0.1", closed_port()))
    remote.attempt_drive(attempt=fresh(attempt), state=state)
    attempt = fresh(attempt)
    assert attempt.ended_at is None and attempt.claimed_at is None


# --- driving the executor over SSH ------------------------------------------------------------


def test_an_executor_that_dies_without_a_final_report_fails_the_attempt_with_its_log(
    ssh_cloud, make_job, sshd, settings
) -> None:
    attempt = keyed_attempt(make_job, max_attempts=1)
    authorize(sshd, attempt)

    remote.attempt_drive(attempt=fresh(attempt), state=up(sshd))
    started = fresh(attempt)
    assert started.claimed_at is not None, "the executor was started"
    assert (started.ssh_host, started.ssh_port) == ("127.0.0.1", sshd.port)
    assert started.ssh_host_key == sshd.host_key, "trusted on first use"
    directory = Path(remote.remote_dir(started, SshAddress(sshd.host, sshd.port, "root")))
    assert directory.parent == Path(settings.TRAINHUB_REMOTE_DIR)
    assert (directory / "spec.json").exists()

    deadline = time.monotonic() + DRIVE_TIMEOUT
    while fresh(attempt).ended_at is None:  # each poll reconnects, reads events, checks exit
        assert time.monotonic() < deadline, (directory / "executor.log").read_text()
        time.sleep(0.2)
        remote.attempt_drive(attempt=fresh(attempt), state=up(sshd))

    ended = fresh(attempt)
    assert ended.end_reason == EndReason.INTERNAL_ERROR
    assert ended.events_offset == (directory / "events.jsonl").stat().st_size
    job = TrainingJob.objects.get(pk=attempt.job_id)
    assert job.status == S.FAILED
    assert job.error_message.startswith(
        "the executor exited with code 1 without reporting its end; its log ends with: "
    )
    assert job.error_message.rstrip().endswith("RuntimeError: CUDA error: out of memory")
    reported = JobEvent.objects.filter(job=job, attempt=1, seq=0).get()
    assert reported.data["status"] == "running", "the events it wrote reached the job"


def test_a_final_report_written_as_the_executor_exits_is_read_before_it_is_judged(
    ssh_cloud, make_job, sshd, monkeypatch, settings, tmp_path: Path
) -> None:
    """The executor writes its last event and exits: a poll that read the events just before
    and found the exit code just after would miss that event and call a reported end (here an
    out-of-memory) a silent death. The poll reads the exit code first, then the events."""
    held = tmp_path / "held-executor"  # the crashing one, exiting once the test says so
    held.write_text(
        CRASHING_EXECUTOR.replace("exit 1", "until [ -e release ]; do sleep 0.1; done\nexit 1")
    )
    held.chmod(held.stat().st_mode | stat.S_IXUSR)
    settings.TRAINHUB_REMOTE_PYTHON = str(held)
    attempt = keyed_attempt(make_job, max_attempts=1)
    authorize(sshd, attempt)
    remote.attempt_drive(attempt=fresh(attempt), state=up(sshd))
    assert fresh(attempt).claimed_at is not None and fresh(attempt).ended_at is None
    directory = Path(remote.remote_dir(fresh(attempt), SshAddress(sshd.host, sshd.port, "root")))
    (directory / "release").touch()
    deadline = time.monotonic() + DRIVE_TIMEOUT
    while not (directory / "exit_code").exists():
        assert time.monotonic() < deadline, (directory / "executor.log").read_text()
        time.sleep(0.1)
    real_exit_code = ssh.RemoteExecutor.exit_code
    final = {"seq": 1, "type": "status", "message": "CUDA out of memory",
             "data": {"status": "failed", "code": "oom"}}  # fmt: skip

    def exits_as_it_reports(executor: ssh.RemoteExecutor) -> int | None:
        with (directory / "events.jsonl").open("a") as events:  # the last words, just now
            events.write(json.dumps(final) + "\n")
        return real_exit_code(executor)

    monkeypatch.setattr(ssh.RemoteExecutor, "exit_code", exits_as_it_reports)
    remote.attempt_drive(attempt=fresh(attempt), state=up(sshd))

    ended = fresh(attempt)
    assert (ended.end_reason, ended.ended_at is not None) == ("oom", True)
    assert TrainingJob.objects.get(pk=attempt.job_id).error_code == "oom"


def test_a_machine_presenting_another_host_key_is_refused(ssh_cloud, make_job, sshd) -> None:
    attempt = keyed_attempt(make_job, max_attempts=1)
    authorize(sshd, attempt)
    _, someone_else = ssh.generate_keypair()
    JobAttempt.objects.filter(pk=attempt.pk).update(
        claimed_at=timezone.now(), ssh_host_key=someone_else
    )

    remote.attempt_drive(attempt=fresh(attempt), state=up(sshd))

    attempt = fresh(attempt)
    assert attempt.end_reason == EndReason.PROVIDER_ERROR
    assert f"the SSH host key of root@127.0.0.1:{sshd.port} changed" in attempt.job.error_message
    assert attempt.events_offset == 0, "nothing was read from it"


def test_a_machine_that_refuses_the_attempts_key_fails_the_attempt(
    ssh_cloud, make_job, sshd
) -> None:
    attempt = keyed_attempt(make_job, max_attempts=1)  # its key never reaches the machine

    remote.attempt_drive(attempt=fresh(attempt), state=up(sshd))

    attempt = fresh(attempt)
    assert attempt.end_reason == EndReason.PROVIDER_ERROR and attempt.claimed_at is None
    assert "SSH authentication to root@127.0.0.1" in attempt.job.error_message
