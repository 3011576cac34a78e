"""Helpers for tests whose real processes share the pytest database and broker (the helper
servers that benchmarks need too live in ``devsupport.processes``), and what gives each
pytest-xdist worker services of its own (``worker_environment``)."""

from __future__ import annotations

import os
import re
import shlex
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

import pytest

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


# --- parallel runs (pytest-xdist) -------------------------------------------------------------
# Each xdist worker (gw0, gw1, ...) is a pytest session of its own, with its own real processes
# (control worker, nodes, stream, sshd, moto). What would collide on the machine's shared
# PostgreSQL and Redis is kept apart per worker:
# - PostgreSQL: pytest-django names the test database test_<name>_gw<N> by itself;
# - Redis: the worker's own database, the broker URL's plus the worker's index (queues, locks,
#   offers, throttle counts; kombu prefixes its pub/sub channels, Celery's pidbox and events,
#   with the database number);
# - what Redis shares across databases: the live-update pub/sub channels (TRAINHUB_LIVE_PREFIX)
#   and the nodes' ACL users (TRAINHUB_BROKER_USER_PREFIX, set per database by tests/conftest.py).
# The controller hands this module to its workers as a plugin (PYTEST_PLUGINS, tests/conftest.py):
# the environment must change before pytest-django loads the settings, i.e. before any conftest.
REDIS_DATABASES = 16  # a stock Redis server: databases 0..15
_REDIS_URLS = ("CELERY_BROKER_URL", "TRAINHUB_LOCK_REDIS_URL", "TRAINHUB_LIVE_REDIS_URL")
WORKER_PLUGIN = __name__


def redis_db(url: str) -> int:
    """The database number of a redis:// URL (0 when it names none); ValueError otherwise."""
    parts = urlsplit(url)
    db = parts.path.strip("/") or "0"
    if parts.scheme not in ("redis", "rediss") or not db.isdigit():
        raise ValueError(f"not a redis://host:port/<db> URL: {url!r}")
    return int(db)


def _with_db(url: str, db: int) -> str:
    return urlunsplit(urlsplit(url)._replace(path=f"/{db}"))


def check_parallel_redis(environ: Mapping[str, str], workers: int) -> None:
    """Raise pytest.UsageError unless every worker of ``workers`` gets a Redis database of its
    own: the broker URL's database plus 0..workers-1 must all exist (0..15)."""
    for name in _REDIS_URLS:
        url = environ.get(name)
        if url is None and name != "CELERY_BROKER_URL":
            continue
        try:
            first = redis_db(url or "")
        except ValueError:
            raise pytest.UsageError(
                f"a parallel run (pytest -n) needs {name}=redis://HOST:PORT/DB (make test sets "
                f"it): each worker takes its own Redis database, DB plus its index; got {url!r}"
            ) from None
        last = first + workers - 1
        if last >= REDIS_DATABASES:
            raise pytest.UsageError(
                f"{workers} workers from {name}'s database {first} would need Redis databases "
                f"{first}..{last}, but Redis has 0..{REDIS_DATABASES - 1}: use a lower database "
                f"in {name} (at most {REDIS_DATABASES - workers}) or fewer workers (-n)"
            )


def worker_environment(environ: Mapping[str, str], worker: str, workers: int) -> dict[str, str]:
    """The variables that an xdist worker (``gw<N>`` of ``workers``) changes in its environment:
    its own Redis database in every Redis URL, and its own live channel prefix."""
    check_parallel_redis(environ, workers)
    # A crashed worker is replaced by one numbered past the count: it takes the dead one's slot.
    index = int(worker.removeprefix("gw")) % workers
    changed = {
        name: _with_db(environ[name], redis_db(environ[name]) + index)
        for name in _REDIS_URLS
        if name in environ
    }
    live_url = (
        changed.get("TRAINHUB_LIVE_REDIS_URL")
        or changed.get("TRAINHUB_LOCK_REDIS_URL")
        or changed["CELERY_BROKER_URL"]
    )
    # Pub/sub channels are server-wide: trainhub<db> is what settings derive without the
    # variable (and what a child process started without TRAINHUB_* variables derives).
    prefix = environ.get("TRAINHUB_LIVE_PREFIX")
    changed["TRAINHUB_LIVE_PREFIX"] = (
        f"{prefix}-{index}" if prefix else f"trainhub{redis_db(live_url)}"
    )
    if user_prefix := environ.get("TRAINHUB_BROKER_USER_PREFIX"):
        changed["TRAINHUB_BROKER_USER_PREFIX"] = f"{user_prefix}{index}-"
    return changed


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config) -> None:
    """In an xdist worker: its own services, before pytest-django reads the settings."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:
        workers = int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
        os.environ.update(worker_environment(os.environ, worker, workers))
