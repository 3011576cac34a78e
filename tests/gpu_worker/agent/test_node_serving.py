"""A GPU node's serving role against vLLM's protocol: the node agent starts ``vllm serve`` (here
tests/gpu_worker/agent/fake_vllm.py, found on PATH as ``vllm`` and run with the very argv and
environment the node builds), registers it with its heartbeat over real HTTP, and its loader
fetches each bundle through the control plane's signed URL, checks it and hands vLLM a local
folder. Adapters are loaded once and reused, the least recently used is unloaded at the limit,
a corrupted bundle never reaches vLLM, and after vLLM restarts (or the node goes away) what it
held is placed again."""

from __future__ import annotations

import hashlib
import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from django.core.management import call_command

from gpu_worker.agent import node as node_settings
from gpu_worker.agent import serving
from gpu_worker.agent.node_api import NodeApi
from jobs import storage
from jobs.models import Artifact, Deployment, GpuNode, InferenceServer, TrainingJob
from jobs.services.fleet.nodes import node_create
from jobs.services.serving.deployments import deployment_create, deployment_place
from jobs.services.serving.node_servers import node_servers_lost
from jobs.states import JobStatus
from trainhub_contract import celery_conf as cc
from trainhub_contract.bundle import write_bundle

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("sent")]

FAKE = Path(__file__).with_name("fake_vllm.py")
BASE = "acme/tiny-llama"


def _free_port_pair() -> int:
    """A port whose next one is free too (the engine's and the loader's)."""
    for _ in range(50):
        with socket.socket() as a:
            a.bind(("127.0.0.1", 0))
            port = a.getsockname()[1]
            with socket.socket() as b:
                try:
                    b.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
                return port
    raise RuntimeError("no two neighbouring free ports")


class Journal:
    def __init__(self, path: Path) -> None:
        self.path = path

    def entries(self, op: str | None = None) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        lines = [json.loads(line) for line in self.path.read_text().splitlines()]
        return [e for e in lines if op is None or e["op"] == op]


class Serving:
    """The node's role as the agent runs it, with its heartbeat done by hand."""

    def __init__(self, role: serving.ServingRole, api: NodeApi, journal: Journal) -> None:
        self.role, self.api, self.journal = role, api, journal

    def until(self, what: str, check: Callable[[], Any], timeout: float = 60) -> Any:
        """Poll ``check`` until truthy, failing early if the engine's journal says it crashed."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = check()
            if value:
                return value
            time.sleep(0.05)
        pytest.fail(f"timed out waiting for {what}; engine journal: {self.journal.entries()}")

    def beat(self) -> dict[str, Any] | None:
        """One heartbeat carrying the server's news, as the agent's heartbeat thread sends it."""
        server = self.role.to_send(registering=False)
        self.api.heartbeat(server=server)
        self.role.delivered(server)
        return server

    def ready(self) -> dict[str, Any]:
        report = self.until("the engine to be ready", lambda: self.role.to_send(registering=False))
        assert "down" not in report, report
        return report


@pytest.fixture
def node_serving(live_server, settings, tmp_path: Path, monkeypatch) -> Iterator[Serving]:
    settings.TRAINHUB_CONTROL_URL = live_server.url  # the signed URLs the loader fetches
    node, token = node_create(name="serve-a")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    vllm = bin_dir / "vllm"
    vllm.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE}" "$@"\n')
    vllm.chmod(0o755)
    journal = Journal(tmp_path / "vllm.jsonl")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_VLLM_JOURNAL", str(journal.path))
    monkeypatch.setattr(serving, "RESTART_FIRST_SECONDS", 0.1)
    port = _free_port_pair()
    config = node_settings.config_from({
        "TRAINHUB_NODE_NAME": node.name, "TRAINHUB_NODE_TOKEN": token,
        "CELERY_BROKER_URL": "redis://127.0.0.1:6379/15", "TRAINHUB_CONTROL_URL": live_server.url,
        "TRAINHUB_NODE_WORKDIR": str(tmp_path / "work"), "TRAINHUB_NODE_SERVE_MODEL": BASE,
        "TRAINHUB_NODE_SERVE_HOST": "127.0.0.1", "TRAINHUB_NODE_SERVE_PORT": str(port),
        "TRAINHUB_NODE_SERVE_URL": f"http://127.0.0.1:{port}",
        "TRAINHUB_NODE_SERVE_MAX_ADAPTERS": "1",
        "PATH": os.environ["PATH"],
    })  # fmt: skip
    assert config.serve is not None and config.serve.engine == "vllm", "vllm on PATH is chosen"
    role = serving.ServingRole(config.serve)
    api = NodeApi(config)
    api.heartbeat(registration=node_settings.registration(config, "celery@serve-a", "p1"))
    role.start()
    try:
        yield Serving(role, api, journal)
    finally:
        role.stop()
        api.close()


class Bundle(NamedTuple):
    key: str
    sha256: str
    size: int


@pytest.fixture
def bundle(project, tmp_path: Path) -> Bundle:
    """An adapter bundle in the control plane's storage."""
    src = tmp_path / "adapter"
    src.mkdir()
    (src / "adapter_model.safetensors").write_bytes(bytes(range(256)) * 400)
    (src / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": BASE}))
    buf = io.BytesIO()
    write_bundle(src, buf)
    key = storage.bundle_key(project.pk, "ftjob-serving", 1)
    storage.save_stream(key, [buf.getvalue()])
    return Bundle(key, hashlib.sha256(buf.getvalue()).hexdigest(), len(buf.getvalue()))


def _succeeded(make_job, bundle: Bundle, *, sha256: str | None = None) -> TrainingJob:
    """A succeeded job whose adapter is ``bundle`` (or claims another sha256: bytes that do not
    match what was recorded)."""
    job = make_job()
    TrainingJob.objects.filter(pk=job.pk).update(status=JobStatus.SUCCEEDED)
    job.refresh_from_db()
    Artifact.objects.create(
        job=job, kind=Artifact.Kind.ADAPTER, storage_key=bundle.key, filename="adapter.tar",
        size=bundle.size, sha256=sha256 or bundle.sha256, verified=True,
    )  # fmt: skip
    return job


def _place(job: TrainingJob) -> Deployment:
    deployment, _ = deployment_create(job=job)
    placed = deployment_place(deployment_pk=deployment.pk)
    assert placed is not None
    return placed


def test_the_node_serves_vllm_loads_checked_bundles_and_survives_a_restart(
    node_serving: Serving, bundle: Bundle, make_job, sent
) -> None:
    journal = node_serving.journal
    report = node_serving.ready()
    start = journal.entries("start")[0]
    assert not start["key_in_argv"], "the API key goes in VLLM_API_KEY, never in argv"
    assert {"--enable-lora", "--max-loras", "--served-model-name"} <= set(start["argv"])
    assert node_serving.beat() == report
    server = InferenceServer.objects.get(name="node-serve-a")
    assert server.node is not None and server.node.name == "serve-a"
    assert (server.base_model, server.max_adapters) == (BASE, 1)
    assert server.loader_url.endswith(str(int(server.url.rsplit(":", 1)[1]) + 1))
    assert report["api_key"] not in server.api_key_ciphertext, "stored encrypted"
    assert node_serving.role.to_send(registering=False) is None, "sent once, until it changes"

    # Loaded from a local folder holding exactly the bundle's files.
    job = _succeeded(make_job, bundle)
    first = _place(job)
    assert first.state == Deployment.State.LOADED and first.server == server, first.detail
    (load,) = journal.entries("load")
    assert load["name"] == first.name and Path(load["path"]).name == bundle.sha256
    assert set(load["files"]) == {"adapter_config.json", "adapter_model.safetensors"}
    assert _place(job).pk == first.pk and len(journal.entries("load")) == 1, "reused"

    # Bytes that do not match the recorded sha256 never reach vLLM. (Room is made before the
    # server fetches, so the adapter it held was unloaded: it loads again when next placed.)
    corrupt = _place(_succeeded(make_job, bundle, sha256="0" * 64))
    assert corrupt.state == Deployment.State.FAILED and "sha256" in corrupt.detail
    assert [e["name"] for e in journal.entries("load")] == [first.name]

    # At its limit (one adapter) the least recently used is unloaded first.
    second = _place(_succeeded(make_job, bundle))
    assert second.state == Deployment.State.LOADED, second.detail
    first = _place(job)
    assert first.state == Deployment.State.LOADED, first.detail
    assert [(e["op"], e["name"]) for e in journal.entries() if e["op"] != "start"] == [
        ("load", first.name), ("unload", first.name), ("load", second.name),
        ("unload", second.name), ("load", first.name),
    ]  # fmt: skip
    second.refresh_from_db()
    assert second.state == Deployment.State.PENDING and second.server is None

    # vLLM dies: the node says so, the server is taken out and its adapter waits; the restarted
    # engine is a new instance, and what the last one held is placed on it again.
    sent.clear()
    old_pid = node_serving.role.engine_pid()
    assert old_pid is not None
    os.kill(old_pid, signal.SIGKILL)
    down = node_serving.until("the node to see the engine die",
                              lambda: node_serving.role.to_send(registering=False))  # fmt: skip
    if "down" in down:  # the restart may already be up by now; then the new instance says it all
        assert node_serving.beat() == down
        server.refresh_from_db()
        assert server.status == InferenceServer.Status.OFFLINE
    again = node_serving.ready()
    assert again["instance"] != report["instance"]
    node_serving.beat()
    server.refresh_from_db()
    first.refresh_from_db()
    assert server.status == InferenceServer.Status.ONLINE and server.instance == again["instance"]
    assert first.state == Deployment.State.PENDING and first.server is None
    assert [first.pk] in sent.named(cc.PLACE_DEPLOYMENT)
    assert _place(job).state == Deployment.State.LOADED
    reload = journal.entries("load")[-1]
    assert reload["name"] == first.name and reload["pid"] != old_pid

    # The node goes away: its server with it, the adapter waits for another server.
    node_serving.api.heartbeat(stopping=True)
    node = GpuNode.objects.get(name="serve-a")
    assert node.status == GpuNode.Status.OFFLINE
    assert [node.pk] in sent.named(cc.NODE_SERVERS_LOST)
    assert node_servers_lost(node_pk=node.pk) == 1
    first.refresh_from_db()
    assert first.state == Deployment.State.PENDING and first.server is None

    pid = node_serving.role.engine_pid()
    node_serving.role.stop()
    assert pid is not None and node_serving.role.engine_pid() is None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


@pytest.mark.parametrize(
    ("server", "param"),
    [
        ("yes", "server"),
        ({"base_model": "../etc", "url": "http://a:1", "loader_url": "http://a:2",
          "api_key": "k" * 32, "max_adapters": 1, "instance": "i"}, "server.base_model"),
        ({"base_model": BASE, "url": "file:///etc/passwd", "loader_url": "http://a:2",
          "api_key": "k" * 32, "max_adapters": 1, "instance": "i"}, "server.url"),
        ({"base_model": BASE, "url": "http://a:99999", "loader_url": "http://a:2",
          "api_key": "k" * 32, "max_adapters": 1, "instance": "i"}, "server.url"),
        ({"base_model": BASE, "url": "http://user:pw@a:1", "loader_url": "http://a:2",
          "api_key": "k" * 32, "max_adapters": 1, "instance": "i"}, "server.url"),
        ({"base_model": BASE, "url": "http://a:1", "loader_url": "http://a:2",
          "api_key": "short", "max_adapters": 1, "instance": "i"}, "server.api_key"),
        ({"base_model": BASE, "url": "http://a:1", "loader_url": "http://a:2",
          "api_key": "k" * 32, "max_adapters": 1000, "instance": "i"}, "server.max_adapters"),
        ({"base_model": BASE, "url": "http://a:1", "loader_url": "http://a:2",
          "api_key": "k" * 32, "max_adapters": True, "instance": "i"}, "server.max_adapters"),
        ({"base_model": BASE, "url": "http://a:1", "loader_url": "http://a:2",
          "api_key": "k" * 32, "max_adapters": 1, "instance": "../x"}, "server.instance"),
    ],
)  # fmt: skip
def test_a_node_s_bad_server_report_is_refused_whole(client, server: object, param: str) -> None:
    node, token = node_create(name="serve-b")
    answer = client.post(
        f"/api/v1/nodes/{node.name}/heartbeat/", {"server": server},
        content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}",
    )  # fmt: skip
    assert answer.status_code == 400, answer.content
    assert answer.json()["error"]["param"] == param
    assert not InferenceServer.objects.exists()
    node.refresh_from_db()
    assert node.last_heartbeat_at is None, "nothing of a refused heartbeat is stored"


def test_the_loader_refuses_what_is_not_a_bundle_url_and_calls_without_its_key(
    node_serving: Serving,
) -> None:
    import requests

    report = node_serving.ready()
    loader = report["loader_url"]
    key = {"Authorization": f"Bearer {report['api_key']}"}
    body = {"lora_name": "x", "lora_path": "/etc"}
    assert requests.post(f"{loader}/v1/load_lora_adapter", json=body, timeout=10).status_code == 401
    refused = requests.post(f"{loader}/v1/load_lora_adapter", json=body, headers=key, timeout=10)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "lora_path"
    assert node_serving.journal.entries("load") == [], "a local path never passes the loader"


def _listening(command: list[str], **env: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, **env})  # fmt: skip
    assert proc.stdout is not None
    line = proc.stdout.readline()  # blocks until it listens (or dies: an empty line)
    assert line.startswith("serving on "), (line, proc.poll())
    return proc, line.removeprefix("serving on ").strip()


def test_beside_an_operator_run_vllm_the_serve_loader_loads_checked_bundles(
    live_server, settings, tmp_path: Path, bundle: Bundle, make_job, monkeypatch
) -> None:
    """vLLM run by the operator, registered by URL: ``python -m gpu_worker serve-loader`` beside
    it is where trainhub loads adapters (``register_server --loader-url``)."""
    settings.TRAINHUB_CONTROL_URL = live_server.url
    journal = Journal(tmp_path / "vllm.jsonl")
    port = _free_port_pair()
    key = "operator-vllm-key-0123456789"
    env = {"VLLM_API_KEY": key, "FAKE_VLLM_JOURNAL": str(journal.path),
           "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}  # fmt: skip
    vllm = subprocess.Popen([sys.executable, str(FAKE), "serve", BASE, "--host", "127.0.0.1",
                             "--port", str(port), "--enable-lora"], env={**os.environ, **env})  # fmt: skip
    loader, loader_url = _listening(
        [sys.executable, "-m", "gpu_worker", "serve-loader", f"http://127.0.0.1:{port}",
         "--port", "0", "--adapter-cache", str(tmp_path / "cache")], VLLM_API_KEY=key,
    )  # fmt: skip
    try:
        monkeypatch.setattr(sys, "stdin", io.StringIO(key + "\n"))
        call_command("register_server", "ops-vllm", f"http://127.0.0.1:{port}", "--base-model",
                     BASE, "--loader-url", loader_url, "--api-key-stdin", stdout=io.StringIO())  # fmt: skip
        job = _succeeded(make_job, bundle)
        placed = _place(job)
        assert placed.state == Deployment.State.LOADED, placed.detail
        (load,) = journal.entries("load")
        assert load["name"] == placed.name and Path(load["path"]).name == bundle.sha256
        assert (tmp_path / "cache" / bundle.sha256 / "adapter_config.json").is_file()
    finally:
        for proc in (loader, vllm):
            proc.terminate()
            proc.wait(timeout=30)
