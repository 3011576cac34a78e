"""Executors on rented VMs, driven over SSH on every poll (providers.ssh.RemoteExecutor).

Each attempt gets its own SSH key pair; the private key is kept encrypted on the attempt and
only ever decrypted in memory. The machine's host key is trusted on first use and stored on the
attempt; a different key later is refused. Once the machine accepts SSH, the executor is
started (with a fresh spec whose events go to a JSON-lines file), and each poll reads the
file's new lines as the attempt's events. An executor that exits without reporting its end is
a failure, with the tail of its log as the message.
"""

from __future__ import annotations

import contextlib
import logging
from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from jobs import crypto
from jobs.models import JobAttempt
from jobs.services.core.attempts import attempt_end, attempt_record_events, machine_name
from jobs.services.core.specs import attempt_spec
from jobs.states import EndReason, JobStatus
from providers import ssh
from providers.base import RemoteState, RemoteStatus, SshAddress
from providers.errors import PermanentProviderError, TransientProviderError

log = logging.getLogger(__name__)
LOG_TAIL_BYTES = 2000
# Reads of events.jsonl (each at most providers.ssh.MAX_EVENTS_READ) in the poll that finds the
# executor exited; what is left then is read by the next poll before the attempt is judged.
EXITED_READS = 8


def attempt_new_ssh_key(*, attempt: JobAttempt) -> None:
    private, _public = ssh.generate_keypair()
    ciphertext = crypto.encrypt_json({"private_key": private})
    JobAttempt.objects.filter(pk=attempt.pk).update(ssh_private_key_ciphertext=ciphertext)
    attempt.ssh_private_key_ciphertext = ciphertext


def _private_key(attempt: JobAttempt) -> str:
    return crypto.decrypt_json(attempt.ssh_private_key_ciphertext)["private_key"]


def attempt_public_key(attempt: JobAttempt) -> str:
    return ssh.public_key_of(_private_key(attempt), comment=machine_name(attempt))


def remote_dir(attempt: JobAttempt, address: SshAddress) -> str:
    """The attempt's directory on the machine. A leading ``~`` is the login user's home, named
    by the usual convention (root: /root, others: /home/<user>): paths are used by SFTP and
    quoted in shell commands, where no ``~`` is expanded."""
    base = settings.TRAINHUB_REMOTE_DIR.rstrip("/")
    if base == "~" or base.startswith("~/"):
        home = "/root" if address.username == "root" else f"/home/{address.username}"
        base = home + base[1:]
    return f"{base}/{attempt.job.public_id}-a{attempt.number}"


def attempt_drive(*, attempt: JobAttempt, state: RemoteState, pause: bool = False) -> None:
    """Start the attempt's executor once its machine accepts SSH, then collect its events.
    ``pause``: the job is paused; the started executor is asked (again: it is idempotent) to
    checkpoint and stop, and its last events are collected until it exits."""
    if state.status != RemoteStatus.RUNNING or state.ssh is None:
        _check_ready_deadline(attempt)
        return
    directory = remote_dir(attempt, state.ssh)
    executor = ssh.RemoteExecutor(
        state.ssh,
        private_key=_private_key(attempt),
        known_host_key=attempt.ssh_host_key,
        remote_dir=directory,
        python=settings.TRAINHUB_REMOTE_PYTHON,
        setup=settings.TRAINHUB_REMOTE_SETUP,
    )
    try:
        with executor:
            if attempt.claimed_at is None:
                _start(attempt, executor, state.ssh, directory)
            elif pause:
                executor.request_stop(pause=True)
            # The exit code first: once it is there every event is written, so reading them
            # after it cannot miss the last ones (its final status, written as it exits).
            code = executor.exit_code()
            read_all = _collect_events(attempt, executor, to_the_end=code is not None)
            if code is not None and read_all:
                _exited(attempt, executor, code)
    except TransientProviderError as exc:  # the next poll tries again; the lease bounds it
        log.info("SSH to %s failed this cycle: %s", attempt, exc)
    except PermanentProviderError as exc:
        attempt_end(attempt=attempt, reason=EndReason.PROVIDER_ERROR, message=str(exc))


def _collect_events(attempt: JobAttempt, executor: ssh.RemoteExecutor, *, to_the_end: bool) -> bool:
    """Record the executor's new events (a bounded read per call); ``to_the_end``: read on
    until nothing is left, or EXITED_READS reads. Returns whether nothing was left."""
    offset = attempt.events_offset
    for _ in range(EXITED_READS if to_the_end else 1):
        events, after = executor.read_events(offset)
        if events:
            attempt_record_events(
                job_id=attempt.job.public_id, attempt_number=attempt.number, events=events
            )
        JobAttempt.objects.filter(pk=attempt.pk).update(events_offset=after)
        if after == offset:
            return True
        offset = after
    return False


def _start(
    attempt: JobAttempt, executor: ssh.RemoteExecutor, address: SshAddress, directory: str
) -> None:
    spec = attempt_spec(
        attempt, sinks=[{"type": "jsonl", "path": f"{directory}/events.jsonl"}], public=True
    )
    executor.start(spec)
    JobAttempt.objects.filter(pk=attempt.pk).update(
        claimed_at=timezone.now(),
        ssh_host=address.host,
        ssh_port=address.port,
        ssh_host_key=executor.host_key,  # trusted from now on
    )
    attempt.ssh_host_key = executor.host_key
    attempt.claimed_at = timezone.now()


def _check_ready_deadline(attempt: JobAttempt) -> None:
    """A machine that never accepts SSH bills all the same (image pull, CUDA mismatch)."""
    limit = settings.TRAINHUB_MACHINE_READY_TIMEOUT_SECONDS
    if attempt.claimed_at is None and timezone.now() - attempt.created_at > timedelta(
        seconds=limit
    ):
        attempt_end(
            attempt=attempt,
            reason=EndReason.NO_CAPACITY,
            message=f"the machine did not accept SSH within {limit} s; terminated",
        )


def _exited(attempt: JobAttempt, executor: ssh.RemoteExecutor, code: int) -> None:
    """The executor process is gone. Its final events were just read: if they did not end the
    attempt (or hand it to ingest), it died without a word."""
    fresh = JobAttempt.objects.select_related("job").get(pk=attempt.pk)
    if fresh.ended_at is not None or fresh.job.status == JobStatus.FINALIZING:
        return
    tail = b""
    with contextlib.suppress(TransientProviderError, PermanentProviderError, OSError):
        # The end of the log only: the machine decides how large the log is.
        tail = executor.tail("executor.log", LOG_TAIL_BYTES) or b""
    # The machine wrote it: NULs (which PostgreSQL refuses in text) and other control bytes go.
    text = "".join(c for c in tail.decode("utf-8", "replace") if c.isprintable() or c in "\n\t")
    text = text.strip()
    attempt_end(
        attempt=fresh,
        reason=EndReason.INTERNAL_ERROR,
        message=f"the executor exited with code {code} without reporting its end"
        + (f"; its log ends with: {text}" if text else ""),
    )
