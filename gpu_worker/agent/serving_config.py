"""The serving role's settings, from the node's environment (the role: gpu_worker.agent.serving).

| Variable | Meaning |
|---|---|
| ``TRAINHUB_NODE_SERVE_MODEL`` | the base model to serve, as jobs name it (a hub id in the node's cache, or an absolute path); unset: no serving role |
| ``TRAINHUB_NODE_SERVE_ENGINE`` | ``vllm`` or ``embedded`` (default: vllm when the ``vllm`` command exists) |
| ``TRAINHUB_NODE_SERVE_HOST`` | the address both listen on (``0.0.0.0``) |
| ``TRAINHUB_NODE_SERVE_PORT`` | the engine's port (8000); the loader's is the next one |
| ``TRAINHUB_NODE_SERVE_URL`` | the engine's base URL as the control plane reaches it (``http://<hostname>:<port>``); the loader's is the same host, next port |
| ``TRAINHUB_NODE_SERVE_MAX_ADAPTERS`` | adapters held at once (4): vLLM's ``--max-loras`` |
| ``TRAINHUB_NODE_SERVE_ARGS`` | more engine arguments, shell-quoted (``--gpu-memory-utilization 0.5 --max-lora-rank 128``) |
"""

from __future__ import annotations

import shlex
import shutil
import socket
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ENGINES = ("vllm", "embedded")


@dataclass(frozen=True)
class ServeConfig:
    model: str
    engine: str
    host: str
    port: int
    url: str
    loader_url: str
    max_adapters: int
    extra_args: tuple[str, ...]
    adapter_cache: Path


def serve_config_from(env: dict[str, str], workdir: Path) -> ServeConfig | None:
    """The serving role's settings (None: the node does not serve); ValueError names a bad one."""
    model = env.get("TRAINHUB_NODE_SERVE_MODEL", "").strip()
    if not model:
        return None
    engine = env.get("TRAINHUB_NODE_SERVE_ENGINE") or (
        "vllm" if shutil.which("vllm") else "embedded"
    )
    if engine not in ENGINES:
        raise ValueError(f"TRAINHUB_NODE_SERVE_ENGINE must be one of {', '.join(ENGINES)}")
    try:
        port = int(env.get("TRAINHUB_NODE_SERVE_PORT") or 8000)
        max_adapters = int(env.get("TRAINHUB_NODE_SERVE_MAX_ADAPTERS") or 4)
    except ValueError:
        raise ValueError("TRAINHUB_NODE_SERVE_PORT and _MAX_ADAPTERS must be integers") from None
    if not 1 <= port < 65535 or not 1 <= max_adapters <= 64:
        raise ValueError("TRAINHUB_NODE_SERVE_PORT must be 1-65534, _MAX_ADAPTERS 1-64")
    url = (env.get("TRAINHUB_NODE_SERVE_URL") or f"http://{socket.gethostname()}:{port}").rstrip(
        "/"
    )
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.port is None:
        raise ValueError("TRAINHUB_NODE_SERVE_URL must be an http(s) URL with a port")
    return ServeConfig(
        model=model,
        engine=engine,
        host=env.get("TRAINHUB_NODE_SERVE_HOST") or "0.0.0.0",  # noqa: S104 - the control plane calls in
        port=port,
        url=url,
        loader_url=urlunsplit(parts._replace(netloc=f"{parts.hostname}:{parts.port + 1}")),
        max_adapters=max_adapters,
        extra_args=tuple(shlex.split(env.get("TRAINHUB_NODE_SERVE_ARGS", ""))),
        adapter_cache=workdir / "serving-adapters",
    )
