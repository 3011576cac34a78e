"""Helper servers as real processes on 127.0.0.1, for the tests and the benchmarks."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

SSHD = Path("/usr/sbin/sshd")
SSHD_PACKAGE = "openssh-server"


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (the usual bind-to-0 trick: racy, but only with
    another process picking the same port between this call and the server's bind)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for_port(
    port: int, proc: subprocess.Popen[bytes], log: Path, name: str, timeout: float
) -> None:
    """Until ``proc`` accepts connections on 127.0.0.1:``port``; raises RuntimeError naming
    the port, the wait and the log (with its tail) if it exits or ``timeout`` passes first."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError as exc:
            exited = proc.poll()
            if exited is None and time.monotonic() <= deadline:
                time.sleep(0.05)
                continue
            why = f"exited with {exited}" if exited is not None else f"last error: {exc}"
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise RuntimeError(
                f"{name} did not accept connections on 127.0.0.1:{port} within {timeout:.0f} s "
                f"({why}); log {log}:\n{tail}"
            ) from None


@contextmanager
def moto_s3_server(log: Path, timeout: float = 30.0) -> Iterator[str]:
    """moto's S3 API as a real HTTP server process on loopback; yields its endpoint URL.

    moto accepts any credentials and checks no presigned signature, expiry or checksum: it is a
    faithful S3 wire protocol (XML, multipart, Range, presigned URLs), not an enforcer.
    """
    port = free_port()
    with log.open("ab") as out:
        proc = subprocess.Popen(  # noqa: S603 - argv built here
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


def sshd_missing_reason() -> str | None:
    """Why no loopback OpenSSH server can be started here (one line saying what to install),
    or None when ``SSHD`` is present."""
    if SSHD.exists():
        return None
    return (
        f"{SSHD} is missing: the SSH tests need a real OpenSSH server; install the package "
        f"{SSHD_PACKAGE} with `sudo apt-get install -y {SSHD_PACKAGE}` "
        "(`make services` does it when run as root)"
    )


@contextmanager
def sshd_server(
    workdir: Path, authorized_key: str, timeout: float = 15.0, env: dict[str, str] | None = None
) -> Iterator[tuple[int, str]]:
    """A real OpenSSH server on 127.0.0.1 that accepts only ``authorized_key`` (any user the
    process may become: root in tests); yields (port, host key line 'ssh-ed25519 AAAA...').

    Everything it needs (throwaway host key, config, authorized_keys, pid file, log) lives in
    ``workdir``; ``StrictModes no`` because pytest's temporary directories are not root-only.
    ``env`` is set in every session (sshd's ``SetEnv``): a login's environment is sshd's own,
    not the caller's.
    Raises RuntimeError (``sshd_missing_reason()``) without an sshd: callers that can do
    without it check that first.
    """
    if missing := sshd_missing_reason():
        raise RuntimeError(missing)
    host_key = workdir / "ssh_host_ed25519_key"
    subprocess.run(  # noqa: S603 - argv built here
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "trainhub-test-host", "-f", str(host_key)],  # noqa: S607
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
        + "".join(f"SetEnv {name}={value}\n" for name, value in (env or {}).items())
    )
    # sshd refuses to start without its privilege-separation directory (made by the init script).
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    log = workdir / "sshd.log"
    with log.open("ab") as out:
        proc = subprocess.Popen(  # noqa: S603 - argv built here
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
