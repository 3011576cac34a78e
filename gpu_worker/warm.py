"""A warm executor: a node's next executor process, started ahead with its imports done.

A cold start (``python -m gpu_worker run``) spends most of its first seconds importing torch,
transformers and peft (about 8 s of the 10 s to the first step on a node). So after each
attempt, and when the worker starts, the node's supervisor starts ``python -m gpu_worker warm``:
it chooses the backend and imports the training stack (no model, no data; torch does not
create a CUDA context by importing), says so on the pipe named by ``TRAINHUB_WARM_READY_FD``,
and waits for one order on its stdin. The order is one JSON line, ``{"argv": [...], "env":
{...}}``: the arguments a cold start would get (``run SPEC --workdir ... --cancel-file ...``) and
the attempt's own environment (its report URL and token). The process runs that attempt like
``python -m gpu_worker run`` and exits with its exit code.

One attempt per process, so whatever the attempt held (GPU memory above all) goes with the
process, exactly as after a cold start; the next attempt gets a fresh warm process. A warm
process is spawned like a cold executor (its own session, SIGKILL when the supervisor goes, an
environment without the node's secrets), so stopping it is the same too. EOF on its stdin
without an order (the node discarding it) ends it quietly.

The node falls back to a cold start whenever the warm process is not there to take the attempt
(it died, or it is not ready within ``WARM_WAIT_SECONDS``, which a fresh one needs at most for
its imports); ``TRAINHUB_NODE_WARM_EXECUTOR=0`` turns warm starts off.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence

from trainhub_contract.outcomes import ExitCode

log = logging.getLogger(__name__)

ENV_READY_FD = "TRAINHUB_WARM_READY_FD"
READY = b"ready\n"
# How long the supervisor waits for a warm process still importing before it starts cold: a
# fresh process needs its imports (~8 s on 2 busy cores) and no more.
WARM_WAIT_SECONDS = 60.0
_MAX_ORDER_BYTES = 64 * 1024

# What a run imports on its way to the first step (the model classes of the common families:
# AutoModelForCausalLM imports the one a config names only when it loads it).
PRELOAD = (
    "torch",
    "transformers",
    "transformers.trainer",
    "transformers.models.llama.modeling_llama",
    "transformers.models.mistral.modeling_mistral",
    "transformers.models.qwen2.modeling_qwen2",
    "transformers.models.qwen3.modeling_qwen3",
    "transformers.models.gemma.modeling_gemma",
    "transformers.models.phi3.modeling_phi3",
    "peft",
    "gpu_worker.train",
)


# --- the warm process ---------------------------------------------------------------------


def preload() -> list[str]:
    """Choose the backend (Unsloth first, where it is used) and import the training stack;
    the modules that could not be imported (an old transformers without a family)."""
    from gpu_worker import backends

    backends.select_backend()
    missing = []
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception:  # ImportError, or a family module failing on this install
            missing.append(name)
    # Resolving these names imports the lazy submodules a run touches first.
    import transformers

    for attr in ("AutoModelForCausalLM", "AutoTokenizer", "Trainer", "TrainingArguments"):
        with contextlib.suppress(Exception):
            getattr(transformers, attr)
    return missing


def read_order(line: bytes) -> tuple[list[str], dict[str, str]]:
    """The argv and environment of one order; ValueError for anything else."""
    if len(line) > _MAX_ORDER_BYTES:
        raise ValueError("the order is too long")
    order = json.loads(line)
    if not isinstance(order, dict):
        raise ValueError("the order must be a JSON object")
    argv, env = order.get("argv"), order.get("env", {})
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise ValueError("argv must be a non-empty list of strings")
    if argv[0] != "run":
        raise ValueError("a warm executor only runs attempts ('run ...')")
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        raise ValueError("env must map strings to strings")
    return argv, env


def serve(run: Callable[[list[str]], int]) -> int:
    """``python -m gpu_worker warm``: preload, say ready, run the one attempt ordered with
    ``run`` (the command line's own entry point, given ``run SPEC ...``)."""
    fd = int(os.environ.pop(ENV_READY_FD, "") or -1)
    started = time.monotonic()
    missing = preload()
    log.info(
        "warm executor %d ready in %.1f s%s",
        os.getpid(),
        time.monotonic() - started,
        f" (not preloaded: {', '.join(missing)})" if missing else "",
    )
    if fd >= 0:
        with contextlib.suppress(OSError):
            os.write(fd, READY)
            os.close(fd)
    line = sys.stdin.buffer.readline(_MAX_ORDER_BYTES + 1)
    if not line.strip():
        return 0  # discarded by the node
    try:
        argv, env = read_order(line)
    except ValueError as exc:
        print(f"error: a warm executor got an unusable order: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    os.environ.update(env)
    return run(argv)


# --- the supervisor's side ----------------------------------------------------------------


class WarmExecutor:
    """One warm process of this node, spawned ahead and handed exactly one attempt."""

    def __init__(self, proc: subprocess.Popen[bytes], ready_fd: int) -> None:
        self.proc = proc
        self._ready_fd: int | None = ready_fd
        self._ready = False

    @classmethod
    def spawn(
        cls, env: Mapping[str, str], *, preexec_fn: Callable[[], None] | None = None
    ) -> WarmExecutor:
        read, write = os.pipe()
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "gpu_worker", "warm"],
                stdin=subprocess.PIPE,
                env={**env, ENV_READY_FD: str(write)},
                pass_fds=(write,),
                start_new_session=True,
                preexec_fn=preexec_fn,
            )
        except BaseException:
            os.close(read)
            raise
        finally:
            os.close(write)
        return cls(proc, read)

    def ready(self, timeout: float = 0.0) -> bool:
        """Whether its imports are done (waiting up to ``timeout`` seconds for them)."""
        if self._ready or self._ready_fd is None:
            return self._ready
        deadline = time.monotonic() + timeout
        while True:
            left = max(0.0, deadline - time.monotonic())
            readable, _, _ = select.select([self._ready_fd], [], [], min(left, 0.5))
            if readable:
                self._ready = os.read(self._ready_fd, len(READY)) == READY
                self._close_fd()
                return self._ready
            if self.proc.poll() is not None or time.monotonic() >= deadline:
                return False

    def hand(
        self, argv: Sequence[str], env: Mapping[str, str], *, wait: float = WARM_WAIT_SECONDS
    ) -> subprocess.Popen[bytes] | None:
        """Give it the attempt; its process, now the attempt's executor. None (and it is
        discarded) when it is gone or not ready within ``wait`` seconds: start cold."""
        if self.proc.poll() is not None or not self.ready(wait):
            self.discard()
            return None
        order = json.dumps({"argv": list(argv), "env": dict(env)}).encode() + b"\n"
        stdin = self.proc.stdin
        try:
            if stdin is None:
                raise ValueError("spawned without a stdin pipe")
            stdin.write(order)
            stdin.close()
        except (OSError, ValueError):  # it died between the check and the write
            self.discard()
            return None
        return self.proc

    def discard(self) -> None:
        """End it unused (its stdin closed: it exits; killed if it does not at once)."""
        self._close_fd()
        with contextlib.suppress(OSError, ValueError):
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        try:
            self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def _close_fd(self) -> None:
        if self._ready_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._ready_fd)
            self._ready_fd = None

    def __repr__(self) -> str:
        return f"WarmExecutor(pid={self.proc.pid}, ready={self._ready})"
