"""Real processes for end-to-end tests: the control plane's Celery worker (module-scoped), the
web side (pytest-django's live server: claims and signed transfers), and GPU nodes started
per test as ``celery -A gpu_worker.celery_app worker`` with their own tokens.

All of them share the pytest PostgreSQL database, the machine's Redis and one storage folder.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import connection

from jobs.broker_acl import broker_user_delete
from tests.support.api import upload
from tests.support.broker_watch import BrokerWatch
from tests.support.processes import database_url, quiesce
from trainhub_contract import celery_conf as cc

ROOT = Path(__file__).resolve().parents[2]
CONTROL_WORKER = f"control-{os.getpid()}"
LEASE_TTL_SECONDS = 6  # short, so a killed node's attempt is found lost within seconds
pytestmark = [pytest.mark.slow]


class Process:
    """A child process with its log; started in its own process group (killpg kills it all)."""

    def __init__(self, name: str, command: list[str], env: dict[str, str], log: Path) -> None:
        self.name, self.command, self.env, self.log = name, command, env, log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Process:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                self.command, cwd=ROOT, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        return self

    def tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill_group(self) -> None:
        """SIGKILL the whole process group: the worker, its pool child (and what they spawned)."""
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if not self.alive():
            return
        assert self.proc is not None
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.kill_group()


# A wait that keeps seeing progress may last this many times its timeout in all.
PATIENCE = 5


def _progress() -> int | None:
    """How far the stack has got: the newest event stored for any job. Executors report their
    steps, checkpoints and logs as events, so a training that runs (slowly, on a machine busy
    with other tests) keeps adding them; a stuck one does not."""
    from jobs.models import JobEvent

    return JobEvent.objects.order_by("-pk").values_list("pk", flat=True).first()


def wait_for(what: str, check: Callable[[], object], timeout: float, *logs: Process) -> object:
    """Poll until ``check()`` is truthy; fail with the processes' logs once ``timeout`` seconds
    pass without progress (no new job event), or PATIENCE times that in all."""
    start = last_progress = time.monotonic()
    seen = _progress()
    while True:
        value = check()
        if value:
            return value
        now = time.monotonic()
        if (now - last_progress > timeout) or (now - start > PATIENCE * timeout):
            break
        time.sleep(0.2)
        if (newest := _progress()) != seen:
            seen, last_progress = newest, time.monotonic()
    tails = "\n".join(f"--- {p.name} ---\n{p.tail()}" for p in logs)
    pytest.fail(
        f"timed out after {time.monotonic() - start:.0f} s waiting for {what} "
        f"({time.monotonic() - last_progress:.0f} s without a new job event)\n{tails}"
    )


@pytest.fixture(scope="session")
def shared_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("e2e")


@pytest.fixture(scope="module")
def control_worker_env() -> dict[str, str]:
    """Extra environment for the module's control worker (a module overrides it: S3 storage)."""
    return {}


@pytest.fixture(scope="module")
def control_worker(
    django_db_setup, django_db_blocker, live_server, shared_dir, control_worker_env
) -> Iterator[Process]:
    """The control plane's worker (queues ``default``, ``webhooks``, ``exports``, as the
    embedded launcher's) on the test database."""
    if connection.vendor != "postgresql":
        pytest.skip("worker processes need a shared server database (PostgreSQL)")
    from trainhub.celery import app

    with app.connection_for_write() as conn:  # leftovers of earlier runs must not be consumed
        conn.default_channel.queue_purge(cc.DEFAULT_QUEUE)
        conn.default_channel.queue_purge(cc.WEBHOOKS_QUEUE)
        conn.default_channel.queue_purge(cc.EXPORTS_QUEUE)
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "trainhub.settings",
        "DATABASE_URL": database_url(connection.settings_dict),
        "CELERY_BROKER_URL": settings.CELERY_BROKER_URL,
        "TRAINHUB_STORAGE_DIR": str(shared_dir / "storage"),
        "TRAINHUB_VAR_DIR": str(shared_dir / "var"),
        "TRAINHUB_CONTROL_URL": live_server.url,
        "TRAINHUB_LEASE_TTL_SECONDS": str(LEASE_TTL_SECONDS),
        "TRAINHUB_LOG_LEVEL": "INFO",
        # Transfer URLs are signed by the worker and checked by the web side: one key.
        "DJANGO_SECRET_KEY": settings.SECRET_KEY,
        # Credentials (and SSH keys) encrypted by this process are read by the worker.
        "TRAINHUB_ENCRYPTION_KEYS": ",".join(settings.TRAINHUB_ENCRYPTION_KEYS),
        **control_worker_env,
    }
    worker = Process(
        "control-worker",
        [sys.executable, "-m", "celery", "-A", "trainhub", "worker", "-Q", f"{cc.DEFAULT_QUEUE},{cc.WEBHOOKS_QUEUE},{cc.EXPORTS_QUEUE}",
         "-c", "1", "-P", "solo", "--without-heartbeat", "--without-gossip", "--without-mingle",
         # Task events on (the Procfile's worker has them when Flower asks; without heartbeat
         # this one has no event dispatcher to switch on): Flower's view is tested, and the
         # broker watch reads the events too.
         "-E", "-l", "info", "-n", f"{CONTROL_WORKER}@%h"],
        env, shared_dir / "control-worker.log",
    ).start()  # fmt: skip
    try:
        yield worker
    finally:
        worker.stop()


@pytest.fixture(autouse=True)
def _no_secret_on_the_broker(control_worker) -> Iterator[None]:
    """Whatever the test makes any process publish carries no secret (docs/SECURITY.md)."""
    watch = BrokerWatch(settings.CELERY_BROKER_URL)
    watch.start()
    yield
    watch.stop()
    assert watch.writes, "the broker saw no message at all: the watch is not watching"
    assert not watch.leaks(), "secrets on the broker:\n" + "\n".join(watch.leaks())


@pytest.fixture(autouse=True)
def _quiet_control_worker(transactional_db, control_worker) -> Iterator[None]:
    """Torn down after the test's nodes have stopped and before the database is flushed."""
    yield
    quiesce(f"{CONTROL_WORKER}@{socket.gethostname()}", cc.DEFAULT_QUEUE)


@pytest.fixture
def plane(control_worker, live_server, shared_dir, settings, tiny_model_dir) -> Process:
    """This test process acts as the web side: same storage, same control URL, the tiny model
    allowed, and the same short lease as the worker."""
    settings.TRAINHUB_STORAGE_DIR = shared_dir / "storage"
    settings.TRAINHUB_CONTROL_URL = live_server.url
    settings.TRAINHUB_LEASE_TTL_SECONDS = LEASE_TTL_SECONDS
    settings.TRAINHUB_ALLOWED_MODELS = ["*/*", str(tiny_model_dir)]
    return control_worker


@pytest.fixture
def start_node(shared_dir, live_server) -> Iterator[Callable[..., Process]]:
    """``start_node(name, token, **env)``: a GPU node worker process (CPU here: no GPU)."""
    from trainhub.celery import app

    started: list[Process] = []

    def start(name: str, token: str, **extra: str) -> Process:
        # Leftovers of earlier runs must not be consumed; a restart (the name started before
        # in this test) keeps its queue: the control plane may have dispatched to it meanwhile.
        if all(n.name != f"node {name}" for n in started):
            with app.connection_for_write() as conn:
                conn.default_channel.queue_purge(cc.node_queue(name))
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("DJANGO")},
            # Without credentials: the node logs in as its own broker user (jobs/broker_acl.py).
            "CELERY_BROKER_URL": settings.CELERY_BROKER_URL,
            "TRAINHUB_CONTROL_URL": live_server.url,
            "TRAINHUB_NODE_NAME": name,
            "TRAINHUB_NODE_TOKEN": token,
            "TRAINHUB_NODE_GPUS": "",
            "TRAINHUB_NODE_HEARTBEAT_SECONDS": "1",
            "TRAINHUB_NODE_WORKDIR": str(shared_dir / "nodes" / name),
            "TRAINHUB_NODE_CANCEL_GRACE_SECONDS": "10",
            "TRAINHUB_NODE_CONTROL_POLL_SECONDS": "1",
            "TRAINHUB_CHECKPOINT_EVERY_STEPS": "5",
            "OMP_NUM_THREADS": "1",  # two cores: one torch thread per executor
            "HF_HUB_OFFLINE": "1",
            **extra,
        }
        node = Process(
            f"node {name}",
            [sys.executable, "-m", "celery", "-A", "gpu_worker.celery_app", "worker",
             "-Q", cc.node_queue(name), "-c", "1", "--prefetch-multiplier", "1",
             "-n", f"{name}@%h", "--without-heartbeat", "--without-gossip", "--without-mingle",
             "-l", "info"],
            env, shared_dir / f"node-{name}.log",
        ).start()  # fmt: skip
        started.append(node)
        return node

    yield start
    for node in started:
        node.stop()
    for name in {n.name.removeprefix("node ") for n in started}:
        broker_user_delete(name)  # the database is flushed; the broker's users are not


def submit_tiny_job(api: Any, model: Path, demo_dataset: bytes, **fields: Any) -> str:
    """Upload the dataset and create a one-epoch LoRA job of the tiny model; its id."""
    uploaded = upload(api, demo_dataset)
    assert uploaded.status_code == 201, uploaded.content
    body = {
        "model": str(model),
        "training_file": uploaded.json()["id"],
        "adapter": {"type": "lora", "r": 8, "alpha": 16, "dropout": 0.0},
        "hyperparameters": {"n_epochs": 1, "batch_size": 4, "learning_rate": 0.002,
                            "max_seq_length": 128, "warmup_ratio": 0.0,
                            "gradient_checkpointing": False},
        **fields,
    }  # fmt: skip
    created = api.post("/api/v1/jobs/", body, format="json")
    assert created.status_code == 201, created.content
    return created.json()["id"]


@pytest.fixture
def client(plane, live_server, user, project) -> Any:
    """The official ``openai`` SDK as a user's script builds it, on an API key of ``user``; no
    retries, so a refused call shows as itself rather than as a slow retry loop. (In tests/e2e
    it stands in for pytest-django's ``client``: these tests drive the API as clients do.)"""
    import openai

    from jobs.services.accounts.projects import api_key_create

    key = api_key_create(user=user, name="sdk-e2e")[1]
    return openai.OpenAI(base_url=live_server.url + "/v1", api_key=key, max_retries=0, timeout=30)
