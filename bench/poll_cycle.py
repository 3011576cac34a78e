"""RunPod serverless poll cycle: 5,000 live jobs against a fake RunPod on loopback.

Runs the poller under test, ``jobs.services.cloud.polling.attempts_poll_target("runpod-serverless")``
(the whole body of the Celery task that beat starts every 10 s), in this process, against the
fake RunPod (``tests/support/fakes/runpod_api.py``) started as a separate process: 50 ms per call and
RunPod's documented limit of 2,000 status calls per 10 s, enforced with 429 + Retry-After.

- 5,000 RunPod jobs are submitted to the fake and scripted to go IN_QUEUE -> IN_PROGRESS at a
  seeded random time 15-150 s into the measurement, then to run for ever. The database holds one
  ``provisioning`` job per RunPod job with one live attempt, never polled yet.
- Every ``--interval`` s (beat's 10 s) one cycle runs; a cycle that overruns its tick delays
  the next, which then starts at once (two cycles never overlap: beat's per-target lock).
- **Status staleness**, per job whose IN_QUEUE -> IN_PROGRESS change (the fake's own record)
  falls in the measurement: ``JobAttempt.started_at`` (set when the poller applies the change)
  minus the change time; a change not yet applied at the end counts as end minus change time.
  It is split at the first status call that answered IN_PROGRESS (waiting for the poll, then
  the rest of the cycle until the change is written), and the time between two polls of one
  job is printed by the state the first saw. For this the bench wraps
  ``RunpodServerless.poll`` and ``._status`` to take timestamps; the code is not changed.
- **Calls and 429s**: the fake's status-call count, its 429s from the rate limit (none are
  injected here) and the most status calls it saw in any 10 s sliding window.
- **Poller CPU**: ``getrusage(RUSAGE_SELF)`` user + sys of this process (all its threads) over
  the measurement, divided by its wall time: the share of one core. The fake, PostgreSQL and
  Redis are other processes; the fake's and this connection's PostgreSQL backend's CPU are
  printed beside it (from /proc) because they share the same cores.

Prints PASS/FAIL for: never over the limit (0 rate-limit 429s and <= 2,000 calls in any 10 s
window), staleness p95 <= 30 s, poller CPU <= 50% of a core.

    .venv/bin/python bench/poll_cycle.py [--jobs 5000] [--duration 180] [--profile FILE]
        [--interval 10] [--latency 0.05] [--queue-min 15] [--queue-max 150] [--seed 7]
        [--submit-threads 32] [--keep-logs]

``--profile FILE`` writes a cProfile of the cycles' main thread (selecting, applying and
writing; the status calls run in the adapter's thread pool, which it does not see).

Database: ``--database-url``, else ``BENCH_POLL_DATABASE_URL``, else ``DATABASE_URL``'s server
with the database ``trainhub_poll_bench``, else that name on 127.0.0.1. It is dropped and
created again on every run (its name must contain ``poll_bench``). Rate limiter: ``--redis-url``
(default ``redis://127.0.0.1:6379/5``; its ``trainhub:ratelimit:*`` keys are deleted first).
Exits 0 once measured (the verdicts are printed), 1 if it could not run. About 3.5 minutes
with the defaults, e.g.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/trainhub .venv/bin/python bench/poll_cycle.py

How it measures, step by step:

1. Database: dropped, created and migrated; ``django.setup()`` runs in-process with
   ``RUNPOD_SERVERLESS_URL`` = the fake, ``RUNPOD_ENDPOINT_ID=bench-ep`` and
   ``TRAINHUB_LOCK_REDIS_URL`` = the ``--redis-url``.
2. The fake: ``python -m tests.support.fakes.runpod_api --port 0 --latency 0.05 --rate-limit
   run=1000000/10``, a separate process so its CPU is not the poller's. The status limit stays
   at its default (2,000 per 10 s, sliding window, 429 with Retry-After); no failures are
   injected.
3. Jobs: 5,000 ``POST /bench-ep/run`` from ``--submit-threads`` threads (about 8.5 s), with a
   7-day ``executionTimeout`` so nothing times out; the fake keeps every job ``IN_QUEUE`` until
   it is scripted. Then seeded in one ``bulk_create`` each (1.5 s): one user, project,
   ``runpod`` credential (``credential_create``) and processed ``TrainingFile``, and 5,000
   ``provisioning`` ``runpod-serverless`` jobs, each with one live attempt (number 1,
   ``provider_instance_id`` = the fake's id, lease 7 days ahead, ``next_poll_at`` NULL). Then
   each job is scripted through ``POST /_fake/script`` (``--seed``): ``IN_QUEUE`` ->
   ``IN_PROGRESS`` at a time uniform in ``--queue-min``..``--queue-max`` s after the poll
   starts, then running for the rest of the bench.
4. Poller: ``attempts_poll_target(target="runpod-serverless")`` at t = 0, 10, 20, ... s for
   ``--duration`` s (18 cycles by default): the body of ``poll_target`` without Celery and its
   lock.
5. Staleness: the change times come from the fake's ``/_fake/status_changes`` (same clock);
   nearest-rank percentiles.
6. Limit: ``/_fake/stats`` gives the status calls, 429s from the rate limit (and injected
   ones) and the most status calls in any 10 s window, refused calls included.
7. CPU: besides this process, the fake's and the PostgreSQL backend's CPU from
   ``/proc/<pid>/stat``, and all processes together from ``/proc/stat``. Redis is not counted.

Figures: docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import logging
import math
import os
import random
import resource
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from itertools import pairwise
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg
import redis
import requests

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repo: devsupport, trainhub
from _common import bench_database_url, database_recreate
from _common import machine as common_machine

from devsupport.readiness import NotReady, wait_http_ready

ROOT = Path(__file__).resolve().parent.parent
DB_NAME = "trainhub_poll_bench"
DEFAULT_REDIS = "redis://127.0.0.1:6379/5"
FAKE_START_TIMEOUT = 60.0
TARGET = "runpod-serverless"
ENDPOINT = "bench-ep"
API_KEY = "rp-test-key"  # the fake's
SECRET_KEY = "trainhub-poll-bench-not-a-secret-" + "x" * 24
POLLER_FILES = (
    "jobs/services/cloud/polling.py",
    "jobs/services/core/attempts.py",
    "providers/runpod_serverless.py",
    "providers/http.py",
    "providers/ratelimit.py",
    "providers/registry.py",
)
STATUS_LIMIT = 2000  # RunPod's status calls per 10 s, which the fake enforces
GOAL_STALENESS_P95 = 30.0
GOAL_CPU_SHARE = 0.50
NEVER = 1e9  # seconds: a queue or a run that does not end during the bench
POLICY_MS = 7 * 24 * 3600 * 1000  # RunPod's cap; the default 10 min executionTimeout would end runs


class BenchError(Exception):
    """The bench could not run (a process died, a service is missing)."""


# --- database -------------------------------------------------------------------------------


def seed(fake_ids: list[str]) -> None:
    """One user, project, runpod credential and processed file; per fake job, a provisioning
    job with one live attempt that was never polled (next_poll_at NULL)."""
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from jobs.models import JobAttempt, TrainingFile, TrainingJob
    from jobs.services.accounts.projects import credential_create, project_create
    from jobs.states import JobStatus
    from trainhub_contract.spec import AdapterSpec, Hyperparameters

    user = get_user_model().objects.create_user(username="bench", password=None)
    project = project_create(name="poll-bench", owner=user, default=True)
    credential_create(
        project=project, provider="runpod", name="bench", secrets={"api_key": API_KEY}
    )
    data = TrainingFile.objects.create(
        project=project,
        created_by=user,
        filename="data.jsonl",
        storage_key="bench/none",
        status=TrainingFile.Status.PROCESSED,
    )
    adapter, hyper = AdapterSpec().to_dict(), Hyperparameters().to_dict()
    now = timezone.now()
    jobs = TrainingJob.objects.bulk_create(
        [
            TrainingJob(
                project=project,
                created_by=user,
                model="Qwen/Qwen2.5-0.5B-Instruct",
                training_file=data,
                adapter=adapter,
                hyperparameters=hyper,
                target=TARGET,
                max_runtime_seconds=24 * 3600,
                status=JobStatus.PROVISIONING,
            )
            for _ in fake_ids
        ],
        batch_size=1000,
    )
    JobAttempt.objects.bulk_create(
        [
            JobAttempt(
                job=job,
                number=1,
                target=TARGET,
                provider_instance_id=fake_id,
                lease_expires_at=now + timedelta(days=7),
                next_poll_at=None,
            )
            for job, fake_id in zip(jobs, fake_ids, strict=True)
        ],
        batch_size=1000,
    )
    with contextlib.closing(psycopg.connect(os.environ["DATABASE_URL"], autocommit=True)) as c:
        c.execute("ANALYZE")


# --- the fake -------------------------------------------------------------------------------


class Fake:
    """The fake RunPod as a child process in its own session, its stderr in a log file."""

    def __init__(self, latency: float, log: Path) -> None:
        self.log = log
        with log.open("ab") as err:
            self.popen = subprocess.Popen(  # noqa: S603 - argv built here
                [sys.executable, "-m", "tests.support.fakes.runpod_api", "--port", "0",
                 "--latency", str(latency), "--rate-limit", "run=1000000/10"],
                cwd=ROOT, stdout=subprocess.PIPE, stderr=err, start_new_session=True, text=True,
            )  # fmt: skip
        # It prints its URL once listening; a busy machine may take a while to import it.
        out = self.popen.stdout
        printed = out is not None and select.select([out], [], [], FAKE_START_TIMEOUT)[0]
        line = out.readline().strip() if out is not None and printed else ""
        if not line.startswith("http"):
            self.stop()
            raise BenchError(
                f"the fake RunPod printed no URL within {FAKE_START_TIMEOUT:.0f} s "
                f"(got {line!r}); log {log}:\n{self.tail()}"
            )
        self.url = line
        self.control = line.removesuffix("/v2") + "/_fake"
        self.http = requests.Session()
        try:
            wait_http_ready(
                f"{self.control}/stats", timeout=FAKE_START_TIMEOUT, session=self.http,
                proc=self.popen, log=log,
            )  # fmt: skip
        except NotReady as exc:
            self.stop()
            raise BenchError(f"the fake RunPod is not serving: {exc}") from None

    def get(self, route: str) -> Any:
        resp = self.http.get(f"{self.control}/{route}", timeout=120)
        resp.raise_for_status()
        return resp.json()

    def script(self, body: dict[str, Any]) -> None:
        self.http.post(f"{self.control}/script", json=body, timeout=120).raise_for_status()

    def cpu_seconds(self) -> float:
        return proc_cpu_seconds(self.popen.pid)

    def tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(10)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(5)


def submit_jobs(url: str, n: int, threads: int) -> list[str]:
    """POST /run n times, ``threads`` at a time; the fake's job ids in submission order."""
    local = threading.local()
    body = {"input": {}, "policy": {"executionTimeout": POLICY_MS, "ttl": POLICY_MS}}

    def one(_: int) -> str:
        session = getattr(local, "session", None) or requests.Session()
        local.session = session
        resp = session.post(
            f"{url}/{ENDPOINT}/run",
            json=body,
            headers={"Authorization": f"Bearer {API_KEY}"},
            timeout=30,
        )
        if resp.status_code != 200:
            raise BenchError(f"POST /run: HTTP {resp.status_code}: {resp.text[:300]}")
        return str(resp.json()["id"])

    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(one, range(n)))


def proc_cpu_seconds(pid: int) -> float:
    """utime + stime of a process from /proc (0 if it cannot be read)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def busy_seconds() -> float:
    """CPU seconds all CPUs spent not idle (not waiting for I/O either), from /proc/stat."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except OSError:
        return 0.0
    idle = fields[3] + fields[4]  # idle, iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def self_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# --- the poller -----------------------------------------------------------------------------


@dataclass
class Cycle:
    started: float  # unix time
    seconds: float
    polled: int
    http_seconds: float = 0.0  # inside adapter.poll: the status calls
    http_cpu: float = 0.0  # this process's CPU while they ran
    cpu: float = 0.0


@dataclass
class Timing:
    """What the adapter did, seen by wrapping RunpodServerless.poll and ._status (the code
    under test is not changed): the current cycle's time in poll(), and per RunPod job the
    unix time of every answered status call with the state it reported."""

    seconds: float = 0.0
    cpu: float = 0.0
    answers: dict[str, list[tuple[float, str]]] = field(default_factory=dict)


class LogCounter(logging.Handler):
    """Counts the poller's log records (e.g. "status ... unknown this cycle") and keeps the
    first few warnings, instead of printing thousands of lines."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.counts: Counter[str] = Counter()
        self.samples: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        key = f"{record.levelname} {record.name}: {str(record.msg)[:60]}"
        self.counts[key] += 1
        if record.levelno >= logging.WARNING and len(self.samples) < 5:
            self.samples.append(record.getMessage()[:300])


def instrument_poll(timing: Timing) -> None:
    """Time RunpodServerless.poll (the status-calls phase of a cycle: wall and process CPU)
    and note when each status call was answered."""
    from providers.runpod_serverless import RunpodServerless

    poll, status = RunpodServerless.poll, RunpodServerless._status

    def timed_poll(self: RunpodServerless, handles: Any) -> Any:
        t0, c0 = time.perf_counter(), self_cpu_seconds()
        try:
            return poll(self, handles)
        finally:
            timing.seconds += time.perf_counter() - t0
            timing.cpu += self_cpu_seconds() - c0

    def noted_status(self: RunpodServerless, handle: Any) -> Any:
        got = status(self, handle)
        if got is not None:  # list.append is atomic: the pool's threads may share it
            timing.answers.setdefault(got[0], []).append((time.time(), got[1].status.value))
        return got

    RunpodServerless.poll = timed_poll  # type: ignore[method-assign]
    RunpodServerless._status = noted_status  # type: ignore[method-assign]


def run_poller(
    start: float, duration: float, interval: float, profile: str
) -> tuple[list[Cycle], Timing]:
    """Beat's schedule: a cycle at start, start + interval, ...; one that overruns its tick
    delays the next, which starts right after it. No cycle starts after start + duration."""
    from jobs.services.cloud.polling import attempts_poll_target

    timing = Timing()
    instrument_poll(timing)
    profiler = None
    if profile:
        import cProfile

        profiler = cProfile.Profile()
    cycles: list[Cycle] = []
    tick = start
    while tick < start + duration:
        time.sleep(max(0.0, tick - time.time()))
        timing.seconds = timing.cpu = 0.0
        t0, c0, w0 = time.perf_counter(), self_cpu_seconds(), time.time()
        if profiler is not None:
            profiler.enable()
        polled = attempts_poll_target(target=TARGET)
        if profiler is not None:
            profiler.disable()
        cycle = Cycle(w0, time.perf_counter() - t0, polled, timing.seconds, timing.cpu)
        cycle.cpu = self_cpu_seconds() - c0
        cycles.append(cycle)
        tick += interval
        tick = max(tick, time.time())  # overran: the next starts now
    time.sleep(max(0.0, start + duration - time.time()))  # the window is at least `duration`
    if profiler is not None:
        profiler.dump_stats(profile)
    return cycles, timing


# --- report ---------------------------------------------------------------------------------


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def machine() -> str:
    # The code under test, whatever the commit says (a dirty tree changes under a bench).
    digest = hashlib.sha256()
    for name in POLLER_FILES:
        digest.update((ROOT / name).read_bytes())
    return f"{common_machine(ROOT)}, poller files sha256 {digest.hexdigest()[:12]}"


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


@dataclass
class Result:
    window: float
    interval: float
    cycles: list[Cycle]
    staleness: list[float]
    unseen: int
    stats: dict[str, Any]
    cpu: float
    fake_cpu: float
    pg_cpu: float
    logs: LogCounter
    started: list[float]  # every attempt's started_at that is set (unix time)
    busy: float  # all CPUs' busy seconds over the window (/proc/stat), every process
    detect: list[float]  # change -> the status call that first answered IN_PROGRESS
    apply: list[float]  # that answer -> started_at
    gaps: dict[str, list[float]]  # seconds between two answered calls for one job, by state


def report(r: Result) -> None:
    cyc = r.cycles
    polled = [c.polled for c in cyc]
    print(f"\nPoll cycles over {r.window:.0f} s: {len(cyc)} run")
    print(
        f"  duration s: mean {statistics.fmean(c.seconds for c in cyc):.2f}  "
        f"max {max(c.seconds for c in cyc):.2f}  (status calls phase: mean "
        f"{statistics.fmean(c.http_seconds for c in cyc):.2f}, rest mean "
        f"{statistics.fmean(c.seconds - c.http_seconds for c in cyc):.2f})"
    )
    print(
        f"  attempts polled per cycle: mean {statistics.fmean(polled):.0f}  min {min(polled)}  "
        f"max {max(polled)}  total {sum(polled)}; longer than the interval: "
        f"{sum(1 for c in cyc if c.seconds > r.interval)}"
    )
    print(
        "  per cycle: start s, duration s, polled, moved to running, status-calls phase s, "
        "CPU s, of which in the status-calls phase:"
    )
    t0 = cyc[0].started
    for c in cyc:
        moved = sum(1 for s in r.started if c.started <= s <= c.started + c.seconds)
        print(
            f"    {c.started - t0:6.1f} {c.seconds:6.2f} {c.polled:5d} {moved:5d} "
            f"{c.http_seconds:6.2f} {c.cpu:6.2f} {c.http_cpu:6.2f}"
        )

    stale = r.staleness
    print(
        f"\nStatus staleness (IN_QUEUE -> IN_PROGRESS to started_at), {len(stale)} changes in the "
        f"window, {r.unseen} not yet applied at the end (counted as end - change):"
    )
    p50, p95 = percentile(stale, 50), percentile(stale, 95)
    print(f"  p50 {p50:.1f} s  p95 {p95:.1f} s  max {max(stale):.1f} s  mean "
          f"{statistics.fmean(stale):.1f} s; jobs moved to running: {len(r.started)}")  # fmt: skip

    def spread(values: list[float]) -> str:
        if not values:
            return "none"
        return (
            f"p50 {percentile(values, 50):.1f}  p95 {percentile(values, 95):.1f}  "
            f"max {max(values):.1f}  (n={len(values)})"
        )

    print(f"  of which: change -> first status call answering IN_PROGRESS  {spread(r.detect)}")
    print(f"            that answer -> started_at written                 {spread(r.apply)}")
    print("  time between two polls of one job (s), by the state the first one saw:")
    for state, values in r.gaps.items():
        print(f"    {state:<8} {spread(values)}")

    st = r.stats
    calls = st["calls"].get("status", 0)
    limited, injected = st["429"]["rate_limit"], st["429"]["injected"]
    window_max = st["max_window_calls"].get("status", 0)
    print(
        f"\nRunPod (the fake): {calls} status calls ({calls / r.window:.0f}/s), 429s from the rate "
        f"limit {limited} (injected {injected}), most status calls in any 10 s window "
        f"{window_max} (limit {STATUS_LIMIT}); responses {st['responses']}"
    )
    share = r.cpu / r.window
    print(
        f"\nCPU over the window (share of one core): poller {share:.1%} ({r.cpu:.1f} s); fake "
        f"RunPod {r.fake_cpu / r.window:.1%}; the poller's PostgreSQL backend "
        f"{r.pg_cpu / r.window:.1%}; all processes on the machine {r.busy / r.window:.0%} of one "
        f"core ({os.cpu_count()} cores)."
    )
    if r.logs.counts:
        print("  poller log records: " + "; ".join(f"{k} x{v}" for k, v in r.logs.counts.items()))
    for sample in r.logs.samples:
        print(f"    e.g. {sample}")

    over_ok = limited == 0 and window_max <= STATUS_LIMIT
    print("\nSummary:")
    print(f"  never over RunPod's limit (0 rate-limit 429s, <= {STATUS_LIMIT} calls per 10 s): "
          f"{verdict(over_ok)} ({limited} 429s, max {window_max} per 10 s)")  # fmt: skip
    print(f"  status staleness p95 <= {GOAL_STALENESS_P95:.0f} s: "
          f"{verdict(p95 <= GOAL_STALENESS_P95)} (p95 {p95:.1f} s, p50 {p50:.1f} s)")  # fmt: skip
    print(f"  poller CPU <= {GOAL_CPU_SHARE:.0%} of a core: "
          f"{verdict(share <= GOAL_CPU_SHARE)} ({share:.1%})")  # fmt: skip


# --- main -----------------------------------------------------------------------------------


def setup_django(args: argparse.Namespace, fake_url: str, tmp: Path) -> None:
    from cryptography.fernet import Fernet

    os.environ.update({
        "DJANGO_SETTINGS_MODULE": "trainhub.settings",
        "DATABASE_URL": args.url,
        "CELERY_BROKER_URL": args.redis_url,  # nothing is sent; keeps the embedded broker off
        "TRAINHUB_LOCK_REDIS_URL": args.redis_url,
        "RUNPOD_SERVERLESS_URL": fake_url,
        "RUNPOD_ENDPOINT_ID": ENDPOINT,
        "DJANGO_SECRET_KEY": SECRET_KEY,
        "TRAINHUB_ENCRYPTION_KEYS": Fernet.generate_key().decode(),
        "TRAINHUB_VAR_DIR": str(tmp / "var"),
        "TRAINHUB_STORAGE_DIR": str(tmp / "storage"),
        "TRAINHUB_LOG_LEVEL": "WARNING",
    })  # fmt: skip
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def measure(args: argparse.Namespace, tmp: Path) -> Result:
    rng = random.Random(args.seed)  # noqa: S311 - a reproducible schedule, not crypto
    limiter = redis.Redis.from_url(args.redis_url, socket_timeout=5)
    try:
        limiter.ping()
    except redis.RedisError as exc:
        raise BenchError(f"Redis at {args.redis_url}: {exc}") from exc
    fake = Fake(args.latency, tmp / "fake.log")
    try:
        setup_django(args, fake.url, tmp)
        # Until they are scripted below, jobs stay IN_QUEUE (and run for ever once started).
        fake.script({"default": {"queue_seconds": NEVER, "run_seconds": NEVER}})
        t = time.perf_counter()
        ids = submit_jobs(fake.url, args.jobs, args.submit_threads)
        print(f"submitted {len(ids)} jobs to the fake in {time.perf_counter() - t:.1f} s")
        t = time.perf_counter()
        seed(ids)
        print(f"seeded {len(ids)} jobs and attempts in {time.perf_counter() - t:.1f} s")
        if stale_keys := list(limiter.scan_iter("trainhub:ratelimit:*")):
            limiter.delete(*stale_keys)  # an earlier run's bookings would slow this one

        from django.db import connection

        from jobs.models import JobAttempt

        with connection.cursor() as cur:
            cur.execute("SELECT pg_backend_pid()")
            pg_pid = int(cur.fetchone()[0])
        submitted = {i: ch[0][1] for i, ch in fake.get("status_changes")["jobs"].items()}
        start = time.time() + 2.0
        # Times in the fake count from submission: the changes land 15-150 s into the window.
        fake.script({"jobs": {
            i: {"queue_seconds": start - submitted[i] + rng.uniform(args.queue_min, args.queue_max)}
            for i in ids
        }})  # fmt: skip
        logs = LogCounter()
        for name in ("providers", "jobs"):
            logger = logging.getLogger(name)
            logger.setLevel(logging.INFO)
            logger.propagate = False
            logger.addHandler(logs)
        print(f"polling for {args.duration:.0f} s, a cycle every {args.interval:g} s...")
        time.sleep(max(0.0, start - time.time()))
        cpu0, fake0, pg0, busy0, w0 = (
            self_cpu_seconds(), fake.cpu_seconds(), proc_cpu_seconds(pg_pid), busy_seconds(),
            time.time(),
        )  # fmt: skip
        cycles, timing = run_poller(start, args.duration, args.interval, args.profile)
        end = time.time()
        cpu, fake_cpu = self_cpu_seconds() - cpu0, fake.cpu_seconds() - fake0
        pg_cpu, busy = proc_cpu_seconds(pg_pid) - pg0, busy_seconds() - busy0
        if fake.popen.poll() is not None:
            raise BenchError(f"the fake RunPod exited:\n{fake.tail()}")
        changes = fake.get("status_changes")["jobs"]
        stats = fake.get("stats")
    finally:
        fake.stop()

    started_at = {
        i: s.timestamp() if s else None
        for i, s in JobAttempt.objects.values_list("provider_instance_id", "started_at")
    }
    staleness, detect, apply, unseen = [], [], [], 0
    for job_id, steps in changes.items():
        changed = next((ts for st, ts in steps if st == "IN_PROGRESS"), None)
        if changed is None or not w0 <= changed <= end:
            continue
        seen = started_at.get(job_id)
        if seen is None:
            unseen += 1
            staleness.append(end - changed)
            continue
        staleness.append(seen - changed)
        answered = [t for t, st in timing.answers.get(job_id, []) if st == "running"]
        if answered:
            detect.append(answered[0] - changed)
            apply.append(seen - answered[0])
    gaps: dict[str, list[float]] = {"pending": [], "running": []}
    for answers in timing.answers.values():
        for (t1, st), (t2, _) in pairwise(answers):
            gaps.setdefault(st, []).append(t2 - t1)
    if not staleness or not cycles:
        raise BenchError("no status change fell inside the window; raise --duration")
    return Result(
        end - w0,
        args.interval,
        cycles,
        staleness,
        unseen,
        stats,
        cpu,
        fake_cpu,
        pg_cpu,
        logs,
        [v for v in started_at.values() if v is not None],
        busy,
        detect,
        apply,
        gaps,
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=5000, help="live RunPod jobs (default 5000)")
    ap.add_argument("--duration", type=float, default=180.0, help="seconds polled (default 180)")
    ap.add_argument("--interval", type=float, default=10.0, help="beat's tick (default 10 s)")
    ap.add_argument("--latency", type=float, default=0.05, help="fake's s per call (0.05)")
    ap.add_argument("--queue-min", type=float, default=15.0, help="earliest start, s (15)")
    ap.add_argument("--queue-max", type=float, default=150.0, help="latest start, s (150)")
    ap.add_argument("--submit-threads", type=int, default=32)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--profile", default="", help="cProfile the cycles' main thread into FILE")
    ap.add_argument("--database-url", help=f"default: see the module docstring ({DB_NAME})")
    ap.add_argument("--redis-url", default=DEFAULT_REDIS, help="the rate limiter's Redis")
    ap.add_argument("--keep-logs", action="store_true", help="keep the temp dir")
    args = ap.parse_args()
    if args.jobs < 1 or args.duration <= 0 or args.interval <= 0:
        ap.error("--jobs, --duration and --interval must be positive")
    if not 0 <= args.queue_min <= args.queue_max:
        ap.error("need 0 <= --queue-min <= --queue-max")
    args.url = bench_database_url(args.database_url, env="BENCH_POLL_DATABASE_URL", name=DB_NAME)
    if "poll_bench" not in urlsplit(args.url).path:
        ap.error(f"refusing to drop {args.url}: the database's name must contain 'poll_bench'")
    if args.redis_url.rstrip("/").endswith("/1"):
        ap.error("--redis-url: Redis database 1 is the tests'; use another (default /5)")

    def interrupted(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupted)
    began = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="trainhub-poll-"))
    ok = False
    try:
        pg = database_recreate(args.url)
        print(f"{machine()}\n{pg}; rate limiter Redis {args.redis_url}; work dir {tmp}")
        print(
            f"{args.jobs} jobs, fake RunPod {args.latency * 1000:.0f} ms per call, status limit "
            f"{STATUS_LIMIT}/10 s; starts {args.queue_min:g}-{args.queue_max:g} s into the window"
        )
        report(measure(args, tmp))
        ok = True
    except (BenchError, psycopg.Error, redis.RedisError, requests.RequestException) as exc:
        print(f"\nerror: {exc}", file=sys.stderr)
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
    finally:
        if args.keep_logs:
            print(f"logs kept in {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"\ntotal run time {time.monotonic() - began:.0f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
