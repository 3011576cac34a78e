"""The embedded server's HTTP side: the subset of vLLM's OpenAI-compatible API that trainhub
uses, so the control plane drives a vLLM server and this one the same way.

- ``GET /health``; ``GET /v1/models`` (the base, then each loaded adapter with the base as
  ``parent``, as vLLM lists them).
- ``POST /v1/load_lora_adapter {"lora_name", "lora_path"}`` and ``POST /v1/unload_lora_adapter
  {"lora_name"}``: vLLM's runtime LoRA endpoints, with its answers (200 and a "Success: ..."
  text; 400 for an adapter already loaded, 404 for one that is not). At its limit the engine
  unloads the least recently used adapter. trainhub's one addition: ``lora_path`` may be the
  signed URL of an adapter bundle, with its ``sha256`` beside it (gpu_worker.serving.adapters).
- ``POST /v1/chat/completions`` and ``POST /v1/completions``: OpenAI's request fields
  (temperature, top_p, max_tokens or max_completion_tokens, stop, seed, n = 1, ``stream`` with
  ``stream_options.include_usage``); ``model`` is the base's served name or an adapter's
  ``lora_name``. A streamed answer is OpenAI's server-sent chunks ending in ``data: [DONE]``.

Errors are OpenAI's ``{"error": {"message", "type", "param", "code"}}``. With an API key set
(``--api-key`` or ``TRAINHUB_SERVE_API_KEY``), every ``/v1`` request needs it as a bearer token,
as vLLM's ``--api-key`` does. Standard library HTTP: a thread per connection, generation one at
a time behind the engine's lock.
"""

from __future__ import annotations

import hmac
import json
import logging
import time
import uuid
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from gpu_worker.serving.adapters import fetch_adapter, is_url
from gpu_worker.serving.engine import Engine, EngineError, Generation, Sampling

log = logging.getLogger(__name__)
MAX_BODY_BYTES = 4 * 1024 * 1024
MAX_TOKENS_LIMIT = 32768
_SAMPLING_FIELDS = {
    "model", "messages", "prompt", "temperature", "top_p", "max_tokens",
    "max_completion_tokens", "stop", "seed", "n", "stream", "stream_options", "user", "tools",
    "tool_choice", "frequency_penalty", "presence_penalty", "logprobs", "top_logprobs",
    "response_format", "parallel_tool_calls", "metadata", "store", "echo", "suffix", "best_of",
    "logit_bias",
}  # fmt: skip


def _error_body(message: str, status: int, param: str | None = None) -> dict[str, Any]:
    kind = "invalid_request_error" if status < 500 else "server_error"
    code = {401: "invalid_api_key", 404: "model_not_found"}.get(status)
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def parse_sampling(body: dict[str, Any]) -> Sampling:
    """OpenAI's sampling fields, checked; EngineError names the first bad one."""
    unknown = sorted(set(body) - _SAMPLING_FIELDS)
    if unknown:
        raise EngineError(f"Unrecognized request argument supplied: {unknown[0]}", param=unknown[0])
    if body.get("n", 1) != 1:
        raise EngineError("Only n=1 is supported.", param="n")
    limit = body.get("max_completion_tokens", body.get("max_tokens", 256))
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_TOKENS_LIMIT:
        raise EngineError(f"max_tokens must be an integer from 1 to {MAX_TOKENS_LIMIT}.",
                          param="max_tokens")  # fmt: skip
    temperature, top_p = body.get("temperature", 1.0), body.get("top_p", 1.0)
    for name, value, high in (("temperature", temperature, 2.0), ("top_p", top_p, 1.0)):
        if not isinstance(value, int | float) or isinstance(value, bool) or not 0 <= value <= high:
            raise EngineError(f"{name} must be a number from 0 to {high:g}.", param=name)
    stop = body.get("stop") or ()
    stop = (stop,) if isinstance(stop, str) else stop
    if (
        not isinstance(stop, list | tuple)
        or len(stop) > 4
        or not all(isinstance(s, str) for s in stop)
    ):
        raise EngineError("stop must be a string or a list of at most 4 strings.", param="stop")
    seed = body.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        raise EngineError("seed must be an integer.", param="seed")
    return Sampling(max_tokens=limit, temperature=float(temperature), top_p=float(top_p),
                    stop=tuple(stop), seed=seed)  # fmt: skip


def _usage(generation: Generation) -> dict[str, int]:
    completion = len(generation.token_ids)
    return {"prompt_tokens": generation.prompt_tokens, "completion_tokens": completion,
            "total_tokens": generation.prompt_tokens + completion}  # fmt: skip


class Handler(BaseHTTPRequestHandler):
    engine: Engine
    api_key: str | None = None
    adapter_cache: Path
    protocol_version = "HTTP/1.1"
    server_version = "trainhub-serve"
    # Each streamed chunk is a small write: with Nagle's algorithm it may wait for the client's
    # delayed ACK (up to 40 ms) before it leaves, the first token included.
    disable_nagle_algorithm = True

    # --- plumbing -----------------------------------------------------------------------------

    def log_message(self, format: str, *args: Any) -> None:
        log.info("%s %s", self.address_string(), format % args)

    def _send(self, status: int, body: Any, content_type: str = "application/json") -> None:
        data = (json.dumps(body) if content_type == "application/json" else str(body)).encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _fail(self, status: int, message: str, param: str | None = None) -> None:
        self._send(status, _error_body(message, status, param))

    def _authorized(self) -> bool:
        if not self.api_key or not self.path.startswith("/v1"):
            return True
        given = self.headers.get("Authorization", "").removeprefix("Bearer ").strip()
        if hmac.compare_digest(given.encode(), self.api_key.encode()):
            return True
        self._fail(401, "Invalid or missing API key.")
        return False

    def _body(self) -> dict[str, Any] | None:
        try:
            length = int(self.headers.get("Content-Length", "0"))
        except ValueError:
            length = -1
        if not 0 <= length <= MAX_BODY_BYTES:
            self._fail(413 if length > MAX_BODY_BYTES else 400,
                       f"The body must be JSON of at most {MAX_BODY_BYTES} bytes with a Content-Length.")  # fmt: skip
            return None
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
        except ValueError as exc:
            self._fail(400, f"The body is not valid JSON: {exc}")
            return None
        if not isinstance(body, dict):
            self._fail(400, "The body must be a JSON object.")
            return None
        return body

    # --- routes -------------------------------------------------------------------------------

    def do_GET(self) -> None:
        if not self._authorized():
            return
        path = self.path.split("?", 1)[0].rstrip("/")
        if path == "/health":
            self._send(200, {"status": "ok"})
        elif path == "/v1/models":
            self._send(200, {"object": "list", "data": self.engine.models()})
        else:
            self._fail(404, f"No route {path}.")

    def post_routes(self) -> dict[str, Callable[[dict[str, Any]], None]]:
        return {
            "/v1/chat/completions": self._chat,
            "/v1/completions": self._completion,
            "/v1/load_lora_adapter": self._load,
            "/v1/unload_lora_adapter": self._unload,
        }

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        if not self._authorized():
            return
        route = self.post_routes().get(path)
        if route is None:
            self._fail(404, f"No route {path}.")
            return
        body = self._body()
        if body is None:
            return
        try:
            route(body)
        except EngineError as exc:
            self._fail(exc.status, exc.message, exc.param)
        except BrokenPipeError:  # the client went away mid-stream
            log.info("client closed the connection during %s", path)
        except Exception:
            log.exception("serving %s failed", path)
            self._fail(500, "The server failed to answer; see its log.")

    def _load(self, body: dict[str, Any]) -> None:
        name, path = body.get("lora_name"), body.get("lora_path")
        if not isinstance(name, str) or not isinstance(path, str):
            raise EngineError("lora_name and lora_path must be strings.", param="lora_name")
        if is_url(path):  # trainhub's addition: a signed bundle URL and its sha256
            path = str(fetch_adapter(path, body.get("sha256"), self.adapter_cache))
        evicted = self.engine.load_adapter(name, path)
        if evicted:
            log.info("unloaded %s (least recently used) to load %s", ", ".join(evicted), name)
        self._send(200, f"Success: LoRA adapter '{name}' added successfully.", "text/plain")

    def _unload(self, body: dict[str, Any]) -> None:
        name = body.get("lora_name")
        if not isinstance(name, str):
            raise EngineError("lora_name must be a string.", param="lora_name")
        self.engine.unload_adapter(name)
        self._send(200, f"Success: LoRA adapter '{name}' removed successfully.", "text/plain")

    def _chat(self, body: dict[str, Any]) -> None:
        messages = body.get("messages")
        if (
            not isinstance(messages, list)
            or not messages
            or not all(isinstance(m, dict) for m in messages)
        ):
            raise EngineError("messages must be a non-empty list of objects.", param="messages")
        tools = body.get("tools")
        prompt = self.engine.chat_prompt(messages, tools if isinstance(tools, list) else None)
        self._answer(body, prompt, chat=True)

    def _completion(self, body: dict[str, Any]) -> None:
        prompt = body.get("prompt")
        if not isinstance(prompt, str) or not prompt:
            raise EngineError("prompt must be a non-empty string.", param="prompt")
        self._answer(body, self.engine.text_prompt(prompt), chat=False)

    def _answer(self, body: dict[str, Any], prompt: list[int], *, chat: bool) -> None:
        model = body.get("model")
        if not isinstance(model, str):
            raise EngineError("model must be a string.", param="model")
        sampling = parse_sampling(body)
        answer = _Answer(model, chat)
        if not body.get("stream"):
            generation = self.engine.generate(model, prompt, sampling)
            self._send(200, answer.whole(generation))
            return
        options = body.get("stream_options") or {}
        include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
        # An unknown model is a 404 before the stream begins, as vLLM answers: after its 200
        # there would be no way to say so, and a relay would see a server that broke off.
        self.engine.check_model(model)
        stream = _EventStream(self)
        stream.start()
        stream.send(answer.chunk(role=True))
        generation = self.engine.generate(
            model, prompt, sampling, on_text=lambda piece: stream.send(answer.chunk(piece))
        )
        stream.send(answer.chunk(finish=generation.finish_reason))
        if include_usage:
            stream.send({**answer.chunk(usage_only=True), "usage": _usage(generation)})
        stream.done()


class _Answer:
    """One request's response objects, in OpenAI's chat or text completion shape."""

    def __init__(self, model: str, chat: bool) -> None:
        self.model, self.chat = model, chat
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())

    def _base(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def whole(self, generation: Generation) -> dict[str, Any]:
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": generation.text},
                      "logprobs": None, "finish_reason": generation.finish_reason}  # fmt: skip
            return {
                **self._base("chat.completion"),
                "choices": [choice],
                "usage": _usage(generation),
            }
        choice = {"index": 0, "text": generation.text, "logprobs": None,
                  "finish_reason": generation.finish_reason}  # fmt: skip
        return {**self._base("text_completion"), "choices": [choice], "usage": _usage(generation)}

    def chunk(
        self, text: str = "", *, role: bool = False, finish: str | None = None,
        usage_only: bool = False,
    ) -> dict[str, Any]:  # fmt: skip
        if usage_only:
            return {**self._base("chat.completion.chunk" if self.chat else "text_completion"),
                    "choices": []}  # fmt: skip
        if not self.chat:
            return {**self._base("text_completion"),
                    "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}]}  # fmt: skip
        delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else {}
        if text:
            delta["content"] = text
        return {**self._base("chat.completion.chunk"),
                "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}  # fmt: skip


class _EventStream:
    """Server-sent events over a chunked HTTP/1.1 response (``data: <json>``, then ``[DONE]``)."""

    def __init__(self, handler: BaseHTTPRequestHandler) -> None:
        self.handler = handler

    def start(self) -> None:
        self.handler.send_response(HTTPStatus.OK)
        self.handler.send_header("Content-Type", "text/event-stream")
        self.handler.send_header("Cache-Control", "no-cache")
        self.handler.send_header("Transfer-Encoding", "chunked")
        self.handler.end_headers()

    def _write(self, data: bytes) -> None:
        self.handler.wfile.write(f"{len(data):X}\r\n".encode() + data + b"\r\n")
        self.handler.wfile.flush()

    def send(self, event: dict[str, Any]) -> None:
        self._write(f"data: {json.dumps(event)}\n\n".encode())

    def done(self) -> None:
        self._write(b"data: [DONE]\n\n")
        self.handler.wfile.write(b"0\r\n\r\n")
        self.handler.wfile.flush()


class ServingHTTPServer(ThreadingHTTPServer):
    """A thread per connection. A relay opens its connections in bursts (64 streams at once):
    the standard library's listen backlog of 5 would drop most of them into a 1 s retry."""

    daemon_threads = True
    request_queue_size = 128


def make_server(
    engine: Engine, host: str, port: int, api_key: str | None, adapter_cache: Path
) -> ThreadingHTTPServer:
    bound = {"engine": engine, "api_key": api_key or None, "adapter_cache": adapter_cache}
    return ServingHTTPServer((host, port), type("BoundHandler", (Handler,), bound))
