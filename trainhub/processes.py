"""Child processes of the embedded launcher (web, worker, beat, a GPU node), started with one
shared env."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import requests


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return cast(int, s.getsockname()[1])


def wait_http(url: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(requests.RequestException):
            requests.get(url, timeout=1)
            return
        time.sleep(0.2)
    raise TimeoutError(f"{url} did not answer within {timeout:.0f} s")


@contextlib.contextmanager
def running(
    commands: dict[str, list[str]], env: dict[str, str], log_dir: Path, cwd: Path
) -> Iterator[None]:
    """Run each command with its output in ``log_dir/<name>.log``; stop them all on exit."""
    log_dir.mkdir(parents=True, exist_ok=True)
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for name, argv in commands.items():
            log = (log_dir / f"{name}.log").open("ab")
            procs[name] = subprocess.Popen(  # noqa: S603 (argv built by this module)
                argv,
                env={**os.environ, **env},
                cwd=cwd,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        yield
    finally:
        # SIGTERM to each main process only: Celery then shuts down warm (a node finishes its
        # current task instead of having it redelivered), gunicorn stops its workers itself.
        for proc in procs.values():
            proc.terminate()
        for proc in procs.values():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)


def web_command(port: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "gunicorn",
        "trainhub.wsgi",
        "-c",  # access log lines without query strings (transfer tokens live there)
        "python:trainhub.gunicorn_conf",
        "-b",
        f"127.0.0.1:{port}",
        "-w",
        "2",
        "--access-logfile",
        "-",
    ]


def stream_command(port: int) -> list[str]:
    """The stream process (Procfile ``stream``): WebSocket and SSE on an ASGI server."""
    return [sys.executable, "-m", "uvicorn", "trainhub.asgi:application",
            "--host", "127.0.0.1", "--port", str(port), "--lifespan", "off",
            "--ws-per-message-deflate", "false"]  # fmt: skip


def worker_command() -> list[str]:
    """The embedded launcher's one worker serves the Procfile's ``worker``, ``webhooks`` and
    ``exports`` queues."""
    return [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "trainhub",
        "worker",
        "-Q",
        "default,webhooks,exports",
        "-c",
        "1",
        "-l",
        "info",
        "--without-gossip",
        "--without-mingle",
    ]


def beat_command(schedule_file: Path) -> list[str]:
    return [sys.executable, "-m", "celery", "-A", "trainhub", "beat", "-l", "info",
            "-s", str(schedule_file)]  # fmt: skip


def inference_command(model: Path | str, port: int) -> list[str]:
    """The embedded inference server (``python -m gpu_worker serve``) for ``model``; its API
    key comes from ``TRAINHUB_SERVE_API_KEY`` in the environment, not the command line."""
    return [sys.executable, "-m", "gpu_worker", "serve", str(model), "--host", "127.0.0.1",
            "--port", str(port), "--served-model-name", "tiny"]  # fmt: skip


def node_command(name: str) -> list[str]:
    """A GPU node (Procfile ``gpu``): queue gpu.node.<TRAINHUB_NODE_NAME>, one job at a time."""
    return [sys.executable, "-m", "celery", "-A", "gpu_worker.celery_app", "worker",
            "-c", "1", "--prefetch-multiplier", "1", "-n", f"{name}@%h",
            "-l", "info", "--without-heartbeat", "--without-gossip", "--without-mingle"]  # fmt: skip
