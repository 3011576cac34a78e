"""Live-stream fan-out: event stored -> received by 500 WebSocket watchers of one job and 500 SSE
watchers spread over 100 jobs, through the real stream process (Procfile ``stream``).

- Starts the stream process as the Procfile's ``stream`` line does (one uvicorn process,
  ``trainhub.processes.stream_command``) on its own database and its own channel prefix.
- Seeds one user, project, API key (the services) and processed training file, then 102
  ``running`` jobs: the hot job, 100 SSE jobs and a warm-up job.
- The watchers run in a child process (asyncio; uvloop where installed), not in this one: the
  producer's ``event_append`` calls are synchronous database round trips that would stall the
  receivers' event loop (and the receivers' parsing would delay the producer's timestamps);
  as its own process each is scheduled on its own. 500 ``websockets`` clients watch
  ``/ws/jobs/<hot>``, 500 ``httpx-sse`` clients watch ``GET /v1/fine_tuning/jobs/<id>/events
  ?stream=true`` (5 on each of the 100 SSE jobs), all with ``Authorization: Bearer``.
- Memory: the stream process's VmRSS after a warm-up connection of each kind (closed again),
  after the 500 WebSockets are connected and idle, after the 500 SSE streams as well. "Idle"
  means every watcher has received one event on its job, then nothing for a few seconds.
  KB per connection = the growth / 500. Then the stream process's CPU over an idle window.
- Producer (this process): every ``--interval`` s one event on the hot job and one on each of
  ``--sse-per-tick`` SSE jobs (round robin), shuffled, for ``--duration`` s, each through
  ``jobs.services.core.events.event_append`` with ``time.time()`` taken right before the call in
  its ``data``. Latency per delivery = the watcher's ``time.time()`` when the message is read
  minus that timestamp: stored, committed, published, fanned out and received.
- Checks that every watcher received every stored event of its job exactly once, in order
  (missing, duplicates, out of order, ``resync`` messages: all must be 0).

Prints p50/p95/p99/max per channel and overall with PASS/FAIL against p95 <= 250 ms, KB per
idle connection, CPU shares and the integrity counts. Exits 0 once measured, 1 if it could
not run (a watcher that cannot connect, the stream process not serving). About 1 minute.

    .venv/bin/python bench/stream_fanout.py [--duration 25] [--interval 0.25] [--ws 500]
        [--sse-jobs 100] [--sse-per-job 5] [--sse-per-tick 20] [--idle 10]
        [--connect-concurrency 50] [--keep-log] [--series]

``--series`` prints each hot-job event's first and last read; ``--keep-log`` the stream
process's log.

Database: ``--database-url``, else ``BENCH_STREAM_DATABASE_URL``, else ``DATABASE_URL``'s server
with ``_stream_bench`` appended to its database name (``trainhub_stream_bench`` without one);
dropped and created again on every run (its name must contain ``stream_bench``). Redis:
``--redis-url`` (default ``TRAINHUB_LIVE_REDIS_URL``, else ``CELERY_BROKER_URL``, else
``redis://127.0.0.1:6379/7``); pub/sub ignores the database number, so the channel prefix
(``TRAINHUB_LIVE_PREFIX``) is ``trainhub_stream_bench_<pid>``: never a test run's or another
run's. For example:

    export DATABASE_URL=postgres://postgres@127.0.0.1:5432/trainhub_fanout
    export CELERY_BROKER_URL=redis://127.0.0.1:6379/7
    .venv/bin/python bench/stream_fanout.py

Details of the method:

- Stream process: ``uvicorn trainhub.asgi:application --lifespan off`` on 127.0.0.1 (the
  command is checked against the Procfile's ``stream`` line), with the bench's
  ``DATABASE_URL``, ``TRAINHUB_LIVE_REDIS_URL`` and ``TRAINHUB_LIVE_PREFIX`` and default
  settings otherwise (buffer 256 messages; permessage-deflate off, as the Procfile runs it).
  ``RLIMIT_NOFILE`` is raised to the hard limit.
- Seed: ``project_default_for_user``, ``api_key_create``, one processed ``TrainingFile``; the
  102 jobs by ``bulk_create``.
- Watchers: the child process is spawned (no Django). No watcher sends a cursor, so each
  job's stream starts at its first event; at most ``--connect-concurrency`` handshakes at a
  time. The receive time is ``time.time()`` right after a message is read, before parsing it.
- Memory: the warm-up WebSocket and SSE connection on the warm-up job each carry one event and
  close (imports, database connection and thread pool then in place); each VmRSS reading
  (``/proc/<pid>/status``) follows 3 s of quiet.
- Idle CPU: the stream process's utime + stime (``/proc/<pid>/stat``) over ``--idle`` s with
  all watchers connected and nothing produced.
- Producer, by default: every 250 ms one event on the hot job and one on each of the next 20
  SSE jobs (each SSE job every 1.25 s), for 25 s: 100 hot-job events (50,000 WebSocket
  deliveries) and 2,000 SSE-job events (10,000 SSE deliveries). Each is
  ``event_append(type="metrics", data={..., "bench_t": time.time()})`` in its own transaction.
  Percentiles are nearest-rank.
- Integrity: after production every watcher must reach its job's last stored number, and its
  received numbers must equal the job's stored numbers exactly.

Figures: docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import math
import multiprocessing as mp
import os
import random
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repo: devsupport, trainhub
from _common import bench_database_url, database_recreate
from _common import machine as common_machine

from devsupport.processes import free_port
from devsupport.readiness import NotReady, wait_http_ready

ROOT = Path(__file__).resolve().parent.parent
DB_SUFFIX = "_stream_bench"
DEFAULT_REDIS = "redis://127.0.0.1:6379/7"
GOAL_P95_MS = 250.0
READY_TIMEOUT = 90.0  # uvicorn importing Django on a busy 2-core machine
SETTLE_S = 3.0  # after the last warm event, before reading RSS
STREAM_FILES = (
    "api/live/auth.py",
    "api/live/consumers.py",
    "api/live/feed.py",
    "api/live/routing.py",
    "jobs/services/outbox/live.py",
    "jobs/services/core/events.py",
)


# --- the watchers (a child process: no Django, its own event loop and GIL) ---------------------


@dataclass
class Watcher:
    kind: str  # "ws" | "sse"
    job: str
    seqs: list[int] = field(default_factory=list)
    # (seq, read time - the producer's timestamp) for the producer's events
    latency: list[tuple[int, float]] = field(default_factory=list)
    resyncs: int = 0
    connected: bool = False
    error: str = ""

    def got(self, seq: int, event: dict[str, Any], now: float) -> None:
        self.seqs.append(seq)
        sent = event.get("data", {}).get("bench_t")
        if sent is not None:
            self.latency.append((seq, now - sent))


async def _watch_ws(w: Watcher, url: str, headers: dict[str, str], gate: asyncio.Semaphore) -> None:
    from websockets.asyncio.client import connect

    try:
        async with gate:
            ws = await connect(url, additional_headers=headers, open_timeout=120)
        w.connected = True
        async with ws:
            async for raw in ws:
                now = time.time()
                message = json.loads(raw)
                if message["type"] == "resync":
                    w.resyncs += 1
                    continue
                w.got(message["seq"], message["data"], now)
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # reported: the run then stops
        w.error = f"{type(exc).__name__}: {exc}"[:300]


async def _watch_sse(
    w: Watcher, client: Any, url: str, headers: dict[str, str], gate: asyncio.Semaphore
) -> None:
    from httpx_sse import aconnect_sse

    try:
        await gate.acquire()
        released = False
        async with aconnect_sse(client, "GET", url, headers=headers) as source:
            source.response.raise_for_status()
            w.connected = True
            gate.release()
            released = True
            async for sse in source.aiter_sse():
                now = time.time()
                if sse.event == "resync":
                    w.resyncs += 1
                    continue
                if not sse.data:
                    # httpx-sse 0.4 keeps the last id and so dispatches the blank line after a
                    # keep-alive comment as an event with no data; the SSE spec drops those.
                    continue
                w.got(int(sse.id), json.loads(sse.data), now)
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # reported: the run then stops
        w.error = f"{type(exc).__name__}: {exc}"[:300]
    finally:
        if not released:
            gate.release()


class Watchers:
    """The child's side of the pipe: commands in, answers out."""

    def __init__(self, conn: Any, base: str, raw_key: str, concurrency: int) -> None:
        import httpx

        self.conn = conn
        self.base = base
        self.headers = {"Authorization": f"Bearer {raw_key}"}
        self.gate = asyncio.Semaphore(concurrency)
        self.http = httpx.AsyncClient(
            timeout=httpx.Timeout(120, read=None),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=0),
        )
        self.watchers: list[Watcher] = []
        self.tasks: list[asyncio.Task[None]] = []

    async def recv(self) -> Any:
        return await asyncio.get_running_loop().run_in_executor(None, self.conn.recv)

    async def connect(self, kind: str, jobs: list[str], per_job: int) -> list[Watcher]:
        """``per_job`` watchers of each job; returns once every one is connected or failed."""
        ws_base = "ws" + self.base.removeprefix("http")
        new = [Watcher(kind, job) for job in jobs for _ in range(per_job)]
        for w in new:
            if kind == "ws":
                coro = _watch_ws(w, f"{ws_base}/ws/jobs/{w.job}", self.headers, self.gate)
            else:
                url = f"{self.base}/v1/fine_tuning/jobs/{w.job}/events?stream=true"
                coro = _watch_sse(w, self.http, url, self.headers, self.gate)
            self.tasks.append(asyncio.create_task(coro))
        self.watchers += new
        deadline = time.monotonic() + 180
        while not all(w.connected or w.error for w in new) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return new

    async def reached(self, targets: dict[str, int], timeout: float) -> tuple[int, int]:
        """Until every watcher of a job in ``targets`` has read up to its number."""
        mine = [w for w in self.watchers if w.job in targets]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(w.seqs and w.seqs[-1] >= targets[w.job] for w in mine):
                break
            await asyncio.sleep(0.02)
        done = sum(1 for w in mine if w.seqs and w.seqs[-1] >= targets[w.job])
        return done, len(mine)

    async def close(self, watchers: Iterable[Watcher] | None = None) -> None:
        chosen = set(map(id, watchers)) if watchers is not None else None
        keep_w, keep_t, stop = [], [], []
        for w, t in zip(self.watchers, self.tasks, strict=True):
            if chosen is None or id(w) in chosen:
                stop.append(t)
            else:
                keep_w.append(w)
                keep_t.append(t)
        for t in stop:
            t.cancel()
        await asyncio.gather(*stop, return_exceptions=True)
        self.watchers, self.tasks = keep_w, keep_t

    async def run(self) -> None:
        while True:
            command, *args = await self.recv()
            if command == "connect":
                kind, jobs, per_job = args
                new = await self.connect(kind, jobs, per_job)
                errors = [w.error for w in new if w.error]
                self.conn.send((sum(w.connected and not w.error for w in new), errors[:5]))
            elif command == "reached":
                self.conn.send(await self.reached(*args))
            elif command == "close_job":  # the warm-up's watchers
                await self.close([w for w in self.watchers if w.job == args[0]])
                self.conn.send(True)
            elif command == "finish":
                reached = await self.reached(*args)
                errors = [w.error for w in self.watchers if w.error]
                out = [(w.kind, w.job, w.seqs, w.latency, w.resyncs) for w in self.watchers]
                await self.close()
                await self.http.aclose()
                usage = resource.getrusage(resource.RUSAGE_SELF)
                self.conn.send((reached, errors[:5], out, usage.ru_utime + usage.ru_stime))
                return


def watchers_main(conn: Any, base: str, raw_key: str, concurrency: int) -> None:
    async def main() -> None:
        await Watchers(conn, base, raw_key, concurrency).run()

    try:
        import uvloop  # the stream process's loop too (uvicorn picks it when installed)

        uvloop.run(main())
    except ImportError:
        asyncio.run(main())


# --- the stream process -----------------------------------------------------------------------


def stream_start(port: int, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    from trainhub.processes import stream_command

    command = stream_command(port)
    # The Procfile's line is what an operator runs; say so if stream_command drifted from it.
    line = next(
        entry.removeprefix("stream:").strip()
        for entry in (ROOT / "Procfile").read_text().splitlines()
        if entry.startswith("stream:")
    )
    procfile = shlex.split(line.replace("${STREAM_PORT:-8001}", str(port)))
    procfile = [a.replace("0.0.0.0", "127.0.0.1") for a in procfile]  # noqa: S104
    if command[2:] != procfile:
        print(f"warning: stream_command {command[2:]} differs from the Procfile's {procfile}")
    with log.open("ab") as out:
        return subprocess.Popen(  # noqa: S603 (argv built here)
            command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT
        )


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


def cpu_s(pid: int) -> float:
    """utime + stime of a process, seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_busy() -> tuple[float, float]:
    """(busy, total) jiffies of all CPUs together, from /proc/stat."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    return sum(values) - idle, sum(values)


# --- database and seed ------------------------------------------------------------------------


def database_url(cli: str | None) -> str:
    name = "trainhub" + DB_SUFFIX
    url = os.environ.get("DATABASE_URL", "")
    if url.startswith(("postgres://", "postgresql://")):
        current = urlsplit(url).path.lstrip("/") or "trainhub"
        name = current if current.endswith(DB_SUFFIX) else current + DB_SUFFIX
    return bench_database_url(cli, env="BENCH_STREAM_DATABASE_URL", name=name)


@dataclass
class Seed:
    raw_key: str
    hot: Any
    sse: list[Any]
    warm: Any


def seed(n_sse: int) -> Seed:
    from django.contrib.auth import get_user_model

    from jobs.models import TrainingFile, TrainingJob
    from jobs.services.accounts.projects import api_key_create, project_default_for_user
    from trainhub_contract.spec import AdapterSpec, Hyperparameters

    user = get_user_model().objects.create_user(username="stream-bench", password=None)
    project = project_default_for_user(user=user)
    _, raw = api_key_create(user=user, name="stream-bench", project=project)
    tfile = TrainingFile.objects.create(
        project=project, created_by=user, filename="chats.jsonl", bytes=1_000_000,
        sha256="0" * 64, storage_key=f"files/{project.pk}/chats.jsonl",
        status=TrainingFile.Status.PROCESSED, format="chat", example_count=1000,
    )  # fmt: skip
    adapter, hyper = AdapterSpec().to_dict(), Hyperparameters().to_dict()
    jobs = TrainingJob.objects.bulk_create(
        TrainingJob(
            project=project,
            created_by=user,
            model="Qwen/Qwen2.5-0.5B-Instruct",
            training_file=tfile,
            adapter=adapter,
            hyperparameters=hyper,
            target="local",
            max_runtime_seconds=3600,
            status="running",
            suffix=f"stream-{i}",
        )
        for i in range(n_sse + 2)
    )
    return Seed(raw, jobs[0], jobs[1 : n_sse + 1], jobs[n_sse + 1])


# --- measurement ------------------------------------------------------------------------------


def percentile(sorted_values: list[float], p: float) -> float:
    """Nearest-rank percentile."""
    return sorted_values[max(0, math.ceil(p / 100 * len(sorted_values)) - 1)]


class Child:
    """This process's end of the watchers' pipe."""

    def __init__(self, conn: Any, proc: Any) -> None:
        self.conn, self.proc = conn, proc

    def ask(self, *command: Any, timeout: float = 240) -> Any:
        self.conn.send(command)
        if not self.conn.poll(timeout):
            raise SystemExit(f"the watchers did not answer {command[0]} within {timeout:.0f} s")
        return self.conn.recv()

    def connect(self, kind: str, jobs: list[str], per_job: int, log: Path) -> float:
        started = time.monotonic()
        ok, errors = self.ask("connect", kind, jobs, per_job)
        if ok != len(jobs) * per_job:
            tail = log.read_text(errors="replace")[-2000:]
            raise SystemExit(
                f"only {ok} of {len(jobs) * per_job} {kind} watchers connected: {errors}\n"
                f"stream log:\n{tail}"
            )
        return time.monotonic() - started

    def reach(self, targets: dict[str, int], timeout: float = 60) -> None:
        done, total = self.ask("reached", targets, timeout)
        if done != total:
            raise SystemExit(f"only {done} of {total} watchers received their warm event")


def warm(jobs: list[Any]) -> dict[str, int]:
    """One event on each job (no timestamp: not timed); returns {job: its number}."""
    from jobs.services.core.events import event_append

    return {
        j.public_id: event_append(job=j, type="log", message="warm", data={}).number for j in jobs
    }


@dataclass
class Produced:
    events: int
    append_ms: list[float]
    window_s: float


def produce(hot: Any, sse: list[Any], args: argparse.Namespace) -> Produced:
    from jobs.services.core.events import event_append

    rng = random.Random(17)  # noqa: S311 (an order, not a secret)
    ticks = round(args.duration / args.interval)
    append_ms: list[float] = []
    started = time.monotonic()
    cursor = 0
    for tick in range(ticks):
        delay = started + tick * args.interval - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        chosen = [sse[(cursor + i) % len(sse)] for i in range(args.sse_per_tick)]
        cursor += args.sse_per_tick
        batch = [hot, *chosen]
        rng.shuffle(batch)
        for job in batch:
            t = time.time()
            event_append(
                job=job, type="metrics", message=f"step {tick}",
                data={"step": tick, "loss": round(2.0 - tick / ticks, 4), "bench_t": t},
            )  # fmt: skip
            append_ms.append((time.time() - t) * 1000)
    return Produced(len(append_ms), append_ms, time.monotonic() - started)


@dataclass
class Integrity:
    watchers: int = 0
    complete: int = 0
    missing: int = 0
    duplicates: int = 0
    out_of_order: int = 0
    resyncs: int = 0


def check(
    results: list[tuple[str, str, list[int], Any, int]], stored: dict[str, list[int]]
) -> Integrity:
    out = Integrity()
    for _, job, seqs, _, resyncs in results:
        expected = stored[job]
        out.watchers += 1
        out.complete += seqs == expected
        out.missing += len(set(expected) - set(seqs))
        out.duplicates += len(seqs) - len(set(seqs))
        out.out_of_order += sum(1 for a, b in pairwise(seqs) if b <= a)
        out.resyncs += resyncs
    return out


def stats_line(name: str, ms: list[float]) -> tuple[str, bool]:
    ms = sorted(ms)
    if not ms:
        return f"{name:<24}{0:>11,}  (no deliveries)", False
    p95 = percentile(ms, 95)
    ok = p95 <= GOAL_P95_MS
    return (
        f"{name:<24}{len(ms):>11,}{percentile(ms, 50):>8.1f}{p95:>8.1f}{percentile(ms, 99):>8.1f}"
        f"{ms[-1]:>8.1f}  {'PASS' if ok else 'FAIL'}"
    ), ok


def stream_files_digest() -> str:
    digest = hashlib.sha256()
    for name in STREAM_FILES:
        digest.update((ROOT / name).read_bytes())
    return digest.hexdigest()[:12]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--database-url", help="default: see the module docstring")
    ap.add_argument(
        "--redis-url", help=f"default: TRAINHUB_LIVE_REDIS_URL, CELERY_BROKER_URL, {DEFAULT_REDIS}"
    )
    ap.add_argument("--ws", type=int, default=500, help="WebSocket watchers of the hot job")
    ap.add_argument("--sse-jobs", type=int, default=100)
    ap.add_argument("--sse-per-job", type=int, default=5)
    ap.add_argument("--sse-per-tick", type=int, default=20, help="SSE jobs given an event per tick")
    ap.add_argument("--interval", type=float, default=0.25, help="seconds between ticks")
    ap.add_argument("--duration", type=float, default=25.0, help="seconds of production")
    ap.add_argument("--idle", type=float, default=10.0, help="seconds of the idle CPU window")
    ap.add_argument("--connect-concurrency", type=int, default=50, help="handshakes at once")
    ap.add_argument("--keep-log", action="store_true", help="print the stream process's log")
    ap.add_argument(
        "--series", action="store_true", help="print each hot-job event's first/last read (ms)"
    )
    args = ap.parse_args()
    if not 0 < args.sse_per_tick <= args.sse_jobs:
        ap.error("--sse-per-tick must be between 1 and --sse-jobs")

    url = database_url(args.database_url)
    if "stream_bench" not in urlsplit(url).path:
        ap.error(f"refusing to drop {url}: its name must contain 'stream_bench'")
    redis_url = (
        args.redis_url
        or os.environ.get("TRAINHUB_LIVE_REDIS_URL")
        or os.environ.get("CELERY_BROKER_URL")
        or DEFAULT_REDIS
    )
    prefix = f"trainhub_stream_bench_{os.getpid()}"
    # Every watcher is a socket on each side: this process's children and the stream process.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = 2 * (args.ws + args.sse_jobs * args.sse_per_job) + 500
    if soft < need:
        if hard != resource.RLIM_INFINITY and hard < need:
            print(f"RLIMIT_NOFILE hard limit {hard} < {need} descriptors needed")
            return 1
        resource.setrlimit(
            resource.RLIMIT_NOFILE, (need if hard == resource.RLIM_INFINITY else hard, hard)
        )

    pg_version = database_recreate(url)
    os.environ.update(
        DJANGO_SETTINGS_MODULE="trainhub.settings",
        DATABASE_URL=url,
        CELERY_BROKER_URL=os.environ.get("CELERY_BROKER_URL") or redis_url,
        TRAINHUB_LIVE_REDIS_URL=redis_url,
        TRAINHUB_LIVE_PREFIX=prefix,
        TRAINHUB_LOG_LEVEL="WARNING",
    )
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    from jobs.models import JobEvent

    call_command("migrate", verbosity=0)
    s = seed(args.sse_jobs)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    n_sse = args.sse_jobs * args.sse_per_job
    sse_ids = [j.public_id for j in s.sse]

    with tempfile.TemporaryDirectory(prefix="trainhub-stream-bench-") as tmp:
        log = Path(tmp) / "stream.log"
        stream = stream_start(port, dict(os.environ), log)
        ctx = mp.get_context("spawn")
        mine, theirs = ctx.Pipe()
        proc = ctx.Process(
            target=watchers_main, args=(theirs, base, s.raw_key, args.connect_concurrency),
            daemon=True,
        )  # fmt: skip
        try:
            try:
                wait_http_ready(f"{base}/healthz", timeout=READY_TIMEOUT, proc=stream, log=log)
            except NotReady as exc:
                raise SystemExit(f"the stream process is not serving: {exc}") from None
            proc.start()
            child = Child(mine, proc)

            # Warm-up: one connection of each kind, one event through each, closed again.
            child.connect("ws", [s.warm.public_id], 1, log)
            child.connect("sse", [s.warm.public_id], 1, log)
            child.reach(warm([s.warm]))
            child.ask("close_job", s.warm.public_id)
            time.sleep(SETTLE_S)
            rss_base = rss_kb(stream.pid)

            ws_connect_s = child.connect("ws", [s.hot.public_id], args.ws, log)
            child.reach(warm([s.hot]))
            time.sleep(SETTLE_S)
            rss_ws = rss_kb(stream.pid)

            sse_connect_s = child.connect("sse", sse_ids, args.sse_per_job, log)
            child.reach(warm(s.sse))
            time.sleep(SETTLE_S)
            rss_all = rss_kb(stream.pid)

            # Idle: every feed checks its job's counter every CATCH_UP_SECONDS when nothing comes.
            cpu0, wall0 = cpu_s(stream.pid), time.monotonic()
            time.sleep(args.idle)
            idle_cpu = (cpu_s(stream.pid) - cpu0) / (time.monotonic() - wall0)
            rss_idle_end = rss_kb(stream.pid)

            busy0, cpu0, pg0 = machine_busy(), cpu_s(stream.pid), time.monotonic()
            produced = produce(s.hot, s.sse, args)
            stream_cpu = (cpu_s(stream.pid) - cpu0) / (time.monotonic() - pg0)
            busy1 = machine_busy()
            machine_cpu = (
                (busy1[0] - busy0[0]) / max(1, busy1[1] - busy0[1]) * (os.cpu_count() or 1)
            )
            rss_end = rss_kb(stream.pid)

            stored: dict[str, list[int]] = {}
            for job_id, number in (
                JobEvent.objects.filter(job__project_id=s.hot.project_id)
                .order_by("number")
                .values_list("job__public_id", "number")
            ):
                stored.setdefault(job_id, []).append(number)
            targets = {job_id: numbers[-1] for job_id, numbers in stored.items()}
            targets.pop(s.warm.public_id, None)
            (done, total), errors, results, child_cpu_s = child.ask("finish", targets, 20)
        finally:
            with contextlib.suppress(Exception):
                proc.join(10)
            if proc.is_alive():
                proc.terminate()
            stream.terminate()
            try:
                stream.wait(15)
            except subprocess.TimeoutExpired:
                stream.kill()
                stream.wait()
            connection.close()
            if args.keep_log:
                print(log.read_text(errors="replace")[-4000:])
        log_tail = log.read_text(errors="replace")
    problems = [ln for ln in log_tail.splitlines() if "Traceback" in ln or "ERROR" in ln]

    ws_ms = [
        lat * 1000 for kind, _, _, lat_list, _ in results if kind == "ws" for _, lat in lat_list
    ]
    sse_ms = [
        lat * 1000 for kind, _, _, lat_list, _ in results if kind == "sse" for _, lat in lat_list
    ]
    integrity = check(results, stored)
    # The hot job's events: first and last of its watchers to read each one.
    per_event: dict[int, list[float]] = {}
    for kind, _, _, lat_list, _ in results:
        if kind == "ws":
            for seq, lat in lat_list:
                per_event.setdefault(seq, []).append(lat * 1000)
    firsts = sorted(min(v) for v in per_event.values())
    lasts = sorted(max(v) for v in per_event.values())
    append = sorted(produced.append_ms)
    hot_events = len(stored.get(s.hot.public_id, [])) - 1
    sse_events = sum(len(stored.get(j, [])) - 1 for j in sse_ids)

    print()
    print(f"{common_machine(ROOT)}; {pg_version}; stream files sha256 {stream_files_digest()}")
    print(
        f"stream process: {' '.join(['uvicorn', 'trainhub.asgi:application', '--lifespan off'])}"
        f" on 127.0.0.1:{port}; channel prefix {prefix} on {redis_url}"
    )
    print(
        f"watchers: {args.ws} WebSocket on 1 job, {n_sse} SSE on {args.sse_jobs} jobs "
        f"({args.sse_per_job} each), in one child process; connected in "
        f"{ws_connect_s:.1f} s (WS) and {sse_connect_s:.1f} s (SSE), {args.connect_concurrency} "
        "handshakes at a time"
    )
    print(
        f"producer: every {args.interval:g} s 1 hot-job event + {args.sse_per_tick} SSE-job events"
        f" for {produced.window_s:.1f} s: {produced.events:,} events ({hot_events} on the hot job,"
        f" {sse_events} on SSE jobs); event_append p50 {percentile(append, 50):.1f} ms, p95 "
        f"{percentile(append, 95):.1f} ms, max {append[-1]:.1f} ms"
    )
    print()
    head = f"{'stored -> received':<24}{'deliveries':>11}{'p50':>8}{'p95':>8}{'p99':>8}{'max':>8}  p95<={GOAL_P95_MS:g}"
    print(head)
    print("-" * len(head))
    lines = [
        stats_line(f"WebSocket (1 x {args.ws})", ws_ms),
        stats_line(f"SSE ({args.sse_jobs} x {args.sse_per_job})", sse_ms),
        stats_line("all", ws_ms + sse_ms),
    ]
    for line, _ in lines:
        print(line)
    print("ms: the watcher's read time minus the producer's time.time() right before event_append.")
    if firsts:
        print(
            f"hot job, per event: first of {args.ws} watchers p50 {percentile(firsts, 50):.1f} / "
            f"p95 {percentile(firsts, 95):.1f} ms; last p50 {percentile(lasts, 50):.1f} / p95 "
            f"{percentile(lasts, 95):.1f} ms"
        )
    if args.series:
        for seq in sorted(per_event):
            print(f"  seq {seq}: first {min(per_event[seq]):.1f} last {max(per_event[seq]):.1f}")
    print()
    per_ws = (rss_ws - rss_base) / args.ws
    per_sse = (rss_all - rss_ws) / n_sse
    per_any = (rss_all - rss_base) / (args.ws + n_sse)
    print(
        f"stream process RSS: {rss_base / 1024:.1f} MB warm with no watchers, "
        f"{rss_ws / 1024:.1f} MB with {args.ws} WebSockets, {rss_all / 1024:.1f} MB with "
        f"{n_sse} SSE as well; {rss_idle_end / 1024:.1f} MB after the idle window, "
        f"{rss_end / 1024:.1f} MB after production"
    )
    print(
        f"memory per idle connection: {per_any:.1f} KB (WebSocket {per_ws:.1f} KB, SSE "
        f"{per_sse:.1f} KB)"
    )
    print(
        f"CPU (share of one core): stream process idle with {args.ws + n_sse} watchers "
        f"{idle_cpu:.1%}; while producing: stream process {stream_cpu:.1%}, watchers' process "
        f"{child_cpu_s:.1f} s over the whole run, whole machine {machine_cpu:.0%} of "
        f"{os.cpu_count()} cores (shared machine: other work included)"
    )
    print(
        f"integrity: {integrity.complete}/{integrity.watchers} watchers received every event of "
        f"their job once, in order; missing {integrity.missing}, duplicates "
        f"{integrity.duplicates}, out of order {integrity.out_of_order}, resyncs "
        f"{integrity.resyncs}; {done}/{total} reached the last event; watcher errors {errors or 0}"
    )
    if problems:
        print(f"stream log: {len(problems)} error lines, first: {problems[0][:200]}")
    exact = (
        integrity.complete == integrity.watchers
        and not (integrity.missing or integrity.duplicates or integrity.out_of_order)
        and not integrity.resyncs
    )
    latency_ok = all(ok for _, ok in lines)
    verdict = "PASS" if latency_ok and exact else "FAIL"
    why = [] if latency_ok else ["p95"]
    why += [] if exact else ["not every event exactly once"]
    print(
        f"\nRESULT: {verdict}{': ' + ', '.join(why) if why else ''} "
        f"(goal p95 <= {GOAL_P95_MS:.0f} ms, every event exactly once, in order)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
