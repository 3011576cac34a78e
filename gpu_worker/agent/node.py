"""A GPU node's identity and what it reports about itself (no Django, no CUDA init).

Read once from the environment of ``celery -A gpu_worker.celery_app worker``:

| variable | meaning |
|---|---|
| ``TRAINHUB_NODE_NAME`` | node name (default: the hostname); its queue is ``gpu.node.<name>`` |
| ``TRAINHUB_NODE_TOKEN`` | the token shown once by ``POST /api/v1/nodes/`` (required) |
| ``TRAINHUB_CONTROL_URL`` | the control plane's base URL: claims, heartbeats, reports (required) |
| ``CELERY_BROKER_URL`` | the broker, without credentials: the node adds its own user |
|  | (``trainhub-node-<name>``, password its token) unless the URL names a user (required) |
| ``TRAINHUB_BROKER_USER_PREFIX`` | that user's prefix (``trainhub-node-``), as the control plane's: set on both when several installations share one Redis |
| ``TRAINHUB_NODE_LABELS`` | ``key=value,key=value`` for jobs' ``node_selector`` |
| ``TRAINHUB_NODE_EPHEMERAL`` | ``1``: exit after one job |
| ``TRAINHUB_NODE_GPUS`` | override the probe: ``NAME:VRAM_MIB,...`` (empty: no GPU) |
| ``TRAINHUB_NODE_WORKDIR`` | scratch space for attempts (default: a directory under /tmp) |
| ``TRAINHUB_NODE_HEARTBEAT_SECONDS`` | heartbeat period (30) |
| ``TRAINHUB_NODE_CONTROL_POLL_SECONDS`` | while an attempt runs: how often to ask for a cancel (2) |
| ``TRAINHUB_NODE_CANCEL_GRACE_SECONDS`` | after a cancel: wait this for the executor to stop by itself, then SIGTERM, then as long again before SIGKILL (30) |
| ``TRAINHUB_NODE_PAUSE_GRACE_SECONDS`` | after a pause: wait this for the executor to upload its checkpoint and stop, then SIGTERM as for a cancel (600) |
| ``TRAINHUB_CHECKPOINT_EVERY_STEPS`` / ``_SECONDS`` | checkpoint cadence passed to the executor |
| ``TRAINHUB_NODE_MODEL_DIRS`` | absolute directories of local models (``,`` or ``:`` separated): each, and each model directory inside one, is reported as cached |
| ``TRAINHUB_NODE_MODEL_SCAN_SECONDS`` | rescan the model caches at least this often (300); a change of the directories rescans sooner |
| ``HF_HUB_CACHE`` / ``HF_HOME`` | the Hugging Face hub cache whose complete snapshots are reported as cached (gpu_worker.agent.model_cache) |
| ``TRAINHUB_NODE_WARM_EXECUTOR`` | ``0``: start every executor cold; default on (not on an ephemeral node): the next attempt's executor is started ahead with its imports done (gpu_worker.warm) |
| ``TRAINHUB_NODE_SERVE_*`` | the serving role: an inference server for one base model (gpu_worker.agent.serving_config) |
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

from gpu_worker.agent import model_cache
from gpu_worker.agent.serving_config import ServeConfig, serve_config_from
from trainhub_contract import celery_conf

_NAME = re.compile(r"[^A-Za-z0-9_.-]")
_OFF = ("0", "false", "no", "off")


@dataclass(frozen=True)
class NodeConfig:
    name: str
    token: str = field(repr=False)
    broker_url: str = field(repr=False)
    control_url: str
    labels: dict[str, str]
    ephemeral: bool
    workdir: Path
    heartbeat_seconds: float
    control_poll_seconds: float
    cancel_grace_seconds: float
    checkpoint_every_steps: int | None
    checkpoint_every_seconds: float | None
    gpus_override: str | None
    # A pause uploads a checkpoint before the executor exits: it may take minutes on a large model.
    pause_grace_seconds: float = 600.0
    # Where cached base models are looked for (gpu_worker.agent.model_cache); None: not looked for.
    hub_cache: Path | None = None
    model_dirs: tuple[Path, ...] = ()
    model_scan_seconds: float = model_cache.DEFAULT_SCAN_SECONDS
    # Keep the next executor started ahead (gpu_worker.warm). config_from turns it on; off
    # here, so a NodeConfig built by hand (tests, tools) starts no background process.
    warm_executor: bool = False
    serve: ServeConfig | None = None  # the serving role (gpu_worker.agent.serving)

    @property
    def queue(self) -> str:
        return celery_conf.node_queue(self.name)

    def cancel_file(self, job_id: str, attempt: int) -> Path:
        """Where a cancel request for an attempt appears (the executor watches it)."""
        return self.workdir / "cancel" / f"{job_id}-a{attempt}"


def _parse_labels(text: str) -> dict[str, str]:
    labels: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"TRAINHUB_NODE_LABELS: bad label {part!r}, expected key=value")
        labels[key.strip()] = value.strip()
    return labels


def _optional_number(env: dict[str, str], name: str, kind: type) -> Any:
    value = env.get(name, "").strip()
    return kind(value) if value else None


@cache
def config() -> NodeConfig:
    """This process's node settings; raises ValueError naming a missing or bad variable."""
    return config_from(dict(os.environ))


def config_from(env: dict[str, str]) -> NodeConfig:
    name = _NAME.sub("-", env.get("TRAINHUB_NODE_NAME") or socket.gethostname())[:100]
    token = env.get("TRAINHUB_NODE_TOKEN", "")
    broker = env.get("CELERY_BROKER_URL", "")
    control_url = env.get("TRAINHUB_CONTROL_URL", "").rstrip("/")
    if not token:
        raise ValueError("TRAINHUB_NODE_TOKEN is not set: create the node (POST /api/v1/nodes/)")
    if not broker:
        raise ValueError("CELERY_BROKER_URL is not set: the node needs the control plane's broker")
    if not control_url.startswith(("http://", "https://")):
        raise ValueError(
            "TRAINHUB_CONTROL_URL is not set to an http(s) URL: the node claims attempts and "
            "reports to the control plane there"
        )
    workdir = env.get("TRAINHUB_NODE_WORKDIR") or str(
        Path(tempfile.gettempdir()) / f"trainhub-node-{name}"
    )
    ephemeral = env.get("TRAINHUB_NODE_EPHEMERAL", "").lower() in ("1", "true", "yes")
    warm = env.get("TRAINHUB_NODE_WARM_EXECUTOR", "1").strip().lower() not in _OFF
    return NodeConfig(
        name=name,
        token=token,
        broker_url=with_node_credentials(broker, name, token),
        control_url=control_url,
        labels=_parse_labels(env.get("TRAINHUB_NODE_LABELS", "")),
        ephemeral=ephemeral,
        workdir=Path(workdir),
        heartbeat_seconds=float(
            env.get("TRAINHUB_NODE_HEARTBEAT_SECONDS") or celery_conf.NODE_HEARTBEAT_SECONDS
        ),
        control_poll_seconds=float(env.get("TRAINHUB_NODE_CONTROL_POLL_SECONDS") or 2),
        cancel_grace_seconds=float(env.get("TRAINHUB_NODE_CANCEL_GRACE_SECONDS") or 30),
        pause_grace_seconds=float(env.get("TRAINHUB_NODE_PAUSE_GRACE_SECONDS") or 600),
        checkpoint_every_steps=_optional_number(env, "TRAINHUB_CHECKPOINT_EVERY_STEPS", int),
        checkpoint_every_seconds=_optional_number(env, "TRAINHUB_CHECKPOINT_EVERY_SECONDS", float),
        gpus_override=env.get("TRAINHUB_NODE_GPUS"),
        hub_cache=model_cache.hub_cache_dir(env),
        model_dirs=model_cache.parse_model_dirs(env.get("TRAINHUB_NODE_MODEL_DIRS", "")),
        model_scan_seconds=float(
            env.get("TRAINHUB_NODE_MODEL_SCAN_SECONDS") or model_cache.DEFAULT_SCAN_SECONDS
        ),
        warm_executor=warm and not ephemeral,  # an ephemeral node has no next attempt
        serve=serve_config_from(env, Path(workdir)),
    )


def with_node_credentials(broker_url: str, name: str, token: str) -> str:
    """The broker URL as this node's own Redis user (``trainhub-node-<name>``, password its
    token), which reaches only the node's queue. A URL that already names a user, and the
    embedded broker's unix socket, are kept: single-tenant setups (docs/SECURITY.md)."""
    parts = urlsplit(broker_url)
    if parts.username or parts.scheme not in ("redis", "rediss"):
        return broker_url
    user = quote(celery_conf.node_broker_username(name), safe="")
    netloc = f"{user}:{quote(token, safe='')}@{parts.netloc}"
    return urlunsplit(parts._replace(netloc=netloc))


# --- capabilities ---------------------------------------------------------------------------


def _gpus_from_override(text: str) -> list[dict[str, Any]]:
    gpus = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, vram = part.rpartition(":")
        gpus.append({"name": name or part, "vram_mb": int(vram) if vram.isdigit() else 0})
    return gpus


def _nvidia_smi(*args: str) -> str:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return ""
    try:
        return subprocess.run(  # noqa: S603 - a fixed binary and arguments
            [exe, *args], capture_output=True, text=True, timeout=20, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def probe(node: NodeConfig) -> dict[str, Any]:
    """GPUs, driver and CUDA versions, and the backend, without initialising CUDA here: the
    worker's parent process must not hold a CUDA context (each attempt runs in a child)."""
    caps: dict[str, Any] = {"hostname": socket.gethostname()}
    if node.gpus_override is not None:
        gpus = _gpus_from_override(node.gpus_override)
    else:
        rows = _nvidia_smi(
            "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader,nounits"
        )
        gpus = []
        for line in rows.splitlines():
            parts = [p.strip() for p in line.split(",")]
            if len(parts) == 3:
                gpus.append({"name": parts[0], "vram_mb": int(float(parts[1] or 0))})
                caps["driver_version"] = parts[2]
        cuda = re.search(r"CUDA Version:\s*([\d.]+)", _nvidia_smi()) if gpus else None
        if cuda:
            caps["cuda_version"] = cuda.group(1)
    caps["gpus"] = gpus
    caps["gpu_count"] = len(gpus)
    # find_spec looks for the package without importing it (importing Unsloth needs CUDA).
    unsloth = gpus and importlib.util.find_spec("unsloth") is not None
    caps["backend"] = "unsloth" if unsloth else "peft"
    return caps


def registration(node: NodeConfig, celery_hostname: str, process: str) -> dict[str, Any]:
    """The report sent with ``trainhub.node_register``; ``process`` names this worker process
    (a new value tells the control plane the node restarted)."""
    return {
        "capabilities": probe(node),
        "labels": node.labels,
        "ephemeral": node.ephemeral,
        "celery_hostname": celery_hostname,
        "process": process,
    }
