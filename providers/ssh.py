"""Run one attempt's executor (``python -m gpu_worker run``) on a remote machine over SSH: the
executor used by every VM-style provider (RunPod pods; later Lambda, Vast.ai).

Everything of an attempt lives in one remote directory, so each call can find the state again
after the control plane crashed and restarted::

    remote_dir/
      code/gpu_worker/  the executor, uploaded from this checkout (the image need not carry it)
      code/trainhub_contract/  what the executor shares with the control plane, uploaded with it
      code/requirements/ its pinned requirements (for a setup command that installs them)
      spec.json         the job spec, mode 0600: it holds signed URLs
      pid               the detached run's pid (= its process group); its presence means started
      events.jsonl      the JsonlSink's events, tailed by byte offset (read_events)
      executor.log      stdout + stderr of the executor
      cancel            made by request_stop; the executor polls it between steps ("pause" in it:
                        the executor uploads a checkpoint before it stops)
      exit_code         written (tmp + rename) after the executor exits: never seen half-written

The run is started with ``setsid nohup`` in a wrapper shell, so it survives the SSH session (and
the control plane) going away; the wrapper traps SIGTERM so that a signal to the whole process
group (an operator, the machine shutting down) still lets it record the executor's exit code.
Host keys are trusted on first use: the caller stores ``host_key`` and passes it back as
``known_host_key`` on every later connection.

The machine is not trusted with the control plane's memory: every read has a byte cap (events
per call, the exit code, a log's tail, a command's output, a fetched file), and the connection
itself stops after ``MAX_RECEIVED_BYTES`` plus what a fetch allowed, whatever the server claims
(paramiko trusts the packet lengths and receive window a server sends).

Kept whole: every method works on the one remote directory layout above.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import functools
import hashlib
import io
import json
import shlex
import socket
import tarfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import paramiko
from cryptography.hazmat.primitives import serialization as ser
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

import gpu_worker
import trainhub_contract
from providers.base import SshAddress
from providers.errors import PermanentProviderError, ProviderError, TransientProviderError

COMMAND_TIMEOUT = 120.0  # one remote shell command, in all (extracting the code is the longest)
KEEPALIVE_SECONDS = 30  # a reused connection must survive idle NAT timeouts between polls
MAX_EVENTS_READ = 8 << 20  # bytes of events.jsonl per read_events call: bounded memory
# Our commands print a line at most (their output is only quoted in errors): more is a broken
# or hostile machine, and reading stops there.
MAX_COMMAND_OUTPUT = 64 << 10
MAX_EXIT_CODE_BYTES = 32  # "<integer>\n"
# Bytes one connection may receive, all reads together (a poll reads at most MAX_EVENTS_READ
# and a few small files); a fetch adds its own max_bytes.
MAX_RECEIVED_BYTES = 64 << 20
_RECV_SLICE = 1 << 20  # no recv buffer larger than this, whatever size paramiko asks for
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


class OverBudget(ConnectionAbortedError):
    """The connection received more bytes than it was allowed, or an operation ran past its
    deadline."""


class _BudgetedSocket:
    """The connection's socket, counting what it receives: past ``budget`` bytes, or past the
    running operation's ``deadline``, every recv fails, so paramiko's transport thread stops and
    nothing more is buffered or waited for. Everything else is the socket's own (paramiko reads
    ``_closed`` and calls settimeout, send, close)."""

    def __init__(self, sock: socket.socket, budget: int) -> None:
        self._sock = sock
        self.budget = budget
        self.received = 0
        self.deadline: float | None = None  # monotonic; None between operations
        self.overdue = False

    def recv(self, n: int) -> bytes:
        if self.received > self.budget:
            # (errno, text): paramiko formats socket errors as a pair, and a thread that fails
            # there would die without closing the connection's channels.
            raise OverBudget(errno.ECONNABORTED, f"received more than {self.budget} bytes")
        if self.deadline is not None and time.monotonic() > self.deadline:
            self.overdue = True
            raise OverBudget(errno.ECONNABORTED, "the operation ran past its deadline")
        data = self._sock.recv(min(n, _RECV_SLICE))
        self.received += len(data)
        return data

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


@functools.cache
def _code_tar() -> bytes:
    """The local executor (gpu_worker and the contract it imports) as a gzipped tar (built once
    per process)."""
    buf, source = io.BytesIO(), Path(gpu_worker.__file__).parent
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for package in (gpu_worker, trainhub_contract):
            folder = Path(str(package.__file__)).parent
            tar.add(folder, folder.name, filter=lambda i: None if "__pycache__" in i.name else i)
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
        self._sock: _BudgetedSocket | None = None
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
            sock = _BudgetedSocket(
                socket.create_connection(addr, self._timeout), MAX_RECEIVED_BYTES
            )
            self._sock = sock  # before the handshake: a flood there is over budget too
            sock.deadline = time.monotonic() + COMMAND_TIMEOUT
            transport = paramiko.Transport(sock)  # type: ignore[arg-type]  # a socket by duck typing
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
                sftp = transport.open_sftp_client()
                # paramiko's SFTP reads wait forever by default, even after the transport died
                # (its channels are unlinked, not woken): a machine that stops answering would
                # hold this worker for good.
                if (channel := sftp.get_channel()) is not None:
                    channel.settimeout(self._timeout)
                conn = (transport, sftp)
            except BaseException:
                transport.close()
                raise
        self._conn, self._seen = conn, seen
        return conn

    @contextlib.contextmanager
    def _errors(self, action: str) -> Iterator[None]:
        """Run one operation within COMMAND_TIMEOUT (the connection stops receiving after it)
        and map paramiko's and the socket's errors to the provider error family."""
        if self._sock is not None:
            self._sock.deadline = time.monotonic() + COMMAND_TIMEOUT
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
            sock = self._sock
            self.close()
            if sock is not None and sock.received > sock.budget:
                raise PermanentProviderError(
                    f"SSH {action} on {self._where}: the machine sent more than {sock.budget} "
                    "bytes on one connection; refusing to read more from it"
                ) from None
            if sock is not None and sock.overdue:
                raise TransientProviderError(
                    f"SSH {action} on {self._where} took longer than {COMMAND_TIMEOUT:.0f} s"
                ) from None
            raise TransientProviderError(
                f"SSH {action} on {self._where} failed: {type(exc).__name__}: {exc}"
            ) from exc
        finally:
            if self._sock is not None:
                self._sock.deadline = None

    def close(self) -> None:
        conn, self._conn, self._sock = self._conn, None, None
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
        deadline = time.monotonic() + COMMAND_TIMEOUT
        with self._errors("command"):
            chan = transport.open_session(timeout=self._timeout)
            try:
                chan.settimeout(COMMAND_TIMEOUT)
                chan.set_combine_stderr(True)  # one stream: two could deadlock on the window
                chan.exec_command("sh -c " + shlex.quote(script))
                if stdin:
                    chan.sendall(stdin)
                chan.shutdown_write()
                output = self._output(chan, deadline).decode(errors="replace")
                # Bounded like the output: a server that never sends a status is not waited on.
                if not chan.status_event.wait(max(0.0, deadline - time.monotonic())):
                    raise TransientProviderError(
                        f"SSH command on {self._where} gave no exit status within "
                        f"{COMMAND_TIMEOUT:.0f} s"
                    )
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

    def _output(self, chan: paramiko.Channel, deadline: float) -> bytes:
        """A command's output, read until it ends: at most MAX_COMMAND_OUTPUT bytes (more is
        PermanentProviderError, and nothing more is read) before ``deadline`` (Transient)."""
        out = bytearray()
        while True:
            chan.settimeout(max(0.0, deadline - time.monotonic()))
            try:
                data = chan.recv(32 << 10)
            except TimeoutError:  # the wait for more output reached the deadline
                data = None
            if data is None or time.monotonic() >= deadline:
                raise TransientProviderError(
                    f"SSH command on {self._where} ran past {COMMAND_TIMEOUT:.0f} s"
                )
            if not data:
                return bytes(out)
            out += data
            if len(out) > MAX_COMMAND_OUTPUT:
                self.close()  # it may go on sending: the connection goes, not just the channel
                raise PermanentProviderError(
                    f"a command on {self._where} printed more than {MAX_COMMAND_OUTPUT} bytes "
                    f"(it ends with {bytes(out[-200:]).decode(errors='replace')!r}); "
                    "stopped reading it"
                )

    def _read(self, name: str, limit: int, offset: int = 0) -> bytes | None:
        """At most ``limit`` bytes of remote_dir/name from ``offset`` (None when the file does
        not exist)."""
        _, sftp = self._connect()
        with self._errors(f"read {name}"):
            try:
                with sftp.open(self._path(name), "rb") as fh:
                    fh.seek(offset)
                    return fh.read(limit)
            except FileNotFoundError:
                return None

    def tail(self, name: str, limit: int) -> bytes | None:
        """The last ``limit`` bytes of remote_dir/name (None when it does not exist): a log's
        end costs ``limit`` however large the machine let the log grow."""
        _, sftp = self._connect()
        with self._errors(f"read {name}"):
            try:
                with sftp.open(self._path(name), "rb") as fh:
                    size = fh.stat().st_size or 0
                    fh.seek(max(0, size - limit))
                    return fh.read(limit)
            except FileNotFoundError:
                return None

    def start(self, spec: dict[str, Any]) -> bool:
        """Upload the code and spec and start the run detached; False if it was started before."""
        if self._read("pid", 0) is not None:
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
        data = self._read("events.jsonl", MAX_EVENTS_READ, offset)
        end = -1 if data is None else data.rfind(b"\n")
        if data is None or end < 0:
            # A full read without a line end is one line longer than the cap: skipped (no
            # event is that long), else every later poll would read the same bytes again.
            skip = len(data) if data is not None and len(data) >= MAX_EVENTS_READ else 0
            return [], offset + skip
        events = []
        for line in data[: end + 1].splitlines():
            with contextlib.suppress(ValueError):  # torn by a crash, terminated by the next write
                events.append(json.loads(line))
        return [e for e in events if isinstance(e, dict)], offset + end + 1

    def exit_code(self) -> int | None:
        """The executor's exit code (trainhub_contract.outcomes.ExitCode), None while it has not exited."""
        data = self._read("exit_code", MAX_EXIT_CODE_BYTES)  # by rename: complete once there
        text = data.strip() if data else b""
        # A shell's exit status is 0-255; anything else is not an exit we know of.
        return int(text) if text.isdigit() and len(text) <= 3 and int(text) <= 255 else None

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

    def request_stop(self, *, pause: bool = False) -> None:
        """Ask the run to stop (exit 3 after the current step); harmless when repeated, before
        the start (which then stops at once) or after the end. The cancel file only: a SIGTERM
        landing before the executor installs its handler or after it restores them would kill
        it (exit 143, no "cancelled" event, even after an upload), and a second means "now".
        ``pause``: "pause" in the file (written whole: tmp + rename), so the executor uploads
        a checkpoint first; a cancel already asked for is left as it is."""
        d, cancel = shlex.quote(self.remote_dir), shlex.quote(self._path("cancel"))
        if pause:
            tmp = shlex.quote(self._path("cancel.tmp"))
            write = f"[ -e {cancel} ] || {{ printf pause > {tmp} && mv -f {tmp} {cancel}; }}"
        else:
            write = f": > {cancel}"
        self._sh(f"[ ! -d {d} ] || {write}")

    def fetch(
        self,
        remote_path: str,
        write: Callable[[bytes], object],
        *,
        max_bytes: int,
        chunk: int = 1 << 20,
    ) -> int:
        """Stream a remote file of at most ``max_bytes`` to ``write``; returns the number of
        bytes. A larger file is PermanentProviderError, checked before reading and while
        reading (the file may grow), with at most ``max_bytes`` handed to ``write``."""
        _, sftp = self._connect()
        with self._errors(f"fetch {remote_path}"):
            try:
                with sftp.open(remote_path, "rb") as fh:
                    if (fh.stat().st_size or 0) > max_bytes:
                        raise self._too_large(remote_path, max_bytes)
                    if self._sock is not None:
                        self._sock.budget += max_bytes  # the connection may carry this file
                    fh.prefetch()  # pipelined reads: one round trip per file, not per block
                    done = 0
                    while data := fh.read(min(chunk, max_bytes + 1 - done)):
                        done += len(data)
                        if done > max_bytes:
                            raise self._too_large(remote_path, max_bytes)
                        write(data)
                    return done
            except (FileNotFoundError, PermissionError) as exc:
                raise PermanentProviderError(
                    f"cannot read {remote_path} on {self._where}: {exc.strerror or exc}"
                ) from exc

    def _too_large(self, remote_path: str, max_bytes: int) -> PermanentProviderError:
        return PermanentProviderError(
            f"{remote_path} on {self._where} is larger than {max_bytes} bytes; not fetched"
        )
