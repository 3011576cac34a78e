"""A stand-in for vLLM's OpenAI-compatible server, run as the node runs vLLM: ``vllm serve MODEL
--host H --port P --served-model-name NAME --enable-lora --max-loras N --max-lora-rank R``, its
API key in ``VLLM_API_KEY``, runtime LoRA updating switched on by
``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``. It answers vLLM's documented endpoints as vLLM does:

- ``GET /health`` (200, no body); ``GET /v1/models`` (the base, then each adapter with the base
  as ``parent`` and its path as ``root``).
- ``POST /v1/load_lora_adapter {lora_name, lora_path}``: only a local folder holding
  ``adapter_config.json`` loads (vLLM reads a path, never a URL); a name already loaded is a 400;
  more adapters than ``--max-loras`` is refused here (the control plane must never ask for it).
  ``POST /v1/unload_lora_adapter {lora_name}``: 404 for a name not loaded. Without runtime
  updating neither route exists (404).
- ``POST /v1/chat/completions``: the base's or an adapter's name, else 404; the answer names the
  adapter's folder, so a test can tell which bytes answered.

Every start, load and unload is appended to ``FAKE_VLLM_JOURNAL`` (JSON lines, with the pid and,
for a load, the sha256 of each file in the folder), so a test sees what reached the engine across
its restarts.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ARGS: argparse.Namespace
LOADED: dict[str, str] = {}  # name -> folder


def journal(entry: dict[str, Any]) -> None:
    with open(os.environ["FAKE_VLLM_JOURNAL"], "a") as out:
        out.write(json.dumps({"pid": os.getpid(), **entry}) + "\n")


def files_of(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def answer(self, status: int, body: Any, kind: str = "application/json") -> None:
        data = (json.dumps(body) if kind == "application/json" else str(body)).encode()
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def error(self, status: int, message: str) -> None:
        kinds = {400: "BadRequestError", 404: "NotFoundError"}
        self.answer(status, {"object": "error", "message": message,
                             "type": kinds.get(status, "Error"), "param": None, "code": status})  # fmt: skip

    def authorized(self) -> bool:
        key = os.environ.get("VLLM_API_KEY")
        if not key or not self.path.startswith("/v1"):
            return True
        if self.headers.get("Authorization") == f"Bearer {key}":
            return True
        self.answer(401, {"error": "Unauthorized"})
        return False

    def do_GET(self) -> None:
        if not self.authorized():
            return
        if self.path == "/health":
            self.answer(200, "", "text/plain")
        elif self.path == "/v1/models":
            base = {"id": ARGS.served_model_name, "object": "model", "root": ARGS.model}
            loras = [{"id": name, "object": "model", "root": path,
                      "parent": ARGS.served_model_name} for name, path in LOADED.items()]  # fmt: skip
            self.answer(200, {"object": "list", "data": [base, *loras]})
        else:
            self.error(404, "Not Found")

    def do_POST(self) -> None:
        if not self.authorized():
            return
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        runtime = os.environ.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "").lower() in ("1", "true")
        if self.path == "/v1/load_lora_adapter" and runtime:
            self.load(body["lora_name"], body["lora_path"])
        elif self.path == "/v1/unload_lora_adapter" and runtime:
            name = body["lora_name"]
            if LOADED.pop(name, None) is None:
                self.error(404, f"The lora adapter '{name}' cannot be found.")
                return
            journal({"op": "unload", "name": name})
            self.answer(200, f"Success: LoRA adapter '{name}' removed successfully.", "text/plain")
        elif self.path == "/v1/chat/completions":
            self.chat(body)
        else:
            self.error(404, "Not Found")

    def load(self, name: str, path: str) -> None:
        folder = Path(path)
        if name in LOADED:
            self.error(400, f"The lora adapter '{name}' has already been loaded.")
        elif not (folder / "adapter_config.json").is_file():
            self.error(400, f"Loading lora {name} failed: No adapter found for {path}")
        elif len(LOADED) >= ARGS.max_loras:
            self.error(400, f"more than --max-loras {ARGS.max_loras} adapters asked for")
        else:
            LOADED[name] = path
            journal({"op": "load", "name": name, "path": path, "files": files_of(folder)})
            self.answer(200, f"Success: LoRA adapter '{name}' added successfully.", "text/plain")

    def chat(self, body: dict[str, Any]) -> None:
        model = body.get("model")
        if model != ARGS.served_model_name and model not in LOADED:
            self.error(404, f"The model `{model}` does not exist.")
            return
        text = f"answered by {Path(LOADED.get(model, ARGS.model)).name}"
        self.answer(200, {
            "id": "chatcmpl-fake", "object": "chat.completion", "created": int(time.time()),
            "model": model,
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": text}}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6},
        })  # fmt: skip


def main(argv: list[str]) -> None:
    global ARGS
    parser = argparse.ArgumentParser(prog="vllm")
    parser.add_argument("command", choices=["serve"])
    parser.add_argument("model")
    parser.add_argument("--host", default="0.0.0.0")  # noqa: S104 - vLLM's default
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--served-model-name")
    parser.add_argument("--enable-lora", action="store_true")
    parser.add_argument("--max-loras", type=int, default=1)
    parser.add_argument("--max-lora-rank", type=int, default=16)
    ARGS, _ = parser.parse_known_args(argv)
    ARGS.served_model_name = ARGS.served_model_name or ARGS.model
    assert ARGS.enable_lora, "the node serves adapters: --enable-lora"
    server = ThreadingHTTPServer((ARGS.host, ARGS.port), Handler)
    journal({"op": "start", "argv": argv, "key_in_argv": os.environ["VLLM_API_KEY"] in argv})
    server.serve_forever()


if __name__ == "__main__":
    main(sys.argv[1:])
