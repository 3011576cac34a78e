"""Dispatch latency of the own GPU fleet: ``POST /api/v1/jobs/`` to the node's task starting.

Starts real processes on one machine: gunicorn (``trainhub.wsgi -w 2``), one control-plane
Celery worker (queue ``default``; prefork ``-c 2`` as in the Procfile, ``--control-pool``) and one
GPU node worker (``celery -A gpu_worker.celery_app``, CPU only) on Redis, with no beat, so only
the event-driven path (the on-commit ``trainhub.dispatch`` message) can place a job. Then, one
job at a time on an idle node, it times:

- **dispatch latency**, per job: ``t0`` = wall clock just before the POST is sent, to the
  attempt's ``claimed_at`` (the claim endpoint's ``timezone.now()``; the node's task, sent the
  attempt's ids only, claims first thing and gets the spec in the answer, so this is an upper
  bound that includes the claim's HTTP round trip), and to the
  node worker's ``Task gpu_worker.run_attempt[...] received`` log line (a lower bound: the task
  starts in the pool child after it). p50/p95/max/mean over ``--jobs`` jobs, PASS/FAIL against
  p50 <= 100 ms. Each job is cancelled through the API as soon as it is claimed.
- **executor process start -> first training step**, on ``--first-step`` jobs that train, in
  two ways: in the fleet (the supervisor's ``starting attempt`` log line, as it hands the
  attempt to the node's warm executor or spawns ``python -m gpu_worker run``, to the ``running``
  status event as stored), and the same
  executor command run by this script on a real attempt spec with a JSON-lines sink, whose
  events keep the executor's own ``ts`` (the control plane does not store it).

    .venv/bin/python bench/dispatch_latency.py [--jobs 50] [--warmup 3] [--first-step 5]
        [--control-pool prefork|solo|threads] [--keep-logs]

Database: ``--database-url``, else ``BENCH_DISPATCH_DATABASE_URL``, else ``DATABASE_URL``'s
server with the database ``trainhub_dispatch_bench``, else that name on 127.0.0.1. It is dropped
and created again on every run (its name must contain ``dispatch_bench``). Broker: ``--broker-url``
(default ``redis://127.0.0.1:6379/3``, not the tests' database). Exits 0 once measured (the
verdict is printed), 1 if it could not run. About 4 minutes on 2 cores (``--first-step 0``:
2 minutes).

How it measures:

- Processes. The control-plane worker runs as ``celery -A trainhub worker -Q default -P prefork
  -c 2 -l info --without-gossip --without-mingle``; the node as ``celery -A
  gpu_worker.celery_app worker -c 1 --prefetch-multiplier 1 -n bench-node@%h -l info
  --without-gossip --without-mingle``, its environment holding the broker and a token from
  ``node_create``, plus ``TRAINHUB_NODE_GPUS=""``, a 1 s heartbeat,
  ``TRAINHUB_NODE_CANCEL_GRACE_SECONDS=1``, ``OMP_NUM_THREADS=1`` and ``HF_HUB_OFFLINE=1``.
  All processes share one ``DJANGO_SECRET_KEY``, a temporary storage directory, and the tiny
  model built offline and allowed through ``TRAINHUB_ALLOWED_MODELS``. The two queues the
  bench uses are purged at start.
- Setup. A user, project and API key through the services; the script waits for the node to
  be ``idle``, uploads the demo chats through the API and waits until the file is
  ``processed``.
- One job at a time. Before each POST the script waits until the ``GpuNode`` row is ``idle``
  and the node worker has logged the end of every earlier ``run_attempt`` task (the row turns
  idle when the attempt ends, a moment before the supervisor returns), then 0.2 s more. The
  POST uses a keep-alive ``requests`` session; the job is the tiny model, LoRA r=8, 1 epoch,
  batch 4. The lower bound's log line is written by the worker's main process before it hands
  the task to its pool child.
- Ending each job. As soon as ``claimed_at`` is set the job is cancelled through the API; with
  the 1 s grace the supervisor SIGTERMs the executor during its imports and the job ends
  ``cancelled``. Each job takes about 3 s.
- Counting. 3 warm-up jobs are not counted (the first job after start takes 130-240 ms); then
  ``--jobs`` are timed. Percentiles are nearest-rank.
- Segments. The interval is split at stamps from the database (``TrainingJob.created_at``,
  ``JobAttempt.created_at``, ``claimed_at``), from the control worker's log (``Task
  trainhub.dispatch[...] received``, and ``dispatched <job> attempt 1 to node ...``, logged
  after the placing transaction committed and the ``run_attempt`` message was published) and
  from the node worker's ``received`` line. The logs have 1 ms resolution; all processes share
  one clock. The script prints medians and means of each segment.
- Executor start -> first step. Each such job trains on the node until its first ``metrics``
  event is stored, and is then cancelled. The script then runs the supervisor's command
  itself, ``python -m gpu_worker run spec.json --workdir ... --cancel-file ...`` with the
  node's environment, on the spec from ``attempt_spec()`` for that attempt (fresh signed URLs,
  so the dataset is downloaded from gunicorn; the fleet's report block with a JSON-lines sink).
  A separate run is needed because the control plane drops the executor's ``ts``. The
  interval runs from ``time.time()`` just before ``Popen`` to the ``ts`` of the first
  ``metrics`` event (taken in the Trainer's ``on_log`` after optimizer step 1): interpreter
  start, imports, backend choice, download with its sha256 check, model load with LoRA,
  tokenization, building the Trainer, and the first step. The in-fleet job gives cross-checks
  from the node's log: the supervisor's ``starting attempt`` line and the executor's
  ``training backend:`` line, written after torch is imported.

Figures: docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repo: devsupport, trainhub
from _common import bench_database_url, database_recreate, machine

from devsupport.processes import free_port
from devsupport.readiness import NotReady, wait_http_ready

ROOT = Path(__file__).resolve().parent.parent
DB_NAME = "trainhub_dispatch_bench"
DEFAULT_BROKER = "redis://127.0.0.1:6379/3"
GOAL_P50_MS = 100.0
NODE_NAME = "bench-node"
# One key for every process: the worker signs the transfer URLs that gunicorn checks.
SECRET_KEY = "trainhub-dispatch-bench-not-a-secret-" + "x" * 24
DATASET = ROOT / "gpu_worker" / "data" / "demo_chat.jsonl"
JOB_TIMEOUT = 120.0
POLL = 0.05  # the bench's own polling; it never enters a measured interval

# Celery's default worker log format (the node), and "asctime levelname name[:] message" (the
# executor's logging.basicConfig, and the control plane's LOGGING, which Celery keeps).
_CELERY_LINE = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}): \w+/[^\]]*\] (.*)$")
_PLAIN_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \w+ [\w.]+:? (.*)$")
_RECEIVED = re.compile(r"Task gpu_worker\.run_attempt\[[^\]]+\] received")
_DISPATCH_RECEIVED = re.compile(r"Task trainhub\.dispatch\[[^\]]+\] received")
_TASK_DONE = re.compile(r"Task gpu_worker\.run_attempt\[[^\]]+\] (succeeded|raised|failed)")


class BenchError(Exception):
    """The bench could not run (a process died, something timed out)."""


# --- processes ------------------------------------------------------------------------------


class Proc:
    """A child in its own process group, output to a log file."""

    def __init__(self, name: str, cmd: list[str], env: dict[str, str], log: Path) -> None:
        self.name, self.log = name, log
        with log.open("ab") as out:
            self.popen = subprocess.Popen(  # noqa: S603 - argv built here
                cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )

    def check(self) -> None:
        if self.popen.poll() is not None:
            raise BenchError(f"{self.name} exited with {self.popen.returncode}:\n{self.tail()}")

    def tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM the main process (Celery shuts down warm, gunicorn stops its workers), then
        SIGKILL whatever is left of the group."""
        if self.popen.poll() is None:
            self.popen.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(5)


def wait_for(what: str, check: Callable[[], Any], timeout: float, procs: list[Proc]) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p in procs:
            p.check()
        value = check()
        if value:
            return value
        time.sleep(POLL)
    raise BenchError(f"timed out after {timeout:.0f} s waiting for {what}")


class LogTail:
    """Timestamped lines appended to a log file since the last mark."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0

    def mark(self) -> None:
        self.offset = self.path.stat().st_size if self.path.exists() else 0

    def lines(self) -> Iterator[tuple[float, str]]:
        """(unix time, message) of each celery or executor log line after the mark."""
        if not self.path.exists():
            return
        with self.path.open("rb") as fh:
            fh.seek(self.offset)
            for raw in fh.read().decode(errors="replace").splitlines():
                m = _CELERY_LINE.match(raw) or _PLAIN_LINE.match(raw)
                if m:  # asctime is local time with milliseconds
                    ts = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
                    yield ts, m.group(2)

    def first(self, pattern: re.Pattern[str] | str) -> float | None:
        for ts, message in self.lines():
            if pattern.search(message) if isinstance(pattern, re.Pattern) else pattern in message:
                return ts
        return None


# --- the run --------------------------------------------------------------------------------


@dataclass
class Stamps:
    """Wall-clock times (unix seconds) of one job's way to its node, by name."""

    t0: float  # just before the POST is sent
    at: dict[str, float | None] = field(default_factory=dict)

    def ms(self, name: str, since: str = "t0") -> float | None:
        end, start = self.at.get(name), self.t0 if since == "t0" else self.at.get(since)
        return None if end is None or start is None else (end - start) * 1000


class Bench:
    def __init__(self, args: argparse.Namespace, tmp: Path) -> None:
        self.args, self.tmp = args, tmp
        self.procs: list[Proc] = []
        self.http = requests.Session()
        self.base = ""
        self.model_dir = tmp / "tiny-model"
        self.node_log = LogTail(tmp / "node.log")
        self.control_log = LogTail(tmp / "control-worker.log")
        self.training_file = ""

    # --- setup ---

    def env(self, port: int) -> dict[str, str]:
        from cryptography.fernet import Fernet

        return {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "trainhub.settings",
            "DATABASE_URL": self.args.url,
            "CELERY_BROKER_URL": self.args.broker_url,
            "DJANGO_SECRET_KEY": SECRET_KEY,
            "TRAINHUB_ENCRYPTION_KEYS": Fernet.generate_key().decode(),
            "TRAINHUB_VAR_DIR": str(self.tmp / "var"),
            "TRAINHUB_STORAGE_DIR": str(self.tmp / "storage"),
            "TRAINHUB_CONTROL_URL": f"http://127.0.0.1:{port}",
            "TRAINHUB_ALLOWED_MODELS": f"*/*,{self.model_dir}",
            "TRAINHUB_LOG_LEVEL": "INFO",
            "PYTHONUNBUFFERED": "1",
        }

    def node_env(self, token: str) -> dict[str, str]:
        """What a node holds: the broker (it logs in as its own Redis user), the control URL it
        claims and heartbeats at, and its token; no Django settings (as tests/e2e)."""
        return {
            **{k: v for k, v in os.environ.items() if not k.startswith(("DJANGO", "TRAINHUB_"))},
            "CELERY_BROKER_URL": self.args.broker_url,
            "TRAINHUB_CONTROL_URL": self.base,
            "TRAINHUB_NODE_NAME": NODE_NAME,
            "TRAINHUB_NODE_TOKEN": token,
            "TRAINHUB_NODE_GPUS": "",
            "TRAINHUB_NODE_HEARTBEAT_SECONDS": "1",
            "TRAINHUB_NODE_WORKDIR": str(self.tmp / "node"),
            # The node pulls a cancel with its heartbeat while an attempt runs (default every
            # 2 s): each job is cancelled once claimed, and waited for before the next.
            "TRAINHUB_NODE_CONTROL_POLL_SECONDS": "1",
            # A cancelled attempt gets SIGTERM 1 s after its cancel file appears (default 30 s):
            # cancelled during its ~9 s of imports, the executor would otherwise only stop at
            # its first check, after them, and 50 jobs would take 10 minutes.
            "TRAINHUB_NODE_CANCEL_GRACE_SECONDS": "1",
            "OMP_NUM_THREADS": "1",  # two cores: one torch thread per executor
            "HF_HUB_OFFLINE": "1",
        }

    def start(self) -> None:
        port = free_port()
        self.base = f"http://127.0.0.1:{port}"
        env = self.env(port)
        os.environ.update({k: env[k] for k in env if k.startswith(("DJANGO", "TRAINHUB", "DATA"))})
        os.environ["CELERY_BROKER_URL"] = self.args.broker_url
        # The tiny model builds (torch import included) while the database is migrated.
        builder = subprocess.Popen(  # noqa: S603
            [sys.executable, "-m", "gpu_worker", "make-tiny-model", str(self.model_dir)],
            cwd=ROOT, env={**env, "OMP_NUM_THREADS": "1"}, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )  # fmt: skip
        import django

        django.setup()
        from django.contrib.auth import get_user_model
        from django.core.management import call_command
        from django.db import connections

        from jobs.services.accounts.projects import api_key_create, project_create
        from jobs.services.fleet.nodes import node_create
        from trainhub.celery import app
        from trainhub_contract import celery_conf as cc

        call_command("migrate", verbosity=0)
        user = get_user_model().objects.create_user(username="bench", password=None)
        project = project_create(name="dispatch-bench", owner=user, default=True)
        _, raw_key = api_key_create(user=user, name="bench", project=project)
        _, node_token = node_create(name=NODE_NAME, actor="bench")
        connections.close_all()
        with app.connection_for_write() as conn:  # leftovers of an interrupted run
            for queue in (cc.DEFAULT_QUEUE, cc.node_queue(NODE_NAME)):
                conn.default_channel.queue_purge(queue)
        _, err = builder.communicate(timeout=300)
        if builder.returncode != 0:
            raise BenchError(f"building the tiny model failed:\n{err.decode()[-2000:]}")

        celery = [sys.executable, "-m", "celery"]
        pool = {
            "prefork": ["-P", "prefork", "-c", "2"],
            "solo": ["-P", "solo"],
            "threads": ["-P", "threads", "-c", "4"],
        }[self.args.control_pool]
        self.procs.append(Proc(
            "gunicorn",
            [sys.executable, "-m", "gunicorn", "trainhub.wsgi", "-b", f"127.0.0.1:{port}",
             "-w", "2", "--log-level", "warning"],
            env, self.tmp / "gunicorn.log",
        ))  # fmt: skip
        self.procs.append(Proc(
            "control worker",
            [*celery, "-A", "trainhub", "worker", "-Q", cc.DEFAULT_QUEUE, *pool, "-l", "info",
             "-n", "bench-control@%h", "--without-gossip", "--without-mingle"],
            env, self.control_log.path,
        ))  # fmt: skip
        self.procs.append(Proc(  # Procfile ``gpu``: it consumes gpu.node.<its name>
            "node worker",
            [*celery, "-A", "gpu_worker.celery_app", "worker", "-c", "1",
             "--prefetch-multiplier", "1", "-n", f"{NODE_NAME}@%h", "-l", "info",
             "--without-heartbeat", "--without-gossip", "--without-mingle"],
            self.node_env(node_token), self.node_log.path,
        ))  # fmt: skip
        self.http.headers["Authorization"] = f"Bearer {raw_key}"

        try:
            wait_http_ready(
                f"{self.base}/api/v1/jobs/?limit=1", timeout=90, session=self.http,
                check=lambda: [p.check() for p in self.procs], log=self.tmp / "gunicorn.log",
            )  # fmt: skip
        except NotReady as exc:
            raise BenchError(f"gunicorn is not serving: {exc}") from None
        wait_for("the node to register and be idle", self.node_idle, 90, self.procs)
        with DATASET.open("rb") as fh:
            resp = self.http.post(
                f"{self.base}/api/v1/files/",
                files={"file": ("demo_chat.jsonl", fh)},
                data={"purpose": "fine-tune"},
                timeout=30,
            )
        if resp.status_code != 201:
            raise BenchError(f"upload: HTTP {resp.status_code}: {resp.text[:500]}")
        self.training_file = resp.json()["id"]

        def processed() -> bool:
            try:
                got = self.http.get(f"{self.base}/api/v1/files/{self.training_file}/", timeout=10)
            except requests.RequestException:
                return False  # a slow answer on a busy machine: ask again until the deadline
            status = got.json().get("status")
            if status == "error":
                raise BenchError(f"the dataset failed validation: {got.text[:500]}")
            return status == "processed"

        wait_for("the dataset to be processed", processed, 60, self.procs)

    def stop(self) -> None:
        for proc in reversed(self.procs):  # the node first: it says goodbye to gunicorn
            proc.stop()
        self.http.close()

    # --- one job ---

    def node_idle(self) -> bool:
        from jobs.models import GpuNode

        return GpuNode.objects.filter(name=NODE_NAME, status="idle").exists()

    def node_free(self, tasks_done: int) -> bool:
        """The node row is idle AND its worker finished every task so far: the row turns idle
        when the attempt ends, a moment before the supervisor returns and takes the next one."""
        done = sum(1 for _, m in LogTail(self.node_log.path).lines() if _TASK_DONE.search(m))
        return done >= tasks_done and self.node_idle()

    def job_body(self) -> dict[str, Any]:
        return {
            "model": str(self.model_dir),
            "training_file": self.training_file,
            "adapter": {"type": "lora", "r": 8, "alpha": 16, "dropout": 0.0},
            "hyperparameters": {"n_epochs": 1, "batch_size": 4, "learning_rate": 0.002,
                                "max_seq_length": 128, "warmup_ratio": 0.0,
                                "gradient_checkpointing": False},
        }  # fmt: skip

    def submit(self) -> tuple[str, float, float]:
        body = json.dumps(self.job_body())
        headers = {"Content-Type": "application/json"}
        t0 = time.time()
        resp = self.http.post(f"{self.base}/api/v1/jobs/", data=body, headers=headers, timeout=30)
        t_resp = time.time()
        if resp.status_code != 201:
            raise BenchError(f"POST /api/v1/jobs/: HTTP {resp.status_code}: {resp.text[:500]}")
        if resp.json()["status"] != "queued":
            raise BenchError(f"the job is {resp.json()['status']}, not queued, after its POST")
        return resp.json()["id"], t0, t_resp

    def cancel(self, job_id: str) -> None:
        resp = self.http.post(f"{self.base}/api/v1/jobs/{job_id}/cancel/", timeout=30)
        if resp.status_code != 200:
            raise BenchError(f"cancel {job_id}: HTTP {resp.status_code}: {resp.text[:300]}")

    def wait_cancelled(self, job_id: str, tasks_done: int) -> None:
        from jobs.models import TrainingJob

        def ended() -> bool:
            status = TrainingJob.objects.values_list("status", flat=True).get(public_id=job_id)
            if status in ("succeeded", "failed"):
                raise BenchError(f"{job_id} ended {status} instead of cancelled")
            return status == "cancelled"

        wait_for(f"{job_id} to be cancelled", ended, JOB_TIMEOUT, self.procs)
        wait_for("the node to be free", lambda: self.node_free(tasks_done), 60, self.procs)
        time.sleep(0.2)  # let the control worker finish the attempt's trailing messages

    def claimed_attempt(self, job_id: str) -> Any:
        from jobs.models import JobAttempt

        return (
            JobAttempt.objects.filter(job__public_id=job_id, claimed_at__isnull=False)
            .order_by("number")
            .first()
        )

    def dispatch_one(self, tasks_done: int) -> Stamps:
        from jobs.models import TrainingJob

        self.node_log.mark()
        self.control_log.mark()
        job_id, t0, t_resp = self.submit()
        attempt = wait_for(
            f"{job_id} to be claimed", lambda: self.claimed_attempt(job_id), JOB_TIMEOUT, self.procs
        )
        self.cancel(job_id)
        created = TrainingJob.objects.values_list("created_at", flat=True).get(public_id=job_id)
        received = wait_for(
            "the node's 'received' log line", lambda: self.node_log.first(_RECEIVED), 10, self.procs
        )
        dispatched = wait_for(
            "the control worker's 'dispatched' log line",
            lambda: self.control_log.first(f"dispatched {job_id} attempt"),
            10,
            self.procs,
        )
        # The dispatch task that placed the job: the last one received before it said so.
        picked = [
            ts
            for ts, m in self.control_log.lines()
            if ts <= dispatched and _DISPATCH_RECEIVED.search(m)
        ]
        self.wait_cancelled(job_id, tasks_done)
        return Stamps(
            t0,
            {
                "response": t_resp,
                "created": created.timestamp(),
                "dispatch": picked[-1] if picked else None,
                "attempt": attempt.created_at.timestamp(),
                "dispatched": dispatched,
                "received": received,
                "claimed": attempt.claimed_at.timestamp(),
            },
        )

    def first_step_in_fleet(self, tasks_done: int) -> tuple[Stamps, str]:
        """A job that trains to its first stored metrics event (then cancelled): the node's
        log lines and the stored events of its executor."""
        from jobs.models import JobEvent

        self.node_log.mark()
        job_id, t0, _ = self.submit()

        def first_metrics() -> JobEvent | None:
            return (
                JobEvent.objects.filter(job__public_id=job_id, attempt__gte=1, type="metrics")
                .order_by("number")
                .first()
            )

        metrics = wait_for(
            f"{job_id}'s first metrics event", first_metrics, JOB_TIMEOUT, self.procs
        )
        self.cancel(job_id)
        attempt = self.claimed_attempt(job_id)
        running = (
            JobEvent.objects.filter(job__public_id=job_id, attempt=attempt.number, type="status")
            .filter(data__status="running")
            .first()
        )
        stamps = Stamps(
            t0,
            {
                "claimed": attempt.claimed_at.timestamp(),
                "spawn": self.node_log.first(f"starting attempt {attempt.number} of {job_id}"),
                "torch": self.node_log.first("training backend:"),
                "running": running.created_at.timestamp() if running else None,
                "metrics": metrics.created_at.timestamp(),
                "step": float(metrics.data.get("step", 0)),
            },
        )
        self.wait_cancelled(job_id, tasks_done)
        return stamps, job_id

    def first_step_direct(self, job_id: str, n: int) -> dict[str, float]:
        """The executor command the supervisor runs, on a real spec of ``job_id``'s attempt
        (fresh signed URLs: the dataset comes from gunicorn), events to a JSON-lines file."""
        from jobs.models import JobAttempt
        from jobs.services.scheduling.dispatch import attempt_spec

        attempt = JobAttempt.objects.select_related("job").get(job__public_id=job_id, number=1)
        spec = attempt_spec(attempt)
        work = self.tmp / f"direct-{n}"
        work.mkdir()
        events = work / "events.jsonl"
        # The node's report settings, another sink: events keep their ts in the file.
        spec["report"] = {**spec["report"], "sinks": [{"type": "jsonl", "path": str(events)}]}
        (work / "spec.json").write_text(json.dumps(spec))
        cancel = work / "cancel"
        cmd = [sys.executable, "-m", "gpu_worker", "run", str(work / "spec.json"),
               "--workdir", str(work / "run"), "--cancel-file", str(cancel)]  # fmt: skip
        env = {**self.node_env("unused"), "TRAINHUB_NODE_NAME": NODE_NAME}
        log = work / "executor.log"

        def read() -> list[dict[str, Any]]:
            if not events.exists():
                return []
            return [json.loads(line) for line in events.read_text().splitlines() if line.strip()]

        with log.open("wb") as out:
            t_spawn = time.time()
            proc = subprocess.Popen(  # noqa: S603
                cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
            try:
                deadline = time.monotonic() + JOB_TIMEOUT
                while not any(e["type"] == "metrics" for e in read()):
                    if proc.poll() is not None or time.monotonic() > deadline:
                        raise BenchError(f"the executor did not train:\n{log.read_text()[-3000:]}")
                    time.sleep(POLL)
                cancel.touch()
                proc.wait(60)
            finally:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
        got = read()

        def ts(pred: Callable[[dict[str, Any]], bool]) -> float:
            return next(e["ts"] for e in got if pred(e))

        return {
            "spawn": t_spawn,
            "imported": ts(lambda e: e["type"] == "log" and "Attempt" in e["message"]),
            "downloaded": ts(lambda e: "Downloaded the dataset" in e["message"]),
            "loaded": ts(lambda e: e["message"].startswith("Loaded ")),
            "running": ts(lambda e: e["type"] == "status" and e["data"]["status"] == "running"),
            "step1": ts(lambda e: e["type"] == "metrics"),
            "step": float(next(e for e in got if e["type"] == "metrics")["data"].get("step", 0)),
        }


# --- report ---------------------------------------------------------------------------------


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def summary(values: list[float]) -> str:
    return (
        f"p50 {percentile(values, 50):7.1f}  p95 {percentile(values, 95):7.1f}  "
        f"max {max(values):7.1f}  mean {statistics.fmean(values):7.1f}"
    )


def report_dispatch(rows: list[Stamps], warm: list[Stamps], pool: str) -> bool:
    def values(name: str, since: str = "t0") -> list[float]:
        return [v for v in (r.ms(name, since) for r in rows) if v is not None]

    claimed = values("claimed")
    print(f"\nDispatch latency, {len(rows)} jobs, one at a time on an idle node (ms):")
    print(f"  POST sent -> claimed_at (upper bound)     {summary(claimed)}")
    received = values("received")
    if len(received) == len(rows):
        print(f"  POST sent -> node 'received' log (lower)  {summary(received)}")
    print(f"  POST sent -> 201 response read            {summary(values('response'))}")
    print("  consecutive segments (p50 / mean; the means add up to the mean total):")
    segments = [
        ("POST sent -> job row created (gunicorn)", "created", "t0"),
        ("job row -> dispatch task received (commit, publish)", "dispatch", "created"),
        ("dispatch received -> attempt row (task, queries)", "attempt", "dispatch"),
        ("attempt row -> 'dispatched' log (commit, spec, publish)", "dispatched", "attempt"),
        ("'dispatched' -> node 'received' log (broker)", "received", "dispatched"),
        ("node 'received' -> claimed_at (pool child, claim)", "claimed", "received"),
    ]
    for label, name, since in segments:
        vals = values(name, since)
        if vals:
            print(f"    {label:<56} {percentile(vals, 50):6.1f} / {statistics.fmean(vals):6.1f}")
    if warm:
        print("  warm-up jobs (not counted), POST sent -> claimed_at:", ", ".join(
            f"{r.ms('claimed'):.0f}" for r in warm
        ))  # fmt: skip
    p50 = percentile(claimed, 50)
    ok = p50 <= GOAL_P50_MS
    print(
        f"  goal p50 <= {GOAL_P50_MS:.0f} ms (POST sent -> claimed_at; control worker pool "
        f"{pool}): {'PASS' if ok else 'FAIL'} ({p50:.1f} ms)"
    )
    return ok


def report_first_step(fleet: list[Stamps], direct: list[dict[str, float]]) -> None:
    def show(label: str, vals: list[float | None]) -> None:
        got = [v for v in vals if v is not None]
        if got:
            each = ", ".join(f"{v:.0f}" for v in got)
            print(f"    {label:<54} median {statistics.median(got):6.0f}  [{each}]")

    def since_spawn(key: str) -> list[float | None]:
        return [(d[key] - d["spawn"]) * 1000 for d in direct]

    if not (fleet or direct):
        return
    print(f"\nExecutor process start -> first training step ({len(direct)} runs, ms):")
    if direct:
        print("  the executor run by this script; its events' own timestamps (ts):")
        show("spawn -> imports done (first log event)", since_spawn("imported"))
        show("spawn -> dataset downloaded", since_spawn("downloaded"))
        show("spawn -> model loaded, adapter attached", since_spawn("loaded"))
        show("spawn -> training starts (status running)", since_spawn("running"))
        show("spawn -> first step done (first metrics)", since_spawn("step1"))
    if fleet:
        print(f"  in the fleet, {len(fleet)} jobs (node log lines, event created_at):")
        show("claimed_at -> 'starting attempt' log (spawn)", [
            r.ms("spawn", "claimed") for r in fleet])  # fmt: skip
        show("spawn -> 'training backend' log (torch imported)", [
            r.ms("torch", "spawn") for r in fleet])  # fmt: skip
        show("spawn -> running event stored", [r.ms("running", "spawn") for r in fleet])
        show("spawn -> first metrics event stored", [r.ms("metrics", "spawn") for r in fleet])
        steps = sorted({int(r.at.get("step") or 0) for r in fleet})
        print(f"    (first stored metrics event: step {steps}. Metrics are not sent at once but")
        print("     with the reporter's next flush, so their created_at lags the step)")


# --- main -----------------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=50, help="timed dispatches (default 50)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed jobs first (default 3)")
    ap.add_argument("--first-step", type=int, default=5, help="executor start runs (default 5)")
    ap.add_argument("--control-pool", choices=["prefork", "solo", "threads"], default="prefork")
    ap.add_argument("--database-url", help=f"default: see the module docstring ({DB_NAME})")
    ap.add_argument("--broker-url", default=DEFAULT_BROKER)
    ap.add_argument("--keep-logs", action="store_true", help="keep the temp dir with the logs")
    args = ap.parse_args()
    if args.jobs < 1 or args.warmup < 0 or args.first_step < 0:
        ap.error("--jobs must be >= 1, --warmup and --first-step >= 0")
    args.url = bench_database_url(
        args.database_url, env="BENCH_DISPATCH_DATABASE_URL", name=DB_NAME
    )
    if "dispatch_bench" not in urlsplit(args.url).path:
        ap.error(f"refusing to drop {args.url}: the database's name must contain 'dispatch_bench'")
    if args.broker_url.rstrip("/").endswith("/1"):
        ap.error("--broker-url: Redis database 1 is the tests'; use another (default /3)")

    def measure(bench: Bench, started: float) -> None:
        print(f"ready after {time.monotonic() - started:.0f} s; timing {args.jobs} jobs...")
        tasks, warm, rows = 0, [], []
        for i in range(args.warmup + args.jobs):
            tasks += 1
            stamps = bench.dispatch_one(tasks)
            (warm if i < args.warmup else rows).append(stamps)
        fleet, direct = [], []
        for n in range(args.first_step):
            tasks += 1
            stamps, job_id = bench.first_step_in_fleet(tasks)
            fleet.append(stamps)
            direct.append(bench.first_step_direct(job_id, n))
        report_dispatch(rows, warm, args.control_pool)
        report_first_step(fleet, direct)

    return run_fleet_bench(Bench, args, "trainhub-dispatch-", measure)


def run_fleet_bench(
    bench_class: type[Bench],
    args: argparse.Namespace,
    tmp_prefix: str,
    measure: Callable[[Any, float], None],
) -> int:
    """Recreate the database, start the processes, ``measure(bench, started)``, and always
    stop them; on a BenchError print the processes' log tails. Returns the exit status."""

    def interrupted(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupted)
    started = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix=tmp_prefix))
    bench = bench_class(args, tmp)
    ok_run = False
    try:
        pg = database_recreate(args.url)
        print(f"{machine(ROOT)}\n{pg}; broker {args.broker_url}; work dir {tmp}")
        bench.start()
        measure(bench, started)
        ok_run = True
    except BenchError as exc:
        print(f"\nerror: {exc}", file=sys.stderr)
        for proc in bench.procs:
            print(f"--- {proc.name} ({proc.log}) ---\n{proc.tail()}", file=sys.stderr)
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
    finally:
        bench.stop()
        if args.keep_logs:
            print(f"logs kept in {tmp}", file=sys.stderr)
        else:  # on failure the tails of the logs were printed above
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"\ntotal run time {time.monotonic() - started:.0f} s")
    return 0 if ok_run else 1


if __name__ == "__main__":
    sys.exit(main())
