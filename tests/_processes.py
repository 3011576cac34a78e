"""Helpers for tests that start real processes against the pytest database."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote


def database_url(db: dict) -> str:
    """A DATABASE_URL for another process to reach the (test) database this one uses."""
    user = quote(db.get("USER") or "", safe="")
    password = quote(db.get("PASSWORD") or "", safe="")
    auth = f"{user}:{password}@" if password else (f"{user}@" if user else "")
    return f"postgres://{auth}{db.get('HOST') or '127.0.0.1'}:{db.get('PORT') or 5432}/{db['NAME']}"


def quiesce(worker_name: str, queue: str, timeout: float = 20.0) -> None:
    """Empty ``queue`` and wait until the worker runs no task.

    A transactional test ends by flushing the database with TRUNCATE, which deadlocks with a
    worker task in the middle of a transaction (a dispatch, a heartbeat). A solo-pool worker
    answers ``inspect`` only between tasks, so an empty answer means it is idle.
    """
    from trainhub.celery import app

    with app.connection_for_write() as conn:
        conn.default_channel.queue_purge(queue)
    inspect = app.control.inspect(destination=[worker_name], timeout=1.0)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        active, reserved = inspect.active(), inspect.reserved()
        if active and reserved and not active.get(worker_name) and not reserved.get(worker_name):
            return
        time.sleep(0.1)
    raise TimeoutError(f"worker {worker_name} still busy after {timeout:.0f} s")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for_port(
    port: int, proc: subprocess.Popen[bytes], log: Path, name: str, timeout: float
) -> None:
    """Until ``proc`` accepts connections on 127.0.0.1:``port``; its log in the error if not."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not start: {log.read_text()[-2000:]}") from None
            time.sleep(0.05)


@contextmanager
def moto_s3_server(log: Path, timeout: float = 30.0) -> Iterator[str]:
    """moto's S3 API as a real HTTP server process on loopback; yields its endpoint URL.

    moto accepts any credentials and checks no presigned signature, expiry or checksum: it is a
    faithful S3 wire protocol (XML, multipart, Range, presigned URLs), not an enforcer.
    """
    port = free_port()
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "MOTO_CALL_RESET_API": "false"},
        )  # fmt: skip
    endpoint = f"http://127.0.0.1:{port}"
    try:
        wait_for_port(port, proc, log, "moto", timeout)
        yield endpoint
    finally:
        proc.terminate()
        proc.wait(10)


SSHD = Path("/usr/sbin/sshd")


@contextmanager
def sshd_server(
    workdir: Path, authorized_key: str, timeout: float = 15.0
) -> Iterator[tuple[int, str]]:
    """A real OpenSSH server on 127.0.0.1 that accepts only ``authorized_key`` (any user the
    process may become: root in tests); yields (port, host key line 'ssh-ed25519 AAAA...').

    Everything it needs (throwaway host key, config, authorized_keys, pid file, log) lives in
    ``workdir``; ``StrictModes no`` because pytest's temporary directories are not root-only.
    """
    if not SSHD.exists():
        raise RuntimeError(
            f"{SSHD} is missing: the SSH tests need a real OpenSSH server; install it with "
            "`apt-get install -y openssh-server` (.ci/run does this in CI)"
        )
    host_key = workdir / "ssh_host_ed25519_key"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "trainhub-test-host", "-f", str(host_key)],
        check=True,
    )  # fmt: skip
    (workdir / "authorized_keys").write_text(authorized_key.strip() + "\n")
    port = free_port()
    config = workdir / "sshd_config"
    config.write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {host_key}\n"
        f"AuthorizedKeysFile {workdir / 'authorized_keys'}\nPidFile {workdir / 'sshd.pid'}\n"
        "PubkeyAuthentication yes\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
        "PermitRootLogin prohibit-password\nStrictModes no\nUsePAM no\n"
        "Subsystem sftp internal-sftp\n"
    )
    # sshd refuses to start without its privilege-separation directory (made by the init script).
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    log = workdir / "sshd.log"
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [str(SSHD), "-D", "-e", "-f", str(config)], stdout=out, stderr=subprocess.STDOUT
        )
    try:
        wait_for_port(port, proc, log, "sshd", timeout)
        kind, blob = Path(f"{host_key}.pub").read_text().split()[:2]
        yield port, f"{kind} {blob}"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
