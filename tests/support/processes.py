"""Helpers for tests whose real processes share the pytest database and broker (the helper
servers that benchmarks need too live in ``devsupport.processes``)."""

from __future__ import annotations

import re
import shlex
import sys
import time
from pathlib import Path
from urllib.parse import quote

ROOT = Path(__file__).resolve().parents[2]
# The test stream process's per-watcher buffer: small, so a client that stops reading overflows it.
STREAM_BUFFER_MESSAGES = 16


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


def procfile_command(name: str, port: int) -> list[str]:
    """The Procfile's ``name`` line as an operator's process manager runs it, with its port
    variable set to ``port``, bound to loopback, its program run from this interpreter."""
    line = next(
        entry.removeprefix(f"{name}:").strip()
        for entry in (ROOT / "Procfile").read_text().splitlines()
        if entry.startswith(f"{name}:")
    )
    everywhere = "0.0.0.0"  # noqa: S104 - what the Procfile binds, replaced by loopback here
    line = re.sub(r"\$\{[A-Z_]*PORT:-\d+\}", str(port), line).replace(everywhere, "127.0.0.1")
    program, *args = shlex.split(line)
    return [sys.executable, "-m", program, *args]
