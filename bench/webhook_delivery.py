"""Webhook delivery throughput: signed deliveries per second from a real Celery worker to a
receiver on loopback that verifies every one with the ``standardwebhooks`` package.

Creates a fresh database, one project with one endpoint (plain http to 127.0.0.1, which the
bench allows as an operator would), then stores ``--events`` job status events through the real
``event_append`` (each in its own transaction: the webhook outbox writes the delivery row and
sends its ``deliver_webhook`` message on commit) while no worker runs. Then it starts the
webhook worker (``celery -A trainhub worker -Q webhooks``, prefork ``-c --concurrency``
as the Procfile's ``webhooks`` line) and measures, at the receiver, the time from the first delivery received
to the last: **deliveries/s = (N - 1) / that time**. Every request is verified by the receiver
(a separate process) and every row must end ``succeeded`` with one try, or the run fails.
Prints the figure and PASS/FAIL against the goal (>= 200/s). Exits 0 once measured, 1 if it
could not run.

    .venv/bin/python bench/webhook_delivery.py [--events 3000] [--concurrency 2]
        [--pool prefork|threads|solo] [--prefetch 1]

Database: ``--database-url``, else ``BENCH_WEBHOOK_DATABASE_URL``, else ``DATABASE_URL``'s
server with the database ``trainhub_webhook_bench`` (dropped and created on every run). Broker:
``--broker-url`` (default ``redis://127.0.0.1:6379/6``, purged first). About 30 s.

Step by step:

1. Database: migrated; one user, project and job row; one endpoint for
   ``fine_tuning.job.running`` at ``http://127.0.0.1:<port>/hooks``, created through
   ``endpoint_create`` (the bench allows http and 127.0.0.0/8, as an operator would with
   ``TRAINHUB_WEBHOOK_ALLOW_HTTP`` and ``TRAINHUB_WEBHOOK_ALLOWED_CIDRS``).
2. Producing: ``--events`` ``status`` events (``running``), each in its own transaction, so the
   outbox writes one delivery row per event and sends one ``trainhub.deliver_webhook`` message
   on commit. No worker runs yet, so the messages wait on the broker. (The production rate is
   printed, not measured against a goal.)
3. Delivering: the worker (prefetch ``--prefetch``) is started. Each task claims its delivery,
   resolves and checks the address, signs (Standard Webhooks, the secret decrypted with
   MultiFernet), POSTs over a new TCP connection, and records the try (``WebhookAttempt`` row,
   delivery row) in one transaction.
4. Receiving: a separate process (``http.server``, a thread per connection) verifies every
   request with ``standardwebhooks.Webhook(secret).verify``, answers 204 and records the arrival
   time of each verified request.
5. Figure: (N - 1) / (last arrival - first arrival), so the worker's start-up is left out. The
   run counts only if all N arrived verified, none was refused, and every row ended
   ``succeeded`` after exactly one try. Receiver, worker, PostgreSQL and Redis share the
   machine's cores.

Figures: docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repo: devsupport, trainhub
from _common import bench_database_url, database_recreate, machine

from devsupport.processes import free_port
from trainhub_contract import celery_conf as cc

ROOT = Path(__file__).resolve().parent.parent
GOAL_PER_SECOND = 200.0
DB_NAME = "trainhub_webhook_bench"


# --- the receiver (its own process: it must not share the driver's or the worker's GIL) -------


def receive(port: int, secret: str, expected: int, out: Any) -> None:
    """Verify every POST, answer 204; send [arrival times], failures to ``out`` when done."""
    from standardwebhooks import Webhook

    hook = Webhook(secret)
    arrivals: list[float] = []
    bad: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            try:
                hook.verify(body, {k.lower(): v for k, v in self.headers.items()})
                arrivals.append(time.time())
                self.send_response(204)
            except Exception as exc:  # any refusal is counted and reported
                bad.append(str(exc))
                self.send_response(400)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    server.timeout = 0.2
    deadline = time.time() + 600
    while len(arrivals) + len(bad) < expected and time.time() < deadline:
        server.handle_request()
    server.server_close()
    out.send((arrivals, bad))


# --- the driver -------------------------------------------------------------------------------


def django_setup(database_url: str, broker_url: str) -> None:
    os.environ.update(
        DJANGO_SETTINGS_MODULE="trainhub.settings",
        DATABASE_URL=database_url,
        CELERY_BROKER_URL=broker_url,
        TRAINHUB_WEBHOOK_ALLOW_HTTP="1",
        TRAINHUB_WEBHOOK_ALLOWED_CIDRS="127.0.0.0/8",
        TRAINHUB_LOG_LEVEL="WARNING",
    )
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def seed(port: int) -> tuple[Any, str]:
    """A project, a job row and an endpoint subscribed to running; returns (job, secret)."""
    from django.contrib.auth.models import User

    from jobs.models import TrainingFile, TrainingJob
    from jobs.services.accounts.projects import project_default_for_user
    from jobs.services.outbound import webhook_endpoints

    user = User.objects.create_user("bench", password=None)
    project = project_default_for_user(user=user)
    file = TrainingFile.objects.create(
        project=project, filename="d.jsonl", bytes=1, sha256="0" * 64, storage_key="x"
    )
    job = TrainingJob.objects.create(
        project=project, model="acme/tiny", training_file=file, adapter={},
        hyperparameters={}, target="local", max_runtime_seconds=3600, status="running",
    )  # fmt: skip
    _, secret = webhook_endpoints.endpoint_create(
        project=project,
        data={
            "url": f"http://127.0.0.1:{port}/hooks",
            "event_types": ["fine_tuning.job.running"],
        },
    )
    return job, secret


def produce(job: Any, count: int) -> float:
    """``count`` status events through event_append, each committed on its own; seconds."""
    from jobs.services.core.events import event_append

    started = time.perf_counter()
    for i in range(count):
        event_append(job=job, type="status", message=f"bench {i}", data={"status": "running"})
    return time.perf_counter() - started


def purge(broker_url: str) -> None:
    from trainhub.celery import app

    with app.connection_for_write() as conn:
        conn.default_channel.queue_purge("default")


def start_worker(args: argparse.Namespace, database_url: str, log: Path) -> subprocess.Popen:
    env = {
        **os.environ,
        "DATABASE_URL": database_url,
        "CELERY_BROKER_URL": args.broker_url,
        "TRAINHUB_WEBHOOK_ALLOW_HTTP": "1",
        "TRAINHUB_WEBHOOK_ALLOWED_CIDRS": "127.0.0.0/8",
        "TRAINHUB_LOG_LEVEL": "WARNING",
    }
    from django.conf import settings

    env["TRAINHUB_ENCRYPTION_KEYS"] = ",".join(settings.TRAINHUB_ENCRYPTION_KEYS)
    env["DJANGO_SECRET_KEY"] = settings.SECRET_KEY
    command = [
        sys.executable, "-m", "celery", "-A", "trainhub", "worker", "-Q", cc.WEBHOOKS_QUEUE,
        "-c", str(args.concurrency), "-P", args.pool, "--without-heartbeat", "--without-gossip",
        "--prefetch-multiplier", str(args.prefetch),
        "--without-mingle", "-l", "warning", "-n", f"webhook-bench-{os.getpid()}@%h",
    ]  # fmt: skip
    with log.open("ab") as out:
        return subprocess.Popen(  # noqa: S603 (argv built here)
            command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--pool", default="prefork", choices=["prefork", "threads", "solo"])
    parser.add_argument("--prefetch", type=int, default=1, help="worker prefetch multiplier")
    parser.add_argument("--database-url")
    parser.add_argument("--broker-url", default="redis://127.0.0.1:6379/6")
    args = parser.parse_args()
    database_url = bench_database_url(
        args.database_url, env="BENCH_WEBHOOK_DATABASE_URL", name=DB_NAME
    )
    if DB_NAME not in database_url and "webhook_bench" not in database_url:
        print(f"refusing to drop {database_url}: its name must contain webhook_bench")
        return 1
    version = database_recreate(database_url)
    django_setup(database_url, args.broker_url)
    purge(args.broker_url)
    port = free_port()
    job, secret = seed(port)

    ctx = mp.get_context("spawn")
    mine, theirs = ctx.Pipe()
    receiver = ctx.Process(target=receive, args=(port, secret, args.events, theirs), daemon=True)
    receiver.start()
    produced_s = produce(job, args.events)

    from django.db.models import Count

    from jobs.models import WebhookDelivery

    if WebhookDelivery.objects.count() != args.events:
        print("the outbox did not write one delivery per event")
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "worker.log"
        worker = start_worker(args, database_url, log)
        try:
            if not mine.poll(600):
                print("timed out waiting for the receiver\n" + log.read_text()[-3000:])
                return 1
            arrivals, bad = mine.recv()
        finally:
            worker.terminate()
            worker.wait(30)
    receiver.join(5)
    statuses = dict(WebhookDelivery.objects.values_list("status").annotate(n=Count("id")))
    tries = WebhookDelivery.objects.filter(attempts=1).count()
    arrivals.sort()
    span = arrivals[-1] - arrivals[0] if len(arrivals) > 1 else float("nan")
    rate = (len(arrivals) - 1) / span if span and span == span else 0.0
    ok = not bad and len(arrivals) == args.events and statuses == {"succeeded": args.events}
    print(machine(ROOT) + f"; {version}")
    print(
        json.dumps(
            {
                "events": args.events,
                "worker": f"{args.pool} -c {args.concurrency} prefetch x{args.prefetch}",
                "produce_events_per_s": round(args.events / produced_s, 1),
                "received_verified": len(arrivals),
                "refused_by_receiver": len(bad),
                "rows": statuses,
                "one_try_each": tries == args.events,
                "first_to_last_s": round(span, 3),
            }
        )
    )
    verdict = "PASS" if ok and rate >= GOAL_PER_SECOND else "FAIL"
    print(f"webhook deliveries/s: {rate:.0f} (goal >= {GOAL_PER_SECOND:.0f}) {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
