"""A GPU node's serving role: an inference server for one base model, started and supervised by
the node agent, registered with the node's heartbeat (jobs/services/serving/node_servers.py).

Two processes on the node, two ports:

- The engine, on ``TRAINHUB_NODE_SERVE_PORT``: vLLM's OpenAI server (``vllm serve MODEL
  --enable-lora``, runtime LoRA updating on) when ``vllm`` is installed, else the embedded
  server (``python -m gpu_worker serve``). Completions go straight to it.
- The loader (gpu_worker.serving.loader), one port up, in the agent: vLLM loads an adapter only
  from a local path, so the control plane's ``load_lora_adapter`` (a signed bundle URL and its
  sha256) comes here; the loader fetches and checks the bundle and hands the engine a local
  folder. Nothing that fails a check reaches the engine.

Both answer only with the API key the agent made for them (a bearer token, random per agent
process, sent to the control plane over HTTPS with the server's registration; never logged).
The engine is restarted when it exits, after 5 s doubling to 5 minutes (reset after an hour
up); each run is a new ``instance``, and the control plane places again what the last one held.
Stopping the agent stops the engine (SIGTERM, then SIGKILL after 30 s).

Settings: gpu_worker.agent.serving_config.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from http.server import ThreadingHTTPServer
from typing import Any

import requests

from gpu_worker.agent.children import child_env, die_with_parent, signal_group
from gpu_worker.agent.serving_config import ServeConfig
from gpu_worker.serving.loader import make_loader

log = logging.getLogger(__name__)

VLLM_MAX_LORA_RANK = 64  # the largest r trainhub's job spec accepts
HEALTH_POLL_SECONDS = 1.0
RESTART_FIRST_SECONDS, RESTART_MAX_SECONDS, RESTART_RESET_SECONDS = 5.0, 300.0, 3600.0
STOP_GRACE_SECONDS = 30.0


def engine_command(config: ServeConfig, api_key: str) -> tuple[list[str], dict[str, str]]:
    """The engine's argv and the environment it adds (its API key goes there, not in argv,
    which any user of the machine can read)."""
    common = ["--host", config.host, "--port", str(config.port),
              "--served-model-name", config.model]  # fmt: skip
    if config.engine == "vllm":
        argv = [shutil.which("vllm") or "vllm", "serve", config.model, *common, "--enable-lora",
                "--max-loras", str(config.max_adapters),
                "--max-lora-rank", str(VLLM_MAX_LORA_RANK)]  # fmt: skip
        env = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True", "VLLM_API_KEY": api_key}
    else:
        argv = [sys.executable, "-m", "gpu_worker", "serve", config.model, *common,
                "--max-adapters", str(config.max_adapters)]  # fmt: skip
        env = {"TRAINHUB_SERVE_API_KEY": api_key}
    return [*argv, *config.extra_args], env  # an operator's argument wins (the last one does)


class ServingRole:
    """Runs the loader and keeps the engine running; ``to_send``/``delivered`` feed the
    heartbeat, and ``on_change`` (the heartbeat's wake-up) is called when there is news."""

    def __init__(self, config: ServeConfig, on_change: Callable[[], None] = lambda: None) -> None:
        self.config = config
        self.api_key = secrets.token_urlsafe(32)
        self._on_change = on_change
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._report: dict[str, Any] | None = None  # what the control plane should know now
        self._sent: dict[str, Any] | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._loader: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        host = config.host
        local = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host  # noqa: S104
        self.engine_url = f"http://{local}:{config.port}"

    # --- the heartbeat's side ------------------------------------------------------------------

    def to_send(self, *, registering: bool) -> dict[str, Any] | None:
        """The server report to send with this heartbeat: when it changed, or registering."""
        with self._lock:
            report = self._report
            return report if report is not None and (registering or report != self._sent) else None

    def delivered(self, report: dict[str, Any] | None) -> None:
        if report is not None:
            with self._lock:
                self._sent = report

    def _tell(self, report: dict[str, Any]) -> None:
        with self._lock:
            self._report = report
        self._on_change()

    # --- running -------------------------------------------------------------------------------

    def start(self) -> None:
        self._loader = make_loader(
            self.engine_url,
            self.config.host,
            self.config.port + 1,
            self.api_key,
            self.config.adapter_cache,
        )
        threading.Thread(target=self._loader.serve_forever, name="serving-loader",
                         daemon=True).start()  # fmt: skip
        self._thread = threading.Thread(target=self._supervise, name="serving-engine", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._loader is not None:
            self._loader.shutdown()
            self._loader.server_close()
        if self._thread is not None:
            self._thread.join(timeout=STOP_GRACE_SECONDS * 2 + 5)

    def engine_pid(self) -> int | None:
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def _supervise(self) -> None:
        """Start the engine, register it once healthy, start it again when it exits."""
        backoff = RESTART_FIRST_SECONDS
        while not self._stop.is_set():
            started = time.monotonic()
            code = self._run_once()
            if self._stop.is_set():
                return
            if time.monotonic() - started > RESTART_RESET_SECONDS:
                backoff = RESTART_FIRST_SECONDS
            log.warning("the %s engine exited (%s): starting it again in %.0f s",
                        self.config.engine, code, backoff)  # fmt: skip
            self._tell({"down": f"the {self.config.engine} engine exited ({code}); restarting"})
            if self._stop.wait(backoff):
                return
            backoff = min(backoff * 2, RESTART_MAX_SECONDS)

    def _run_once(self) -> int | str:
        argv, extra_env = engine_command(self.config, self.api_key)
        log.info("starting the %s engine for %s", self.config.engine, self.config.model)
        try:
            proc = subprocess.Popen(  # noqa: S603 - the operator's engine, argv built above
                argv, env={**child_env(), **extra_env}, start_new_session=True,
                preexec_fn=die_with_parent,
            )  # fmt: skip
        except OSError as exc:
            return f"could not start: {exc}"
        self._proc = proc
        try:
            if self._wait_healthy(proc):
                log.info("the %s engine is serving %s", self.config.engine, self.config.model)
                self._tell(self._ready_report())
                while proc.poll() is None and not self._stop.wait(HEALTH_POLL_SECONDS):
                    pass
        finally:
            if proc.poll() is None:
                self._terminate(proc)
        return proc.returncode

    def _wait_healthy(self, proc: subprocess.Popen[bytes]) -> bool:
        """Until the engine answers /health (vLLM takes minutes to load a model), it exits, or
        the agent stops."""
        health = f"{self.engine_url}/health"
        while proc.poll() is None and not self._stop.is_set():
            with contextlib.suppress(requests.RequestException):
                if requests.get(health, timeout=5).status_code == 200:
                    return True
            self._stop.wait(HEALTH_POLL_SECONDS)
        return False

    def _ready_report(self) -> dict[str, Any]:
        return {
            "base_model": self.config.model,
            "url": self.config.url,
            "loader_url": self.config.loader_url,
            "api_key": self.api_key,
            "max_adapters": self.config.max_adapters,
            "instance": uuid.uuid4().hex,
        }

    @staticmethod
    def _terminate(proc: subprocess.Popen[bytes]) -> None:
        signal_group(proc, signal.SIGTERM)
        try:
            proc.wait(timeout=STOP_GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            log.warning("the engine ignored SIGTERM for %.0f s: SIGKILL", STOP_GRACE_SECONDS)
            signal_group(proc, signal.SIGKILL)
            proc.wait()
