"""providers.ssh against a real OpenSSH server on loopback (the session's ``sshd`` fixture):
host key trust, error mapping, and the real executor on the tiny model started, tailed, stopped
and fetched over SSH. Nothing is mocked; "remote" is this machine, so remote_dir is a local path
the tests can also look at directly."""

from __future__ import annotations

import hashlib
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from devsupport.processes import free_port
from gpu_worker.tiny_model import DEMO_DATASET_PATH
from providers import ssh
from providers.errors import PermanentProviderError, TransientProviderError
from providers.ssh import (
    HostKeyMismatch,
    RemoteExecutor,
    SshAddress,
    fingerprint,
    generate_keypair,
)
from tests.conftest import SshServer
from tests.gpu_worker.conftest import spec_dict, write_jsonl
from trainhub_contract.outcomes import ExitCode


@pytest.fixture
def executor(sshd: SshServer, tmp_path: Path) -> Iterator[Callable[..., RemoteExecutor]]:
    """``executor(**overrides)``: a RemoteExecutor for the loopback sshd, remote_dir under
    tmp_path, the remote python being this venv's."""
    made: list[RemoteExecutor] = []

    def make(**overrides: Any) -> RemoteExecutor:
        kwargs: dict[str, Any] = {
            "private_key": sshd.private_key,
            "remote_dir": str(tmp_path / "remote"),
            "python": sys.executable,
            **overrides,
        }
        ex = RemoteExecutor(SshAddress(sshd.host, sshd.port, sshd.username), **kwargs)
        made.append(ex)
        return ex

    yield make
    for ex in made:
        ex.close()


def _ssh_keygen(*args: str) -> str:
    return subprocess.run(["ssh-keygen", *args], check=True, capture_output=True, text=True).stdout


# --- keys and host key trust ------------------------------------------------------------------


def test_generate_keypair_makes_a_key_openssh_reads(tmp_path: Path) -> None:
    private, public = generate_keypair()
    assert private.startswith("-----BEGIN OPENSSH PRIVATE KEY-----")
    assert public.startswith("ssh-ed25519 AAAA") and public.endswith(" trainhub")
    key_file = tmp_path / "id"
    key_file.write_text(private)
    key_file.chmod(0o600)
    assert _ssh_keygen("-y", "-f", str(key_file)).split()[:2] == public.split()[:2]
    assert generate_keypair()[1] != public


def test_the_first_connection_trusts_and_exposes_the_host_key(
    sshd: SshServer, executor: Callable[..., RemoteExecutor], tmp_path: Path
) -> None:
    first = executor()
    assert first.host_key == sshd.host_key
    pinned = executor(known_host_key=first.host_key + " some-comment")
    assert pinned.exit_code() is None and pinned.host_key == sshd.host_key

    # OpenSSH's own fingerprint of the key is what the mismatch message names.
    (tmp_path / "host.pub").write_text(sshd.host_key + "\n")
    openssh_fp = _ssh_keygen("-l", "-E", "sha256", "-f", str(tmp_path / "host.pub")).split()[1]
    assert fingerprint(sshd.host_key) == openssh_fp

    other = generate_keypair()[1]
    impostor = executor(known_host_key=other)
    with pytest.raises(HostKeyMismatch) as err:
        impostor.start({"job_id": "ftjob-never"})
    assert fingerprint(other) in err.value.message and openssh_fp in err.value.message
    assert not (tmp_path / "remote").exists()  # refused before anything was sent


def test_a_key_the_server_does_not_accept_is_permanent(
    executor: Callable[..., RemoteExecutor],
) -> None:
    stranger = generate_keypair()[0]
    with pytest.raises(PermanentProviderError) as err:
        executor(private_key=stranger).exit_code()
    assert not isinstance(err.value, HostKeyMismatch)
    assert "authentication" in err.value.message and "authorized_keys" in err.value.message
    assert "PRIVATE KEY" not in str(err.value) and stranger[40:80] not in str(err.value)


def test_an_unusable_private_key_is_permanent_and_not_echoed(
    executor: Callable[..., RemoteExecutor],
) -> None:
    garbage = "-----BEGIN OPENSSH PRIVATE KEY-----\nc2VjcmV0LXNlY3JldA==\n-----END OPENSSH..."
    with pytest.raises(PermanentProviderError) as err:
        executor(private_key=garbage)
    assert "ed25519" in err.value.message and "c2VjcmV0" not in str(err.value)


def test_a_closed_port_is_transient_and_quick(sshd: SshServer) -> None:
    address = SshAddress("127.0.0.1", free_port())
    started = time.monotonic()
    with pytest.raises(TransientProviderError) as err:
        RemoteExecutor(address, private_key=sshd.private_key, remote_dir="/x").exit_code()
    assert time.monotonic() - started < 5
    assert "ConnectionRefusedError" in err.value.message


def test_a_port_that_is_not_ssh_is_transient(sshd: SshServer) -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def hang_up() -> None:  # accept, then close: what a booting machine's port can do
        with listener:
            conn, _ = listener.accept()
            conn.close()

    threading.Thread(target=hang_up, daemon=True).start()
    address = SshAddress("127.0.0.1", port)
    ex = RemoteExecutor(address, private_key=sshd.private_key, remote_dir="/x", connect_timeout=5)
    with pytest.raises(TransientProviderError):
        ex.exit_code()


# --- files and processes ----------------------------------------------------------------------


def test_nothing_started_reads_as_nothing(executor: Callable[..., RemoteExecutor]) -> None:
    with executor() as ex:
        assert ex.read_events(0) == ([], 0)
        assert ex.exit_code() is None and ex.is_running() is False
        ex.request_stop()
        assert not Path(ex.remote_dir).exists()  # nothing made by asking
        with pytest.raises(PermanentProviderError, match=r"/nonexistent/bundle\.tar"):
            ex.fetch("/nonexistent/bundle.tar", lambda b: None, max_bytes=1 << 20)


def test_a_failing_setup_command_is_the_exit_and_the_log(
    executor: Callable[..., RemoteExecutor],
) -> None:
    """The setup (installing the executor's requirements) runs first, in the attempt's
    directory where the uploaded requirements are; when it fails, the executor never starts."""
    setup = "ls code/requirements; echo pip: no matching distribution >&2; exit 7"
    with executor(setup=setup) as ex:
        assert ex.start({"version": 1}) is True
        deadline = time.monotonic() + 30
        while ex.exit_code() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert ex.exit_code() == 7
        log = (Path(ex.remote_dir) / "executor.log").read_text()
        assert log.split() == ["executor.txt", "gpu.txt", "pip:", "no", "matching", "distribution"]


def test_read_events_leaves_a_torn_last_line_for_later(
    executor: Callable[..., RemoteExecutor], tmp_path: Path
) -> None:
    events = tmp_path / "remote" / "events.jsonl"
    events.parent.mkdir()
    head = b'{"seq":0,"type":"log"}\nnot json at all\n{"seq":1,"type":"log"}\n'
    events.write_bytes(head + b'{"seq":2,"ty')
    ex = executor()
    got, offset = ex.read_events(0)
    assert [e["seq"] for e in got] == [0, 1] and offset == len(head)
    assert ex.read_events(offset) == ([], offset)
    with events.open("ab") as fh:
        fh.write(b'pe":"log"}\n')
    got, end = ex.read_events(offset)
    assert got == [{"seq": 2, "type": "log"}] and end == events.stat().st_size


def test_read_events_skips_a_line_longer_than_one_read(
    executor: Callable[..., RemoteExecutor], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A line with no end within MAX_EVENTS_READ is skipped, not read again on every poll."""
    monkeypatch.setattr(ssh, "MAX_EVENTS_READ", 4096)
    events = tmp_path / "remote" / "events.jsonl"
    events.parent.mkdir()
    events.write_bytes(b"x" * 10_000 + b'\n{"seq":0,"type":"log"}\n')
    ex = executor()
    offset, got = 0, []
    for _ in range(5):
        batch, offset = ex.read_events(offset)
        got += batch
    assert got == [{"seq": 0, "type": "log"}] and offset == events.stat().st_size


def test_tail_and_fetch_read_no_more_than_asked(
    executor: Callable[..., RemoteExecutor], tmp_path: Path
) -> None:
    remote = tmp_path / "remote"
    remote.mkdir()
    (remote / "big.log").write_bytes(b"a" * 5000 + b"the end\n")
    with executor() as ex:
        assert ex.tail("big.log", 8) == b"the end\n"
        assert ex.tail("missing.log", 8) is None
        got = bytearray()
        with pytest.raises(PermanentProviderError, match="larger than 4096 bytes"):
            ex.fetch(str(remote / "big.log"), got.extend, max_bytes=4096)
        assert got == b""
        assert ex.fetch(str(remote / "big.log"), got.extend, max_bytes=5008) == 5008


def test_a_connection_receives_no_more_than_its_budget(
    executor: Callable[..., RemoteExecutor], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever paramiko is asked to read, the connection stops past MAX_RECEIVED_BYTES."""
    monkeypatch.setattr(ssh, "MAX_RECEIVED_BYTES", 256 << 10)
    events = tmp_path / "remote" / "events.jsonl"
    events.parent.mkdir()
    events.write_bytes((b'{"seq":0,"type":"log","pad":"' + b"p" * 1000 + b'"}\n') * 2000)
    with executor() as ex, pytest.raises(PermanentProviderError, match="more than 262144 bytes"):
        ex.read_events(0)


def test_a_command_that_outlives_its_deadline_is_transient(
    executor: Callable[..., RemoteExecutor], monkeypatch: pytest.MonkeyPatch
) -> None:
    """COMMAND_TIMEOUT bounds the whole command, however slowly its output trickles."""
    monkeypatch.setattr(ssh, "COMMAND_TIMEOUT", 1.0)
    started = time.monotonic()
    with executor() as ex, pytest.raises(TransientProviderError, match="ran past 1 s"):
        ex._sh("while :; do echo .; sleep 0.2; done")
    assert time.monotonic() - started < 5


# --- the real executor over SSH -----------------------------------------------------------------


def _job_spec(model: Path, tmp_path: Path, remote: Path, *, examples: int, **hyper: Any) -> dict:
    lines = DEMO_DATASET_PATH.read_text().splitlines()[:examples]
    dataset = write_jsonl(tmp_path / "data" / "train.jsonl", lines)
    spec = spec_dict(model, dataset, remote / "out", adapter="lora", **hyper)
    spec["report"] = {"sinks": [{"type": "jsonl", "path": str(remote / "events.jsonl")}]}
    return spec


def _poll(ex: RemoteExecutor, seen: list[dict], offset: int, until: Callable[[], bool]) -> int:
    """Read events into ``seen`` until ``until()`` holds (and once more after); new offset."""
    deadline = time.monotonic() + 180
    while True:
        done = until()
        events, offset = ex.read_events(offset)
        seen.extend(events)
        if done:
            return offset
        assert time.monotonic() < deadline, f"timed out; events so far: {seen[-5:]}"
        time.sleep(0.2)


def _statuses(events: list[dict]) -> list[str]:
    return [e["data"]["status"] for e in events if e["type"] == "status"]


@pytest.mark.slow
def test_the_executor_runs_detached_and_is_tailed_and_fetched(
    executor: Callable[..., RemoteExecutor], tiny_model_dir: Path, tmp_path: Path
) -> None:
    remote = tmp_path / "remote"
    spec = _job_spec(tiny_model_dir, tmp_path, remote, examples=8, max_seq_length=64)
    ex = executor()
    assert ex.start(spec) is True
    ex.close()  # the run is detached: it outlives the session, and the next call reconnects
    assert executor().start(spec) is False  # another process (a restarted control plane)
    assert (remote / "spec.json").stat().st_mode & 0o777 == 0o600

    seen: list[dict] = []
    _poll(ex, seen, 0, lambda: ex.exit_code() is not None)
    log = ex.tail("executor.log", 1 << 20) or b""
    assert ex.exit_code() == ExitCode.SUCCEEDED, log.decode()[-3000:]
    assert ex.is_running() is False

    seqs = [e["seq"] for e in seen]
    assert seqs == sorted(set(seqs))  # increasing, nothing read twice across the reads
    assert {(e["job_id"], e["attempt"]) for e in seen} == {("ftjob-test", 1)}
    statuses = _statuses(seen)
    assert "running" in statuses and statuses[-1] == "succeeded"
    final = [e for e in seen if e["type"] == "status"][-1]["data"]

    bundle = bytearray()
    size = ex.fetch(
        str(remote / "out" / "adapter.tar"), bundle.extend, max_bytes=64 << 20, chunk=4096
    )
    assert size == len(bundle) == final["size"] > 0
    assert hashlib.sha256(bundle).hexdigest() == final["sha256"]
    assert '"status": "succeeded"' in log.decode()  # the executor's summary line


@pytest.mark.slow
def test_request_stop_cancels_a_running_executor(
    executor: Callable[..., RemoteExecutor], tiny_model_dir: Path, tmp_path: Path
) -> None:
    remote = tmp_path / "remote"
    spec = _job_spec(tiny_model_dir, tmp_path, remote, examples=60, n_epochs=100, batch_size=1)
    ex = executor()
    assert ex.start(spec) is True
    seen: list[dict] = []
    offset = _poll(ex, seen, 0, lambda: "running" in _statuses(seen))
    assert ex.is_running() is True and ex.exit_code() is None

    ex.request_stop()
    ex.request_stop()  # idempotent
    deadline = time.monotonic() + 60
    while ex.exit_code() is None:
        assert time.monotonic() < deadline, "the executor did not stop within 60 s"
        time.sleep(0.2)
    assert ex.exit_code() == ExitCode.CANCELLED
    _poll(ex, seen, offset, lambda: True)
    assert _statuses(seen)[-1] == "cancelled"
    assert ex.is_running() is False
    assert not (remote / "out" / "adapter.tar").exists()
    ex.request_stop()  # after the end: still no error
