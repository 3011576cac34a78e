"""Spot capacity under preemption: 100 jobs on a simulated spot cloud whose machines are taken
back at random, run by the real control plane.

What is real: the API (jobs created with ``POST /api/v1/jobs/`` after a file upload, through
Django's handler in-process), the database (PostgreSQL), the broker (Redis) and a Celery worker
of the control plane (embedded in this process, ``celery.contrib.testing.worker``, queue
``default``) running every task the control plane sends: validation, placement, launches,
polls, attempt ends, requeues, stops and artifact ingest. Checkpoints and adapter bundles go
through the signed transfer URLs of each attempt's spec (PUT/GET on the transfer route) into
local storage, and the ingest verifies every bundle.

What is simulated: the cloud. A target ``sim-spot`` (serverless kind: the spec is handed over
at launch, events come back with each poll) sells one offer with an on-demand and a spot price.
Each machine it launches boots, then "trains" the job on a simulated clock: one optimizer step
per second, a checkpoint every 200 steps (the executor's default; its upload takes 5 s, during
which training waits, as in gpu_worker.checkpoints), the adapter uploaded at the end. It reads
its resume checkpoint from the spec's ``resume_url`` and continues from the step stored there.
Each attempt is interrupted with probability 0.3 at a uniformly random moment of its run;
half of those interruptions come with AWS's two-minute notice, which the executor (checking
every 5 s, as gpu_worker.preemption does) answers by checkpointing the last finished step and
ending ``failed``/``preempted``; the others come without a word: the machine is gone and the
provider reports it FAILED ``preempted``, as the AWS adapter does for
``Server.SpotInstanceTermination``. A machine bills from launch until it is reclaimed or
trainhub terminates it.

Time runs scaled: one simulated second is ``--time-scale`` real seconds (0.05), and the
control plane's own clocks are scaled alike (poll every 15 s → 0.75 s, beat ticks, place
waiting). Figures are given in simulated time and dollars (trainhub's costs, computed on real
time, are divided by the scale).

Prints: jobs lost (goal 0) and succeeded (goal all), the GPU time redone per preemption (the
steps trained after the checkpoint the next attempt resumed from, plus its boot; goal <= one
checkpoint interval + its upload + boot), machines left running at the end (goal 0) and how
long a machine kept billing after its run ended, and the cost paid against the on-demand cost
of the same attempts and of one uninterrupted on-demand run per job.

    .venv/bin/python bench/spot_preemption.py [--jobs 100] [--seed 7] [--time-scale 0.05]
        [--timeout 900]

Database: ``--database-url``, else ``BENCH_SPOT_DATABASE_URL``, else ``DATABASE_URL``'s server
with the database ``trainhub_spot_bench`` (dropped and created again on every run). Redis:
``--redis-url`` (default ``redis://127.0.0.1:6379/8``, flushed at the start: locks and rate
buckets of an earlier run). ``--timeout``: real seconds before it gives up. About 3 minutes on
2 cores.

In more detail:

1. The control plane: PostgreSQL (migrated), Redis as the broker and lock store, and the
   embedded worker (``celery.contrib.testing.worker.start_worker``, threads pool, 2 threads).
   The jobs are created through the API (``POST /api/v1/files/``, then ``--jobs`` x
   ``POST /api/v1/jobs/`` with ``capacity: "spot"``, ``max_preemptions: 10``) and every step
   after that is the control plane's own tasks. The bench plays beat: a poll of the target
   every tick, place-waiting every 30 s (scaled).
2. The cloud: one offer, H100 80GB at $2.99/h on demand and $1.05/h spot. A launched machine
   boots for 60 s, then trains from the step stored in its spec's resume checkpoint (GET on the
   transfer route) to step 1,200, one step per second, with a checkpoint every 200 steps (PUT
   of its step to the spec's ``checkpoint_url``, 5 s during which training waits) and the
   adapter bundle at the end (a real bundle, ``write_bundle``, PUT to ``artifact_url``,
   verified by the ingest). Its events (running, metrics, checkpoint, final status) are made
   by the executor's own ``Reporter`` and returned with each poll.
3. Interruptions: each launch is interrupted with probability 0.3 at a uniformly random moment
   of its expected run (boot included). Half come with a notice 120 s ahead; the simulated
   executor checks every 5 s (from the start of its run), and once it has seen the notice it
   saves the step it finished (if newer than its last checkpoint) and ends ``failed`` with
   code ``preempted``. The machine is reclaimed at the interruption time either way: from then
   on the provider reports it ``FAILED`` / ``preempted``, and uploads it had not finished are
   lost.
4. Figures come from the database (job statuses, attempts and their end reasons, costs,
   verified artifacts) and from the simulated provider's own records (launch and termination
   times, who terminated each machine, the last step each trained, the step each resumed
   from). Redone steps per preemption = the last step the interrupted attempt trained - the
   step the next attempt resumed from. Machines left = machines neither reclaimed nor
   terminated once every job ended and 20 more ticks passed, before the reconciler runs (the
   bench then runs it and prints what it found). The control plane's poll interval and beat
   ticks are scaled with ``--time-scale``. Which attempts are interrupted depends on the order
   of the launches, so runs of one seed differ slightly.

Figures: docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import math
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _common import bench_database_url, database_recreate, machine

ROOT = Path(__file__).resolve().parent.parent
DB_NAME = "trainhub_spot_bench"
DEFAULT_REDIS = "redis://127.0.0.1:6379/8"
SECRET_KEY = "trainhub-spot-bench-not-a-secret-" + "x" * 24
DATASET = ROOT / "gpu_worker" / "data" / "demo_chat.jsonl"
TARGET = "sim-spot"
HOST = "testserver"  # the in-process client's host, and the public URL machines use

# The simulated job and machine, in simulated seconds.
TOTAL_STEPS = 1200  # 20 minutes of training
STEP_SECONDS = 1.0
CHECKPOINT_EVERY_STEPS = 200  # gpu_worker.train.DEFAULT_CHECKPOINT_EVERY_STEPS
UPLOAD_SECONDS = 5.0  # a LoRA checkpoint or bundle: tens of MB
BOOT_SECONDS = 60.0
NOTICE_SECONDS = 120.0  # AWS: two minutes
IMDS_POLL_SECONDS = 5.0  # gpu_worker.preemption.POLL_SECONDS
METRICS_EVERY_STEPS = 50
P_INTERRUPT = 0.3
P_WARNED = 0.5
ON_DEMAND_PRICE = 2.99  # USD per hour, one H100 80GB
SPOT_PRICE = 1.05


def checkpoints_in_a_run() -> int:
    return (TOTAL_STEPS - 1) // CHECKPOINT_EVERY_STEPS


def ideal_on_demand_seconds() -> float:
    """One uninterrupted run: boot, every step, every checkpoint upload, the bundle upload."""
    return BOOT_SECONDS + TOTAL_STEPS * STEP_SECONDS + (checkpoints_in_a_run() + 1) * UPLOAD_SECONDS


class BenchError(Exception):
    pass


class SimClock:
    """Simulated seconds since the bench started; real time scaled."""

    def __init__(self, scale: float) -> None:
        self.scale = scale
        self.t0 = time.time()

    def now(self) -> float:
        return (time.time() - self.t0) / self.scale

    def of(self, moment: Any) -> float:
        """A database timestamp, in simulated seconds."""
        return (moment.timestamp() - self.t0) / self.scale


# --- the simulated cloud ---------------------------------------------------------------------


@dataclass
class Machine:
    """One rented machine and the run on it, planned at launch on the simulated clock."""

    instance_id: str
    name: str
    job_id: str
    attempt: int
    spec: dict[str, Any]
    launched: float
    resume_step: int
    interrupt_at: float  # math.inf: never
    warned: bool
    # (time, action, step) in time order: running, metrics, checkpoint, succeeded, preempted
    plan: list[tuple[float, str, int]] = field(default_factory=list)
    step_ends: list[tuple[float, int]] = field(default_factory=list)
    done: int = 0  # plan entries carried out
    sink: Any = None
    reporter: Any = None
    run_ended: float | None = None  # the executor exited (succeeded or preempted)
    outcome: str = ""
    terminated: float | None = None
    terminated_by: str = ""  # "provider" (reclaimed) or "trainhub"
    last_step: int = 0  # the last step trained before the run stopped


def plan_run(m: Machine) -> None:
    """Lay out the run: boot, steps, checkpoints, and the end (finished, or stopped by a notice
    the executor saw). The interruption itself cuts the plan at ``interrupt_at``."""
    t = m.launched + BOOT_SECONDS
    notice_seen = math.inf
    if m.warned:
        notice = m.interrupt_at - NOTICE_SECONDS
        # The watcher checks at start, then every IMDS_POLL_SECONDS.
        checks = max(0.0, math.ceil((notice - t) / IMDS_POLL_SECONDS))
        notice_seen = t + checks * IMDS_POLL_SECONDS
    m.plan.append((t, "running", m.resume_step))
    step, saved = m.resume_step, m.resume_step
    while step < TOTAL_STEPS:
        if notice_seen <= t:  # checked after every step: save the last one, then stop
            if step > saved:
                t += UPLOAD_SECONDS
                m.plan.append((t, "checkpoint", step))
            m.plan.append((t, "preempted", step))
            return
        t += STEP_SECONDS
        step += 1
        m.step_ends.append((t, step))
        if step % METRICS_EVERY_STEPS == 0:
            m.plan.append((t, "metrics", step))
        if step % CHECKPOINT_EVERY_STEPS == 0 and step < TOTAL_STEPS:
            t += UPLOAD_SECONDS
            m.plan.append((t, "checkpoint", step))
            saved = step
    t += UPLOAD_SECONDS
    m.plan.append((t, "succeeded", step))


class SimCloud:
    """A ProviderAdapter + OfferSource over simulated machines (thread-safe)."""

    def __init__(self, clock: SimClock, rng: random.Random, web: Any) -> None:
        self.clock, self.rng, self.web = clock, rng, web
        self.machines: dict[str, Machine] = {}
        self.launch_capacities: list[str] = []
        self.lock = threading.RLock()
        self._ids = 0

    # OfferSource
    def offers(self, gpu: Mapping[str, object]) -> list[Any]:
        from providers.base import Offer

        return [
            Offer(
                target=TARGET, offer_id="h100@sim-1", gpu_name="H100 80GB", gpu_count=1,
                vram_gb=80, price_per_hour=ON_DEMAND_PRICE, spot_price_per_hour=SPOT_PRICE,
                region="sim-1",
            )
        ]  # fmt: skip

    # ProviderAdapter
    def launch(self, request: Any) -> Any:
        from gpu_worker.report import Reporter
        from gpu_worker.sinks import MemorySink
        from providers.base import Handle

        resume = self._resume_step(request.spec)
        with self.lock:
            self._ids += 1
            now = self.clock.now()
            remaining = TOTAL_STEPS - resume
            expected = (
                BOOT_SECONDS
                + remaining * STEP_SECONDS
                + (remaining // CHECKPOINT_EVERY_STEPS + 1) * UPLOAD_SECONDS
            )
            interrupted = self.rng.random() < P_INTERRUPT
            m = Machine(
                instance_id=f"sim-{self._ids}",
                name=request.name,
                job_id=request.job_id,
                attempt=request.attempt,
                spec=dict(request.spec),
                launched=now,
                resume_step=resume,
                interrupt_at=now + self.rng.uniform(0, expected) if interrupted else math.inf,
                warned=interrupted and self.rng.random() < P_WARNED,
                last_step=resume,
            )
            plan_run(m)
            m.sink = MemorySink()
            m.reporter = Reporter(
                job_id=request.job_id, attempt=request.attempt, sinks=[m.sink], metrics_interval=0
            )
            self.machines[m.instance_id] = m
            self.launch_capacities.append(str(request.capacity))
        return Handle(instance_id=m.instance_id, name=m.name)

    def poll(self, handles: Sequence[Any]) -> dict[str, Any]:
        from providers.base import RemoteState, RemoteStatus

        states = {}
        for h in handles:
            with self.lock:
                m = self.machines.get(h.instance_id)
            if m is None:
                states[h.instance_id] = RemoteState(RemoteStatus.LOST, "unknown machine")
                continue
            states[h.instance_id] = self._state(m, self.clock.now(), RemoteState, RemoteStatus)
        return states

    def cancel(self, handle: Any) -> None:
        with self.lock:
            m = self.machines.get(handle.instance_id)
            if m is not None and m.terminated is None:
                now = self.clock.now()
                if m.interrupt_at <= now:  # reclaimed before trainhub got to it
                    m.terminated, m.terminated_by = m.interrupt_at, "provider"
                else:
                    m.terminated, m.terminated_by = now, "trainhub"

    def list_instances(self) -> list[Any]:
        from providers.base import Handle

        now = self.clock.now()
        with self.lock:
            return [
                Handle(m.instance_id, m.name)
                for m in self.machines.values()
                if m.terminated is None and m.interrupt_at > now
            ]

    # the machines' side
    def _resume_step(self, spec: Mapping[str, Any]) -> int:
        url = (spec.get("outputs") or {}).get("resume_url")
        if not url:
            return 0
        got = self.web.get(url)
        if got.status_code != 200:
            raise BenchError(f"resume checkpoint GET answered {got.status_code}")
        return int(json.loads(got.getvalue())["step"])

    def _put(self, url: str, body: bytes) -> None:
        answer = self.web.put(url, body, content_type="application/octet-stream")
        if answer.status_code not in (200, 201, 204):
            raise BenchError(f"PUT to the transfer route answered {answer.status_code}")

    def _state(self, m: Machine, now: float, state: Any, status: Any) -> Any:
        from trainhub_contract.outcomes import Outcome

        with self.lock:
            cut = min(now, m.interrupt_at, m.terminated if m.terminated is not None else now)
            while m.done < len(m.plan) and m.plan[m.done][0] <= cut:
                at, action, step = m.plan[m.done]
                m.done += 1
                if action == "running":
                    m.reporter.status(
                        Outcome.RUNNING, "Training started.", resumed_from_step=m.resume_step
                    )
                elif action == "metrics":
                    m.reporter.metrics(
                        step=step, total_steps=TOTAL_STEPS, loss=round(2.5 - step / 1000, 4)
                    )
                elif action == "checkpoint":
                    body = json.dumps({"job": m.job_id, "step": step}).encode()
                    self._put(m.spec["outputs"]["checkpoint_url"], body)
                    m.reporter.checkpoint(step)
                elif action == "succeeded":
                    sha256, size = self._upload_bundle(m)
                    m.reporter.status(
                        Outcome.SUCCEEDED, "Training finished.", sha256=sha256, size=size
                    )
                    m.run_ended, m.outcome = at, "succeeded"
                elif action == "preempted":
                    m.reporter.status(
                        Outcome.FAILED,
                        f"Preempted during training after step {step}: the spot machine is "
                        "being reclaimed. The job is retried from its newest checkpoint.",
                        code="preempted",
                    )
                    m.run_ended, m.outcome = at, "preempted"
            m.reporter.flush()
            events = tuple(m.sink.events[-200:])
            trained = [s for t, s in m.step_ends if t <= min(cut, m.run_ended or math.inf)]
            m.last_step = trained[-1] if trained else m.resume_step
            if m.terminated is not None and m.terminated_by == "trainhub":
                return state(status.CANCELLED, "terminated", events=events)
            if now >= m.interrupt_at:
                if m.terminated is None:
                    m.terminated, m.terminated_by = m.interrupt_at, "provider"
                return state(
                    status.FAILED,
                    "the provider reclaimed the spot machine",
                    error_code="preempted",
                    events=events,
                )
            if m.outcome == "succeeded":
                return state(status.SUCCEEDED, "finished", events=events)
            if m.outcome == "preempted":
                return state(status.FAILED, "preempted", error_code="preempted", events=events)
            if now < m.launched + BOOT_SECONDS:
                return state(status.PENDING, "booting")
            return state(status.RUNNING, "running", events=events)

    def _upload_bundle(self, m: Machine) -> tuple[str, int]:
        from trainhub_contract.bundle import write_bundle

        with tempfile.TemporaryDirectory() as tmp:
            adapter = Path(tmp)
            (adapter / "adapter_config.json").write_text(json.dumps({"r": 16, "job": m.job_id}))
            (adapter / "adapter_model.safetensors").write_bytes(os.urandom(32 * 1024))
            out = io.BytesIO()
            write_bundle(adapter, out)
        body = out.getvalue()
        self._put(m.spec["outputs"]["artifact_url"], body)
        return hashlib.sha256(body).hexdigest(), len(body)


# --- the run ---------------------------------------------------------------------------------


def setup(args: argparse.Namespace, tmp: Path) -> None:
    from cryptography.fernet import Fernet

    os.environ.update({
        "DJANGO_SETTINGS_MODULE": "trainhub.settings",
        "DATABASE_URL": args.url,
        "CELERY_BROKER_URL": args.redis_url,
        "TRAINHUB_LOCK_REDIS_URL": args.redis_url,
        "DJANGO_SECRET_KEY": SECRET_KEY,
        "TRAINHUB_ENCRYPTION_KEYS": Fernet.generate_key().decode(),
        "TRAINHUB_VAR_DIR": str(tmp / "var"),
        "TRAINHUB_STORAGE_DIR": str(tmp / "storage"),
        "TRAINHUB_PUBLIC_URL": f"http://{HOST}",
        "TRAINHUB_ALLOWED_HOSTS": HOST,
        "TRAINHUB_LOG_LEVEL": "WARNING",
        # Every job at once: the project's live-job limit (default 10) would queue them.
        "TRAINHUB_DEFAULT_MAX_CONCURRENT_JOBS": str(args.jobs),
    })  # fmt: skip
    import django

    django.setup()
    import redis
    from django.core.management import call_command

    try:
        redis.Redis.from_url(args.redis_url, socket_timeout=5).flushdb()
    except redis.RedisError as exc:
        raise BenchError(f"Redis at {args.redis_url}: {exc}") from exc
    call_command("migrate", verbosity=0)


def scale_control_plane(scale: float) -> dict[str, float]:
    """The control plane's clocks, scaled like the machines' (in real seconds)."""
    from jobs.services.cloud import polling
    from providers.base import RemoteStatus
    from trainhub_contract import celery_conf as cc

    polling.POLL_EVERY = {s: seconds * scale for s, seconds in polling.POLL_EVERY.items()}
    return {
        "beat": cc.POLL_INTERVAL_SECONDS * scale,
        "place": cc.PLACE_INTERVAL_SECONDS * scale,
        "poll_running": polling.POLL_EVERY[RemoteStatus.RUNNING],
    }


def register_target(cloud: SimCloud) -> None:
    from providers import registry

    registry.register(
        registry.Target(
            TARGET,
            "A simulated spot cloud (bench/spot_preemption.py).",
            registry.TargetKind.SERVERLESS,
            adapter_factory=lambda secrets: cloud,  # type: ignore[arg-type,return-value]
            poll_batch=1000,
            has_offers=True,
        )
    )


def submit(api: Any, jobs: int) -> list[str]:
    with DATASET.open("rb") as fh:
        uploaded = api.post("/api/v1/files/", {"file": fh})
    if uploaded.status_code != 201:
        raise BenchError(f"upload: {uploaded.status_code} {uploaded.content[:300]!r}")
    body = {
        "model": "meta-llama/Llama-3.2-1B",
        "training_file": uploaded.json()["id"],
        "target": TARGET,
        "capacity": "spot",
        "max_preemptions": 10,
        "gpu": {"count": 1},
        "hyperparameters": {"n_epochs": 1, "batch_size": 4},
    }
    ids = []
    for _ in range(jobs):
        created = api.post("/api/v1/jobs/", body, content_type="application/json")
        if created.status_code != 201:
            raise BenchError(f"job create: {created.status_code} {created.content[:300]!r}")
        ids.append(created.json()["id"])
    return ids


def run(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    setup(args, tmp)
    from celery.contrib.testing.worker import start_worker
    from django.contrib.auth import get_user_model
    from django.test import Client

    from jobs.models import TrainingJob
    from jobs.services.accounts.projects import api_key_create, project_create
    from jobs.services.cloud import reconcile
    from jobs.services.outbox import messages
    from jobs.states import TERMINAL
    from trainhub.celery import app
    from trainhub_contract import celery_conf as cc

    clock = SimClock(args.time_scale)
    cloud = SimCloud(clock, random.Random(args.seed), Client(HTTP_HOST=HOST))  # noqa: S311
    register_target(cloud)
    ticks = scale_control_plane(args.time_scale)
    user = get_user_model().objects.create_user(username="bench", password=None)
    project = project_create(name="spot-bench", owner=user, default=True)
    _, raw_key = api_key_create(user=user, name="bench", project=project)
    api = Client(HTTP_HOST=HOST, headers={"Authorization": f"Bearer {raw_key}"})

    started = time.monotonic()
    with start_worker(
        app, pool="threads", concurrency=2, perform_ping_check=False, loglevel="WARNING",
        queues=[cc.DEFAULT_QUEUE], shutdown_timeout=30,
    ):  # fmt: skip
        ids = submit(api, args.jobs)
        print(f"submitted {len(ids)} spot jobs in {time.monotonic() - started:.1f} s")
        deadline = time.monotonic() + args.timeout
        next_place = 0.0
        while time.monotonic() < deadline:
            # Beat: a poll of the target every tick, place-waiting every 30 s (scaled).
            messages.send_poll_target(TARGET, expires=ticks["beat"])
            if time.monotonic() >= next_place:
                app.send_task(cc.PLACE_WAITING, expires=ticks["place"])
                next_place = time.monotonic() + ticks["place"]
            left = TrainingJob.objects.exclude(status__in=TERMINAL).count()
            if left == 0:
                break
            time.sleep(ticks["beat"])
        ran = time.monotonic() - started
        # The last stops are messages too: a few ticks for them before machines are counted.
        settle = time.monotonic() + 20 * ticks["beat"]
        while time.monotonic() < settle and cloud.list_instances():
            time.sleep(ticks["beat"])
        left_running = len(cloud.list_instances())
        swept = reconcile.providers_reconcile()
    return collect(cloud, clock, ids, ran, left_running, swept)


# --- figures ---------------------------------------------------------------------------------


def collect(
    cloud: SimCloud, clock: SimClock, ids: list[str], ran: float, left_running: int, swept: int
) -> dict[str, Any]:
    from jobs.models import Artifact, JobAttempt, TrainingJob

    jobs = {j.public_id: j for j in TrainingJob.objects.filter(public_id__in=ids)}
    statuses = [j.status for j in jobs.values()]
    attempts = list(JobAttempt.objects.filter(job__public_id__in=ids).select_related("job"))
    machines = {(m.job_id, m.attempt): m for m in cloud.machines.values()}

    redone: dict[str, list[int]] = {"warned": [], "unwarned": []}
    for a in attempts:
        if a.end_reason != "preempted":
            continue
        m, after = (
            machines.get((a.job.public_id, a.number)),
            machines.get((a.job.public_id, a.number + 1)),
        )
        if m is None or after is None:
            continue
        kind = "warned" if m.warned and m.outcome == "preempted" else "unwarned"
        redone[kind].append(m.last_step - after.resume_step)

    idle = [  # billed after the run ended, until trainhub terminated the machine
        m.terminated - m.run_ended
        for m in cloud.machines.values()
        if m.run_ended is not None and m.terminated_by == "trainhub" and m.terminated is not None
    ]
    bill = sum(
        ((m.terminated or clock.now()) - m.launched) / 3600 * SPOT_PRICE
        for m in cloud.machines.values()
    )
    scale = clock.scale
    cost = sum(float(j.cost or 0) for j in jobs.values()) / scale
    on_demand = sum(float(j.on_demand_cost or 0) for j in jobs.values()) / scale
    ideal = len(ids) * ideal_on_demand_seconds() / 3600 * ON_DEMAND_PRICE
    return {
        "jobs": len(ids),
        "succeeded": statuses.count("succeeded"),
        "failed": sum(1 for s in statuses if s in ("failed", "cancelled")),
        "lost": sum(1 for s in statuses if s not in ("succeeded", "failed", "cancelled")),
        "verified_adapters": Artifact.objects.filter(job__public_id__in=ids, verified=True).count(),
        "attempts": len(attempts),
        "end_reasons": dict(sorted(Counter(a.end_reason or "live" for a in attempts).items())),
        "spot_launches": cloud.launch_capacities.count("spot"),
        "launches": len(cloud.launch_capacities),
        "interrupted": sum(1 for m in cloud.machines.values() if m.interrupt_at < math.inf),
        "redone": redone,
        "idle_billed": idle,
        "left_running": left_running,
        "reconciler_swept": swept,
        "provider_bill": bill,
        "trainhub_cost": cost,
        "trainhub_on_demand": on_demand,
        "ideal_on_demand": ideal,
        "wall_seconds": ran,
    }


def report(r: dict[str, Any]) -> bool:
    def verdict(ok: bool) -> str:
        return "PASS" if ok else "FAIL"

    interval = CHECKPOINT_EVERY_STEPS * STEP_SECONDS + UPLOAD_SECONDS
    print(f"\njobs: {r['jobs']} submitted, {r['succeeded']} succeeded, {r['failed']} failed, "
          f"{r['lost']} lost (not finished); {r['verified_adapters']} verified adapters")  # fmt: skip
    print(f"attempts: {r['attempts']} ({r['spot_launches']}/{r['launches']} launches spot); "
          f"end reasons {r['end_reasons']}; machines interrupted: {r['interrupted']}")  # fmt: skip
    every = [*r["redone"]["warned"], *r["redone"]["unwarned"]]
    for kind, steps in r["redone"].items():
        if steps:
            print(f"  redone per preemption, {kind}: {len(steps)} preemptions, steps mean "
                  f"{statistics.mean(steps):.1f}, max {max(steps)} "
                  f"(+ {BOOT_SECONDS:.0f} s boot each)")  # fmt: skip
    worst = max(every, default=0) * STEP_SECONDS
    idle = r["idle_billed"]
    print(f"machines: {r['left_running']} left running after the last job ended; reconciler "
          f"terminated {r['reconciler_swept']} more; billed after the run ended until trainhub "
          f"terminated it: mean {statistics.mean(idle) if idle else 0:.1f} s, "
          f"max {max(idle, default=0):.1f} s (simulated)")  # fmt: skip
    saving = 1 - r["provider_bill"] / r["ideal_on_demand"] if r["ideal_on_demand"] else 0
    print(f"cost (simulated $): provider's spot bill {r['provider_bill']:.2f}; trainhub's "
          f"reported cost {r['trainhub_cost']:.2f}, its on-demand equivalent "
          f"{r['trainhub_on_demand']:.2f}; one uninterrupted on-demand run per job "
          f"{r['ideal_on_demand']:.2f} -> {saving:.0%} saved")  # fmt: skip
    print(f"wall time: {r['wall_seconds']:.0f} s")
    ok = {
        "0 jobs lost, every job succeeded": r["lost"] == 0 and r["succeeded"] == r["jobs"],
        f"GPU time redone per preemption <= {interval:.0f} s + boot ({worst:.0f} s + "
        f"{BOOT_SECONDS:.0f} s)": worst <= interval,
        "0 machines left": r["left_running"] == 0,
        "spot cost below on-demand": r["provider_bill"] < r["ideal_on_demand"],
    }
    print("\ngoals:")
    for name, good in ok.items():
        print(f"  {name}: {verdict(good)}")
    return all(ok.values())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--time-scale", type=float, default=0.05,
                        help="real seconds per simulated second")  # fmt: skip
    parser.add_argument("--timeout", type=float, default=900, help="real seconds")
    parser.add_argument("--database-url")
    parser.add_argument("--redis-url", default=DEFAULT_REDIS)
    args = parser.parse_args()
    args.url = bench_database_url(args.database_url, env="BENCH_SPOT_DATABASE_URL", name=DB_NAME)
    if "spot_bench" not in args.url:
        print("the bench database's name must contain spot_bench (it is dropped)", file=sys.stderr)
        return 1
    print(machine(ROOT))
    print(database_recreate(args.url))
    print(f"{args.jobs} jobs x {TOTAL_STEPS} steps of {STEP_SECONDS:.0f} s, checkpoint every "
          f"{CHECKPOINT_EVERY_STEPS} steps (+{UPLOAD_SECONDS:.0f} s upload), boot "
          f"{BOOT_SECONDS:.0f} s; {P_INTERRUPT:.0%} of attempts interrupted, {P_WARNED:.0%} of "
          f"those with a {NOTICE_SECONDS:.0f} s notice; time scale {args.time_scale}")  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="spot-bench-") as tmp:
        try:
            result = run(args, Path(tmp))
        except BenchError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    report(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
