"""Run one attempt's executor (``python -m gpu_worker run``) on a remote machine over SSH: the
executor used by every VM-style provider (RunPod pods; later Lambda, Vast.ai).

Everything of an attempt lives in one remote directory, so each call can find the state again
after the control plane crashed and restarted::

    remote_dir/
      code/gpu_worker/  the executor, uploaded from this checkout (the image need not carry it)
      code/requirements/ its pinned requirements (for a setup command that installs them)
      spec.json         the job spec, mode 0600: it holds signed URLs
      pid               the detached run's pid (= its process group); its presence means started
      events.jsonl      the JsonlSink's events, tailed by byte offset (read_events)
      executor.log      stdout + stderr of the executor
      cancel            made by request_stop; the executor polls it between steps
      exit_code         written (tmp + rename) after the executor exits: never seen half-written

The run is started with ``setsid nohup`` in a wrapper shell, so it survives the SSH session (and
the control plane) going away; the wrapper traps SIGTERM so that a signal to the whole process
group (an operator, the machine shutting down) still lets it record the executor's exit code.
Host keys are trusted on first use: the caller stores ``host_key`` and passes it back as
``known_host_key`` on every later connection.

Kept whole: every method works on the one remote directory layout above.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import io
import json
import shlex
import socket
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import paramiko
from cryptography.hazmat.primitives import serialization as ser
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

import gpu_worker
from providers.base import SshAddress
from providers.errors import PermanentProviderError, ProviderError, TransientProviderError

COMMAND_TIMEOUT = 120.0  # one remote shell command (extracting the code is the longest)
KEEPALIVE_SECONDS = 30  # a reused connection must survive idle NAT timeouts between polls
MAX_EVENTS_READ = 8 << 20  # bytes of events.jsonl per read_events call: bounded memory
_ALREADY_STARTED = 10  # the start script's exit status when pid exists


def generate_keypair() -> tuple[str, str]:
    """A new ed25519 key: (private key as OpenSSH PEM text, public key as
    'ssh-ed25519 AAAA... trainhub')."""
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(ser.Encoding.PEM, ser.PrivateFormat.OpenSSH, ser.NoEncryption())
    return private.decode(), public_key_of(private.decode())


def public_key_of(private_key: str, comment: str = "trainhub") -> str:
    """The 'ssh-ed25519 AAAA... comment' line of an OpenSSH PEM private key."""
    key = ser.load_ssh_private_key(private_key.encode(), password=None)
    public = key.public_key().public_bytes(ser.Encoding.OpenSSH, ser.PublicFormat.OpenSSH)
    return f"{public.decode()} {comment}"


def fingerprint(key_line: str) -> str:
    """OpenSSH's fingerprint of a key line: 'SHA256:' + unpadded base64 of the blob's digest."""
    blob = base64.b64decode(key_line.split()[1])
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


class HostKeyMismatch(PermanentProviderError):
    """The server presented a host key other than the one stored on first contact."""


@functools.cache
def _code_tar() -> bytes:
    """The local gpu_worker package as a gzipped tar (built once per process)."""
    buf, source = io.BytesIO(), Path(gpu_worker.__file__).parent
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(source, "gpu_worker", filter=lambda i: None if "__pycache__" in i.name else i)
        # The executor's pinned requirements, for a setup command that installs them.
        for name in ("executor.txt", "gpu.txt"):
            tar.add(source.parent / "requirements" / name, f"requirements/{name}")
    return buf.getvalue()


class RemoteExecutor:
    """One attempt's executor on a remote machine, driven over SSH (paramiko). Every method opens
    (or reuses) one connection; all are safe to call again after a crash of the control plane.
    Unreachable, timed out or dropped: TransientProviderError; key refused or unusable:
    PermanentProviderError; a host key other than ``known_host_key``: HostKeyMismatch."""

    def __init__(
        self,
        address: SshAddress,
        *,
        private_key: str,
        known_host_key: str = "",
        remote_dir: str,
        python: str = "python3",
        setup: str = "",
        connect_timeout: float = 15.0,
    ) -> None:
        self.address = address
        self.remote_dir = remote_dir.rstrip("/")
        self.python = python
        self.setup = setup  # a shell command run before the executor (installs its requirements)
        self._known = " ".join(known_host_key.split()[:2])
        self._timeout = connect_timeout
        self._where = f"{address.username}@{address.host}:{address.port}"
        try:
            self._key = paramiko.Ed25519Key.from_private_key(io.StringIO(private_key))
        except (paramiko.SSHException, ValueError) as exc:  # the message never quotes the key
            raise PermanentProviderError(
                f"the SSH private key for {self._where} is not an unencrypted OpenSSH ed25519 "
                f"key ({type(exc).__name__}); generate one with generate_keypair()"
            ) from None
        self._conn: tuple[paramiko.Transport, paramiko.SFTPClient] | None = None
        self._seen = ""

    @property
    def host_key(self) -> str:
        """The server's key line ('ssh-ed25519 AAAA...'), connecting first if needed."""
        self._connect()
        return self._seen

    def _connect(self) -> tuple[paramiko.Transport, paramiko.SFTPClient]:
        """The open connection (and its SFTP session), or a new one. A bare Transport: no
        known_hosts file is read and no policy adds keys; only ``known_host_key`` is trusted."""
        if self._conn is not None and self._conn[0].is_active():
            return self._conn
        self.close()
        with self._errors("connect"):
            addr = (self.address.host, self.address.port)
            transport = paramiko.Transport(socket.create_connection(addr, self._timeout))
            try:
                transport.banner_timeout = transport.handshake_timeout = self._timeout
                transport.auth_timeout = self._timeout
                transport.start_client(timeout=self._timeout)
                # paramiko's fixed host key preference (ed25519 first) makes a server answer
                # with the same key type every time, so one stored line is enough.
                key = transport.get_remote_server_key()
                seen = f"{key.get_name()} {key.get_base64()}"
                if self._known and seen != self._known:
                    raise HostKeyMismatch(
                        f"the SSH host key of {self._where} changed: expected "
                        f"{fingerprint(self._known)}, the server presented {fingerprint(seen)}; "
                        "refusing to connect (another machine may answer at this address)"
                    )
                transport.auth_publickey(self.address.username, self._key)
                transport.set_keepalive(KEEPALIVE_SECONDS)
                conn = (transport, transport.open_sftp_client())
            except BaseException:
                transport.close()
                raise
        self._conn, self._seen = conn, seen
        return conn

    @contextlib.contextmanager
    def _errors(self, action: str) -> Iterator[None]:
        """Map paramiko's and the socket's errors to the provider error family."""
        try:
            yield
        except ProviderError:
            raise
        except paramiko.AuthenticationException:
            raise PermanentProviderError(
                f"SSH authentication to {self._where} failed: the server did not accept the "
                "key; check that its public key is in the machine's authorized_keys"
            ) from None
        except (paramiko.SSHException, EOFError, OSError) as exc:  # socket errors are OSErrors
            self.close()
            raise TransientProviderError(
                f"SSH {action} on {self._where} failed: {type(exc).__name__}: {exc}"
            ) from exc

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn[1].close()
            conn[0].close()

    def __enter__(self) -> RemoteExecutor:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _path(self, name: str) -> str:
        return f"{self.remote_dir}/{name}"

    def _sh(self, script: str, stdin: bytes = b"", *, ok: tuple[int, ...] = ()) -> int:
        """Run a POSIX sh script (whatever the login shell is); its exit status, which must be
        one of ``ok`` when given (otherwise PermanentProviderError with the output)."""
        transport, _ = self._connect()
        with self._errors("command"):
            chan = transport.open_session(timeout=self._timeout)
            try:
                chan.settimeout(COMMAND_TIMEOUT)
                chan.set_combine_stderr(True)  # one stream: two could deadlock on the window
                chan.exec_command("sh -c " + shlex.quote(script))
                if stdin:
                    chan.sendall(stdin)
                chan.shutdown_write()
                output = chan.makefile("rb").read().decode(errors="replace")
                status = chan.recv_exit_status()
            finally:
                chan.close()
        if status < 0:  # the channel closed without a status: dropped, or the shell was killed
            raise TransientProviderError(f"SSH command on {self._where} ended without a status")
        if ok and status not in ok:
            where = f"{self.remote_dir} on {self._where}"
            raise PermanentProviderError(
                f"a command in {where} failed ({status}): {output[-2000:]}"
            )
        return status

    def _read(self, name: str, offset: int = 0, limit: int = -1) -> bytes | None:
        """Bytes of remote_dir/name from ``offset`` (None when the file does not exist)."""
        _, sftp = self._connect()
        with self._errors(f"read {name}"):
            try:
                with sftp.open(self._path(name), "rb") as fh:
                    fh.seek(offset)
                    return fh.read(limit if limit >= 0 else None)
            except FileNotFoundError:
                return None

    def start(self, spec: dict[str, Any]) -> bool:
        """Upload the code and spec and start the run detached; False if it was started before."""
        if self._read("pid", limit=0) is not None:
            return False
        d = shlex.quote(self.remote_dir)
        code = shlex.quote(self._path("code"))
        unpack = f"mkdir -p {d} && rm -rf {code} && mkdir {code} && tar -xzf - -C {code}"
        self._sh(unpack, _code_tar(), ok=(0,))
        _, sftp = self._connect()
        with self._errors("upload spec.json"):
            with sftp.open(self._path("spec.json.tmp"), "wb") as fh:
                fh.chmod(0o600)  # before any byte: the spec holds signed URLs
                fh.write(json.dumps(spec).encode())
            sftp.posix_rename(self._path("spec.json.tmp"), self._path("spec.json"))
        # Run in remote_dir; TRAINHUB_WORKDIR puts the executor's scratch space on the
        # attempt's disk rather than /tmp (often a small overlay on cloud machines).
        # The setup's output goes to executor.log too: its failure is what the log tail says.
        setup = f"( {self.setup} ) > executor.log 2>&1 && " if self.setup.strip() else ""
        run = (
            f"trap : TERM INT; {setup}TRAINHUB_WORKDIR={d} PYTHONPATH={code} "
            f"{shlex.quote(self.python)} -m gpu_worker run spec.json --cancel-file "
            f"{shlex.quote(self._path('cancel'))} >> executor.log 2>&1; "
            "echo $? > exit_code.tmp && mv exit_code.tmp exit_code"
        )
        launch = (
            f"cd {d} || exit 1\n[ -e pid ] && exit {_ALREADY_STARTED}\n"
            f"setsid nohup sh -c {shlex.quote(run)} </dev/null >/dev/null 2>&1 &\n"
            "echo $! > pid.tmp && mv pid.tmp pid"
        )
        return self._sh(launch, ok=(0, _ALREADY_STARTED)) == 0

    def read_events(self, offset: int = 0) -> tuple[list[dict[str, Any]], int]:
        """Complete JSON lines of events.jsonl after byte ``offset``, and the offset to pass
        next time (a trailing partial line is read again then; unparsable lines are skipped)."""
        data = self._read("events.jsonl", offset, MAX_EVENTS_READ)
        end = -1 if data is None else data.rfind(b"\n")
        if data is None or end < 0:
            return [], offset
        events = []
        for line in data[: end + 1].splitlines():
            with contextlib.suppress(ValueError):  # torn by a crash, terminated by the next write
                events.append(json.loads(line))
        return [e for e in events if isinstance(e, dict)], offset + end + 1

    def exit_code(self) -> int | None:
        """The executor's exit code (gpu_worker.outcomes.ExitCode), None while it has not exited."""
        data = self._read("exit_code")  # written by rename: complete when it exists
        return int(data) if data and data.strip().isdigit() else None

    def is_running(self) -> bool:
        """Whether the started run's process is alive (a zombie left by a container whose PID 1
        does not reap counts as exited)."""
        script = (
            f"cd {shlex.quote(self.remote_dir)} 2>/dev/null && [ ! -e exit_code ] || exit 1\n"
            'p=$(cat pid 2>/dev/null) && kill -0 "$p" 2>/dev/null || exit 1\n'
            's=$(cat /proc/"$p"/stat 2>/dev/null) || exit 0\n'
            'case "${s##*) }" in Z*|X*) exit 1;; esac'
        )
        return self._sh(script) == 0

    def request_stop(self) -> None:
        """Ask the run to stop (exit 3 after the current step); harmless when repeated, before
        the start (which then stops at once) or after the end. The cancel file only: a SIGTERM
        landing before the executor installs its handler or after it restores them would kill
        it (exit 143, no "cancelled" event, even after an upload), and a second means "now"."""
        d = shlex.quote(self.remote_dir)
        self._sh(f"[ ! -d {d} ] || : > {shlex.quote(self._path('cancel'))}")

    def fetch(
        self, remote_path: str, write: Callable[[bytes], object], *, chunk: int = 1 << 20
    ) -> int:
        """Stream a remote file to ``write``; returns the number of bytes."""
        _, sftp = self._connect()
        with self._errors(f"fetch {remote_path}"):
            try:
                with sftp.open(remote_path, "rb") as fh:
                    fh.prefetch()  # pipelined reads: one round trip per file, not per block
                    while data := fh.read(chunk):
                        write(data)
                    return int(fh.tell())
            except (FileNotFoundError, PermissionError) as exc:
                raise PermanentProviderError(
                    f"cannot read {remote_path} on {self._where}: {exc.strerror or exc}"
                ) from exc
