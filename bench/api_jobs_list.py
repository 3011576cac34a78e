"""Latency of the jobs list and job events API on PostgreSQL, through gunicorn and real HTTP.

Seeds (once) a dedicated database with 100,000 jobs in one project and one job with 10,000
events, starts ``gunicorn trainhub.wsgi -w 2``, and times N sequential requests per scenario
with a bearer key. Prints p50/p95/p99/max and PASS/FAIL against the p95 goal (50 ms), plus the
SQL queries each request makes (counted in-process). Always exits 0 unless it could not run.

    .venv/bin/python bench/api_jobs_list.py [--reseed] [--requests 200] [--explain]
        [--warmup 20] [--workers 2] [--jobs 100000] [--events 10000] [--database-url URL]

``make bench`` runs it with the defaults. About 30 s (22 s with the seed reused).

Database: ``--database-url``, else ``BENCH_DATABASE_URL``, else ``DATABASE_URL`` with ``_bench``
appended to its database name (so ``make bench``, which exports the test database's URL, never
seeds it), else ``postgres://postgres@127.0.0.1:5432/trainhub_bench``. Created if missing.

Scenarios (``<id>`` is the job with the events):

    jobs first page      GET /api/v1/jobs/?limit=20
    jobs deep page       GET /api/v1/jobs/?limit=20&after=<the job 90,000 rows below the newest>
    jobs status=queued   GET /api/v1/jobs/?status=queued&limit=20   (2,954 queued jobs)
    events first page    GET /api/v1/jobs/<id>/events/?limit=100
    events deep page     GET /api/v1/jobs/<id>/events/?limit=100&after=ftevent-...-9900

Method:

1. Database. The bench creates its database with psycopg if needed, runs ``migrate`` and seeds
   once. Later runs check the row counts and reuse the seed; ``--reseed`` drops the database
   and builds it again. ``ANALYZE`` runs before every measurement.
2. Seed, bulk-loaded with ``COPY`` (psycopg ``cursor.copy``), about 10 s:
   - one user, one project and one processed ``TrainingFile``; about 25% of the jobs also use
     that file as their validation file, so the LEFT JOIN finds a row;
   - 100,000 ``TrainingJob`` rows created over one year, ids in creation order. Statuses:
     succeeded 60%, failed 19% (with error codes and messages), cancelled 14%, queued 3%,
     running 1.5%, provisioning 1%, validating_files / finalizing / cancelling 0.5% each.
     Targets: local 45%, runpod 30%, lambda 15%, vastai 10%. Six base models. The adapter,
     hyperparameters and ``latest_metrics`` JSON are filled in realistically;
   - one recent succeeded job (the 51st newest) with a ``JobAttempt`` and 10,000 ``JobEvent``
     rows numbered 1..10000: control-plane status events on attempt 0 with seq = number, the
     executor's stream on attempt 1 with seq 0.. (metrics 66%, log 32%, heartbeat, checkpoint,
     artifact); ``(job, attempt, seq)`` is unique.
   The jobs table is 74 MB of heap, 118 MB with its indexes: it fits in ``shared_buffers``, so
   every run is warm-cache.
3. Server. ``gunicorn trainhub.wsgi -b 127.0.0.1:<free port> -w 2`` with the bench's
   ``DATABASE_URL`` and the default ``CONN_MAX_AGE=60`` (each worker keeps its connection),
   stopped in a ``finally`` block.
4. Client. A ``requests.Session`` sends ``Authorization: Bearer <key>`` with a fresh key from
   ``api_key_create``; the previous run's keys are revoked. Warm-up: 20 rounds over all five
   paths (so both workers have served every path), then 5 more requests per scenario. Then
   200 sequential requests per scenario, each timed with ``perf_counter`` around ``get()``
   plus reading the body and checked for HTTP 200 and the expected row count. Percentiles are
   nearest-rank. gunicorn's sync worker closes the connection after each response, so every
   request includes a loopback TCP connect.
5. In-process figures, from the same script: ``queries`` (the SQL statements of one request,
   from ``CaptureQueriesContext`` and ``django.test.Client(HTTP_HOST="localhost")``), ``sql``
   (the median of their summed round trips, from ``connection.execute_wrapper``) and
   ``in-proc`` (the p50 of 100 requests through ``django.test.Client``: no HTTP, no gunicorn).
6. ``--explain`` prints every statement with ``EXPLAIN (ANALYZE, BUFFERS)``.

Figures: docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import requests
from psycopg import sql

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repo: devsupport, trainhub
from devsupport.processes import free_port
from devsupport.readiness import NotReady, wait_http_ready

ROOT = Path(__file__).resolve().parent.parent
READY_TIMEOUT = 90.0  # gunicorn importing Django on a busy 2-core machine
DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/trainhub_bench"
GOAL_P95_MS = 50.0
PROJECT_SLUG = "bench"
USERNAME = "bench"

# status -> share of jobs. Mostly finished work, a thin live slice, as in a long-lived project.
STATUS_MIX = {
    "succeeded": 0.60,
    "failed": 0.19,
    "cancelled": 0.14,
    "queued": 0.03,
    "running": 0.015,
    "provisioning": 0.01,
    "validating_files": 0.005,
    "finalizing": 0.005,
    "cancelling": 0.005,
}
TARGETS = {"local": 0.45, "runpod": 0.30, "lambda": 0.15, "vastai": 0.10}
MODELS = [
    "meta-llama/Llama-3.1-8B-Instruct",
    "Qwen/Qwen2.5-7B-Instruct",
    "mistralai/Mistral-7B-Instruct-v0.3",
    "google/gemma-2-9b-it",
    "unsloth/Llama-3.2-3B-Instruct",
    "Qwen/Qwen2.5-0.5B-Instruct",
]
FAILURES = [
    ("oom", "CUDA out of memory while allocating 2.00 GiB; lower batch_size or max_seq_length."),
    ("invalid_dataset", "Line 1812: 'messages' must be a non-empty list of {role, content}."),
    ("timeout", "The job ran past max_runtime_seconds and was stopped."),
    ("provider_error", "runpod: pod terminated by the provider (host maintenance)."),
    ("download_failed", "Could not download the base model after 3 tries (HTTP 503)."),
]


# --- database -------------------------------------------------------------------------------


def bench_database_url(cli: str | None) -> str:
    if cli:
        return cli
    if os.environ.get("BENCH_DATABASE_URL"):
        return os.environ["BENCH_DATABASE_URL"]
    url = os.environ.get("DATABASE_URL", "")
    if url.startswith(("postgres://", "postgresql://")):
        parts = urlsplit(url)
        name = parts.path.lstrip("/") or "trainhub"
        if not name.endswith("_bench"):
            name += "_bench"
        return urlunsplit(parts._replace(path="/" + name))
    return DEFAULT_URL


def _admin_url(url: str) -> tuple[str, str]:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/postgres")), parts.path.lstrip("/")


def database_create(url: str, *, drop: bool) -> None:
    admin, name = _admin_url(url)
    with psycopg.connect(admin, autocommit=True) as conn:
        if drop:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone() is None:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
            print(f"created database {name}")


# --- seed -----------------------------------------------------------------------------------


def _pick(rng: random.Random, weights: dict[str, float]) -> str:
    return rng.choices(list(weights), weights=list(weights.values()))[0]


def _copy(conn: psycopg.Connection, model: Any, rows: Iterator[dict[str, Any]]) -> int:
    """COPY rows (dicts keyed by attname) into ``model``'s table; unset fields get the model's
    default, so a new column with a default does not break the seed."""
    from django.db import models
    from psycopg.types.json import Jsonb

    fields = [f for f in model._meta.concrete_fields if not f.primary_key]
    is_json = [isinstance(f, models.JSONField) for f in fields]
    stmt = sql.SQL("COPY {} ({}) FROM STDIN").format(
        sql.Identifier(model._meta.db_table),
        sql.SQL(", ").join(sql.Identifier(f.column) for f in fields),
    )
    n = 0
    with conn.cursor() as cur, cur.copy(stmt) as copy:
        for row in rows:
            values = []
            for f, js in zip(fields, is_json, strict=True):
                v = row[f.attname] if f.attname in row else f.get_default()
                values.append(Jsonb(v) if js and v is not None else v)
            copy.write_row(values)
            n += 1
    return n


def _job_rows(
    rng: random.Random, n: int, *, project_id: int, user_id: int, file_id: int, now: datetime
) -> Iterator[dict[str, Any]]:
    from trainhub_contract.spec import AdapterSpec, Hyperparameters

    adapter, hyper = AdapterSpec().to_dict(), Hyperparameters().to_dict()
    start = now - timedelta(days=365)
    step = timedelta(days=365) / n
    for i in range(n):
        status = _pick(rng, STATUS_MIX)
        created = start + step * i
        row: dict[str, Any] = {
            "project_id": project_id,
            "created_by_id": user_id,
            "model": rng.choice(MODELS),
            "training_file_id": file_id,
            "validation_file_id": file_id if rng.random() < 0.25 else None,
            "adapter": {**adapter, "r": rng.choice([8, 16, 32]), "alpha": rng.choice([16, 32, 64])},
            "hyperparameters": {
                **hyper,
                "n_epochs": rng.randint(1, 5),
                "learning_rate": rng.choice([1e-4, 2e-4, 5e-5]),
            },
            "seed": 42,
            "suffix": rng.choice(["", "", "support-bot", f"exp-{i % 997}"]),
            "target": _pick(rng, TARGETS),
            "max_runtime_seconds": 24 * 3600,
            "max_attempts": 3,
            "status": status,
            "created_at": created,
            "event_counter": 0,
        }
        if status not in ("validating_files", "queued") and not (
            status == "cancelled" and rng.random() < 0.4
        ):
            row["started_at"] = created + timedelta(seconds=rng.randint(5, 900))
        if status in ("succeeded", "failed", "cancelled"):
            begun = row.get("started_at", created)
            row["finished_at"] = begun + timedelta(seconds=rng.randint(60, 8 * 3600))
        if status in ("succeeded", "failed", "running", "finalizing"):
            total = rng.randint(200, 5000)
            done = total if status in ("succeeded", "finalizing") else rng.randint(1, total)
            row["latest_metrics"] = {
                "step": done,
                "total_steps": total,
                "epoch": round(3 * done / total, 2),
                "loss": round(rng.uniform(0.3, 2.2), 4),
                "lr": 2e-4,
                "tokens_per_second": round(rng.uniform(800, 9000), 1),
                "grad_norm": round(rng.uniform(0.1, 3), 3),
            }
        if status == "succeeded":
            row["trained_tokens"] = rng.randint(100_000, 200_000_000)
        if status == "failed":
            row["error_code"], row["error_message"] = rng.choice(FAILURES)
        yield row


def _event_rows(
    rng: random.Random, n: int, *, job_id: int, t0: datetime
) -> Iterator[dict[str, Any]]:
    """A plausible life: control-plane status events (attempt 0, seq = number), then attempt 1's
    executor stream (metrics, logs, heartbeats, checkpoints), then finalizing/succeeded."""
    head = [
        "Job created; validating files.",
        "Job is queued.",
        "Job is provisioning.",
        "Job is running.",
    ]
    tail_status = ["Job is finalizing.", "Job is succeeded."]
    body = n - len(head) - len(tail_status) - 1  # -1: the artifact event
    total_steps = body * 2 // 3

    def ev(
        number: int,
        attempt: int,
        seq: int,
        type_: str,
        message: str,
        level: str = "info",
        data: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        return {
            "job_id": job_id,
            "attempt": attempt,
            "seq": seq,
            "number": number,
            "type": type_,
            "level": level,
            "message": message,
            "data": data or {},
            "created_at": t0 + timedelta(seconds=2 * number),
        }

    number = 0
    for msg in head:
        number += 1
        yield ev(number, 0, number, "status", msg, data={"status": msg.split()[-1].rstrip(".")})
    step = 0
    for seq in range(body):
        number += 1
        if seq % 60 == 59:
            yield ev(
                number, 1, seq, "heartbeat", "alive", "debug", {"gpu_util": rng.randint(80, 100)}
            )
        elif seq % 500 == 499:
            yield ev(
                number,
                1,
                seq,
                "checkpoint",
                f"Saved checkpoint-{step}.",
                "info",
                {"step": step, "path": f"checkpoints/checkpoint-{step}"},
            )
        elif seq % 3 == 2:
            level = "warning" if rng.random() < 0.01 else "info"
            yield ev(
                number,
                1,
                seq,
                "log",
                f"[trainer] step {step}: grad accumulation done, mem {rng.uniform(30, 70):.1f} GiB",
                level,
            )
        else:
            step += 1
            loss = round(2.4 * math.exp(-step / (total_steps / 3)) + rng.uniform(0.2, 0.35), 4)
            yield ev(
                number,
                1,
                seq,
                "metrics",
                f"step {step}/{total_steps} loss {loss}",
                "info",
                {
                    "step": step,
                    "total_steps": total_steps,
                    "epoch": round(3 * step / total_steps, 3),
                    "loss": loss,
                    "lr": 2e-4,
                    "tokens_per_second": round(rng.uniform(3000, 4200), 1),
                    "grad_norm": round(rng.uniform(0.2, 1.5), 3),
                    "trained_tokens": step * 8192,
                },
            )
    number += 1
    yield ev(
        number,
        1,
        body,
        "artifact",
        "Uploaded adapter (adapter.tar, 161.2 MB).",
        "info",
        {"kind": "adapter", "filename": "adapter.tar", "bytes": 161_200_000},
    )
    for msg in tail_status:
        number += 1
        yield ev(number, 0, number, "status", msg, data={"status": msg.split()[-1].rstrip(".")})


@dataclass
class Seed:
    project_id: int
    events_job: str  # public id of the job with the events


def seed_find(n_jobs: int, n_events: int) -> Seed | None:
    from jobs.models import JobEvent, Project, TrainingFile, TrainingJob

    project = Project.objects.filter(slug=PROJECT_SLUG).first()
    if project is None:
        return None
    job = TrainingJob.objects.filter(project=project, event_counter=n_events).first()
    ok = (
        TrainingJob.objects.filter(project=project).count() == n_jobs
        and job is not None
        and JobEvent.objects.filter(job=job).count() == n_events
        and TrainingFile.objects.filter(project=project, status="processed").exists()
    )
    return Seed(project.pk, job.public_id) if ok and job else None


def seed_create(url: str, n_jobs: int, n_events: int) -> Seed:
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from jobs.models import JobAttempt, JobEvent, TrainingFile, TrainingJob
    from jobs.services.accounts.projects import project_create

    rng = random.Random(20240601)  # noqa: S311 - reproducible fake data, not security
    now = timezone.now()
    user = get_user_model().objects.create_user(username=USERNAME, password=None)
    project = project_create(name=PROJECT_SLUG, owner=user, default=True)
    tfile = TrainingFile.objects.create(
        project=project,
        created_by=user,
        filename="support-chats.jsonl",
        bytes=48_213_771,
        sha256="9f2c" * 16,
        storage_key=f"files/{project.pk}/support-chats.jsonl",
        status=TrainingFile.Status.PROCESSED,
        format="chat",
        example_count=52_000,
        token_estimate=31_400_000,
        processed_at=now - timedelta(days=366),
    )
    t = time.perf_counter()
    with psycopg.connect(url) as conn:
        jobs = _job_rows(
            rng, n_jobs, project_id=project.pk, user_id=user.pk, file_id=tfile.pk, now=now
        )
        n = _copy(conn, TrainingJob, jobs)
        conn.commit()
    print(f"seeded {n:,} jobs in {time.perf_counter() - t:.1f}s")

    # The events job: a recent, long, successful run on a cloud target.
    job = TrainingJob.objects.filter(project=project).order_by("-pk")[50:51].get()
    t0 = now - timedelta(days=2)
    TrainingJob.objects.filter(pk=job.pk).update(
        status="succeeded",
        target="runpod",
        event_counter=n_events,
        error_code="",
        error_message="",
        started_at=t0 + timedelta(seconds=8),
        finished_at=t0 + timedelta(seconds=2 * n_events),
        trained_tokens=n_events * 4096,
    )
    JobAttempt.objects.create(
        job=job,
        number=1,
        target="runpod",
        provider_instance_id="pod-bench",
        started_at=t0,
        ended_at=t0 + timedelta(seconds=2 * n_events),
        end_reason="succeeded",
    )
    t = time.perf_counter()
    with psycopg.connect(url) as conn:
        n = _copy(conn, JobEvent, _event_rows(rng, n_events, job_id=job.pk, t0=t0))
        conn.commit()
    print(f"seeded {n:,} events for {job.public_id} in {time.perf_counter() - t:.1f}s")
    return Seed(project.pk, job.public_id)


# --- measurement ----------------------------------------------------------------------------


def percentile(sorted_ms: list[float], p: float) -> float:
    """Nearest-rank percentile."""
    return sorted_ms[max(0, math.ceil(p / 100 * len(sorted_ms)) - 1)]


@dataclass
class Scenario:
    name: str
    path: str
    expect_rows: int


def scenarios(seed: Seed) -> list[Scenario]:
    from api.presenters import event_id
    from jobs.models import TrainingJob

    deep = (
        TrainingJob.objects.filter(project_id=seed.project_id)
        .order_by("-pk")
        .values_list("public_id", flat=True)[90_000]
    )
    return [
        Scenario("jobs first page", "/api/v1/jobs/?limit=20", 20),
        Scenario("jobs deep page (~90,000)", f"/api/v1/jobs/?limit=20&after={deep}", 20),
        Scenario("jobs status=queued", "/api/v1/jobs/?status=queued&limit=20", 20),
        Scenario("events first page", f"/api/v1/jobs/{seed.events_job}/events/?limit=100", 100),
        Scenario(
            "events deep page (~9,900)",
            f"/api/v1/jobs/{seed.events_job}/events/?limit=100&after={event_id(seed.events_job, 9900)}",
            100,
        ),
    ]


@dataclass
class InProcess:
    queries: int  # SQL statements one request makes
    sql_ms: float  # their summed round trips to PostgreSQL, as Django sees them
    p50_ms: float  # the whole request in-process (django.test.Client: no HTTP, no gunicorn)


def in_process(
    scs: list[Scenario], raw_key: str, explain: bool, n: int = 100
) -> dict[str, InProcess]:
    """Queries per request (CaptureQueriesContext) and in-process time, to split the HTTP figure
    into database, Django/DRF and transport."""
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    client = Client(HTTP_HOST="localhost", HTTP_AUTHORIZATION=f"Bearer {raw_key}")
    sql_s: list[float] = []

    def timed(execute: Any, sql_: str, params: Any, many: bool, context: Any) -> Any:
        t = time.perf_counter()
        try:
            return execute(sql_, params, many, context)
        finally:
            sql_s.append(time.perf_counter() - t)

    out = {}
    for sc in scs:
        for _ in range(10):  # warm; the key's last_used_at write happens at most once a minute
            client.get(sc.path)
        with CaptureQueriesContext(connection) as ctx:
            resp = client.get(sc.path)
        captured = list(ctx.captured_queries)  # copy: the next request_started clears the log
        if resp.status_code != 200:
            raise SystemExit(f"{sc.path}: HTTP {resp.status_code}: {resp.content[:300]!r}")
        total, sql_total = [], []
        with connection.execute_wrapper(timed):
            for _ in range(n):
                sql_s.clear()
                t = time.perf_counter()
                client.get(sc.path)
                total.append((time.perf_counter() - t) * 1000)
                sql_total.append(sum(sql_s) * 1000)
        out[sc.name] = InProcess(
            len(captured), sorted(sql_total)[n // 2], percentile(sorted(total), 50)
        )
        if explain:
            print(f"\n-- {sc.name}: {sc.path}")
            with connection.cursor() as cur:
                for q in captured:
                    print(q["sql"])
                    if q["sql"].lstrip().upper().startswith("SELECT"):
                        cur.execute("EXPLAIN (ANALYZE, BUFFERS) " + q["sql"])
                        print("\n".join("    " + r[0] for r in cur.fetchall()))
    return out


def gunicorn_start(url: str, port: int, workers: int, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": "trainhub.settings"}
    cmd = [
        str(Path(sys.executable).parent / "gunicorn"),
        "trainhub.wsgi",
        "-b",
        f"127.0.0.1:{port}",
        "-w",
        str(workers),
        "--log-level",
        "warning",
    ]
    with log.open("wb") as fh:
        return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT)  # noqa: S603


def wait_ready(proc: subprocess.Popen[bytes], http: requests.Session, base: str, log: Path) -> None:
    """Until gunicorn serves the jobs list (200 with the bench key); exits saying why if not."""
    try:
        wait_http_ready(
            f"{base}/api/v1/jobs/?limit=1", timeout=READY_TIMEOUT, session=http, proc=proc, log=log
        )
    except NotReady as exc:
        raise SystemExit(f"gunicorn is not serving: {exc}") from None


def measure(http: requests.Session, base: str, sc: Scenario, n: int, warmup: int) -> list[float]:
    for _ in range(warmup):
        http.get(base + sc.path, timeout=10)
    ms = []
    for _ in range(n):
        t = time.perf_counter()
        resp = http.get(base + sc.path, timeout=10)
        body = resp.content
        ms.append((time.perf_counter() - t) * 1000)
        if resp.status_code != 200:
            raise SystemExit(f"{sc.path}: HTTP {resp.status_code}: {body[:300]!r}")
    rows = len(json.loads(body)["data"])
    if rows != sc.expect_rows:
        print(f"warning: {sc.name} returned {rows} rows, expected {sc.expect_rows}")
    return sorted(ms)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--database-url", help=f"default: see module docstring ({DEFAULT_URL})")
    ap.add_argument("--reseed", action="store_true", help="drop the bench database and seed again")
    ap.add_argument("--jobs", type=int, default=100_000)
    ap.add_argument("--events", type=int, default=10_000)
    ap.add_argument("--requests", type=int, default=200, help="timed requests per scenario")
    ap.add_argument("--warmup", type=int, default=20, help="untimed rounds over all paths")
    ap.add_argument("--workers", type=int, default=2, help="gunicorn workers")
    ap.add_argument("--explain", action="store_true", help="print each query with EXPLAIN ANALYZE")
    args = ap.parse_args()
    if args.jobs < 90_100 or args.events < 9_950:
        ap.error("the deep-page scenarios need --jobs >= 90100 and --events >= 9950")

    url = bench_database_url(args.database_url)
    if "bench" not in urlsplit(url).path:
        ap.error(f"refusing to seed {url}: the benchmark database's name must contain 'bench'")
    database_create(url, drop=args.reseed)
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "trainhub.settings")
    # Thousands of requests a minute from one key: counted like any (the throttle's Redis call
    # is part of what is timed) but never refused. gunicorn inherits it.
    os.environ.setdefault("TRAINHUB_API_RATE_LIMIT", "100000000/minute")
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection, connections
    from django.utils import timezone

    from jobs.models import ApiKey, Project
    from jobs.services.accounts.projects import api_key_create, api_key_revoke

    call_command("migrate", verbosity=0)
    seed = seed_find(args.jobs, args.events)
    if seed is None:
        if Project.objects.exists():  # a partial or different seed: start over
            connections.close_all()
            database_create(url, drop=True)
            call_command("migrate", verbosity=0)
        seed = seed_create(url, args.jobs, args.events)
    else:
        print(f"reusing the seed in {urlsplit(url).path.lstrip('/')} (--reseed to rebuild)")
    with connection.cursor() as cur:
        cur.execute("ANALYZE")
        cur.execute("SELECT version()")
        pg_version = cur.fetchone()[0]

    project = Project.objects.get(pk=seed.project_id)
    # Keys of earlier runs (their raw values are gone): revoke, then make this run's key.
    ApiKey.objects.filter(project=project, revoked_at__isnull=True).update(
        revoked_at=timezone.now()
    )
    key, raw = api_key_create(user=project.members.get(), name="bench", project=project)
    scs = scenarios(seed)
    local = in_process(scs, raw, args.explain)
    connections.close_all()

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    http = requests.Session()
    http.headers["Authorization"] = f"Bearer {raw}"
    results: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="trainhub-bench-") as tmp:
        log = Path(tmp) / "gunicorn.log"
        proc = gunicorn_start(url, port, args.workers, log)
        try:
            wait_ready(proc, http, base, log)
            # Warm every worker on every path first (imports, connections, caches): steady
            # state is what is timed; a fresh worker's first requests take several times longer.
            for _ in range(args.warmup):
                for sc in scs:
                    http.get(base + sc.path, timeout=10)
            for sc in scs:
                results[sc.name] = measure(http, base, sc, args.requests, args.warmup // 4)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            http.close()
            api_key_revoke(key=key)

    print(
        f"\n{pg_version.split(' on ')[0]}; {os.cpu_count()} CPUs; gunicorn -w {args.workers}; "
        f"{args.jobs:,} jobs, {args.events:,} events; {args.requests} sequential requests each"
    )
    head = (
        f"{'scenario':<27}{'p50':>7}{'p95':>7}{'p99':>7}{'max':>7}  {f'p95<={GOAL_P95_MS:g}':<7}"
        f"{'queries':>8}{'sql':>6}{'in-proc':>8}"
    )
    print(head)
    print("-" * len(head))
    failed = []
    for sc in scs:
        ms, lp = results[sc.name], local[sc.name]
        p95 = percentile(ms, 95)
        verdict = "PASS" if p95 <= GOAL_P95_MS else "FAIL"
        if verdict == "FAIL":
            failed.append(sc.name)
        print(
            f"{sc.name:<27}{percentile(ms, 50):>7.1f}{p95:>7.1f}{percentile(ms, 99):>7.1f}"
            f"{ms[-1]:>7.1f}  {verdict:<7}{lp.queries:>8}{lp.sql_ms:>6.2f}{lp.p50_ms:>8.1f}"
        )
    print(
        "ms. p50..max: client wall time per HTTP request through gunicorn. queries: SQL per request;\n"
        "sql: their summed round trips (median); in-proc: p50 of the request via django.test.Client."
    )
    print(
        f"\nRESULT: {'FAIL: ' + ', '.join(failed) if failed else 'PASS'} (goal p95 <= {GOAL_P95_MS:.0f} ms)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
