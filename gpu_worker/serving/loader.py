"""The adapter loader beside a vLLM server: vLLM loads a LoRA adapter only from a local path (or
a hub id), while the control plane hands out a signed bundle URL and its sha256. The loader
answers vLLM's two runtime LoRA routes itself: it fetches the bundle, checks it against that
sha256 and its manifest, unpacks it into a cache folder named by the sha256
(gpu_worker.serving.adapters, the embedded server's own code) and passes vLLM the folder, then
gives back vLLM's answer as it came. Nothing that fails a check reaches vLLM.

A GPU node with the serving role runs one in its agent (gpu_worker.agent.serving); beside a
vLLM an operator runs, it is ``python -m gpu_worker serve-loader ENGINE_URL`` on the same
machine, registered with ``manage.py register_server ... --loader-url``. It takes the engine's
API key and checks callers against it.
"""

from __future__ import annotations

from collections.abc import Callable
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import requests

from gpu_worker.serving.adapters import fetch_adapter, is_url
from gpu_worker.serving.engine import EngineError
from gpu_worker.serving.server import Handler, ServingHTTPServer

ENGINE_CALL_SECONDS = 600  # a load reads the adapter's weights onto the GPU


class LoaderHandler(Handler):
    """The loader's HTTP side: vLLM's two LoRA endpoints, with the bundle fetched and checked
    here and the engine given its local folder."""

    engine_url: str

    def do_GET(self) -> None:
        if self.path.split("?", 1)[0].rstrip("/") == "/health":
            self._send(200, {"status": "ok"})
        else:
            self._fail(404, f"No route {self.path}.")

    def post_routes(self) -> dict[str, Callable[[dict[str, Any]], None]]:
        return {"/v1/load_lora_adapter": self._load, "/v1/unload_lora_adapter": self._unload}

    def _load(self, body: dict[str, Any]) -> None:
        name, url = body.get("lora_name"), body.get("lora_path")
        if not isinstance(name, str) or not isinstance(url, str) or not is_url(url):
            raise EngineError("lora_name must be a string and lora_path a bundle URL.",
                              param="lora_path")  # fmt: skip
        folder = fetch_adapter(url, body.get("sha256"), self.adapter_cache)
        self._forward("/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(folder)})

    def _unload(self, body: dict[str, Any]) -> None:
        name = body.get("lora_name")
        if not isinstance(name, str):
            raise EngineError("lora_name must be a string.", param="lora_name")
        self._forward("/v1/unload_lora_adapter", {"lora_name": name})

    def _forward(self, path: str, body: dict[str, str]) -> None:
        """The engine's answer, as it gave it (the control plane reads vLLM's statuses)."""
        key = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        try:
            answer = requests.post(
                self.engine_url + path, json=body, headers=key, timeout=ENGINE_CALL_SECONDS
            )
        except requests.RequestException as exc:
            raise EngineError(f"the engine did not answer: {exc}", status=503) from exc
        is_json = answer.headers.get("Content-Type", "").startswith("application/json")
        try:
            content = answer.json() if is_json else answer.text
        except ValueError:
            content, is_json = answer.text, False
        self._send(answer.status_code, content, "application/json" if is_json else "text/plain")


def make_loader(
    engine_url: str, host: str, port: int, api_key: str | None, adapter_cache: Path
) -> ThreadingHTTPServer:
    """The loader's server, not yet serving (``serve_forever`` it on a thread of your own)."""
    bound = {"engine_url": engine_url.rstrip("/"), "api_key": api_key or None,
             "adapter_cache": adapter_cache}  # fmt: skip
    return ServingHTTPServer((host, port), type("BoundLoaderHandler", (LoaderHandler,), bound))
