"""trainhub's two doors for a completion, scripted on loopback as the real ones answer: the web
server's 307 to the stream process with a one-use grant (api/inference_views.py), and the
stream process's answers (api/live/inference.py): OpenAI's ``chat.completion.chunk`` events over
chunked HTTP/1.1 ending in ``data: [DONE]`` (a usage chunk with no choices when asked), whole
``chat.completion`` objects, OpenAI-shaped errors, and streams that stop short."""

from __future__ import annotations

import itertools
import json
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

COMPLETIONS = "/api/v1/chat/completions"


def error(message: str, code: str | None, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error", "param": param,
                      "code": code}}  # fmt: skip


@dataclass
class Stream:
    """A streamed answer: ``pieces`` as content chunks; ``cut`` drops the connection after that
    many pieces (an unfinished chunked body), ``no_done`` ends cleanly without [DONE]; ``gate``
    holds the pieces after the first until it is set; ``error`` comes as an event after them."""

    pieces: list[str]
    finish: str = "stop"
    usage: dict[str, int] | None = None
    cut: int | None = None
    no_done: bool = False
    gate: threading.Event | None = None
    error: dict[str, Any] | None = None


@dataclass
class Whole:
    body: dict[str, Any]
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)


def completion(text: str, usage: dict[str, int], finish: str = "stop") -> dict[str, Any]:
    return {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "tiny",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "logprobs": None, "finish_reason": finish}], "usage": usage}  # fmt: skip


@dataclass
class Seen:
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: Any


@dataclass
class FakeInference:
    web_url: str = ""
    stream_url: str = ""
    # The stream process's answers, in order (the last one from then on).
    answers: list[Stream | Whole] = field(default_factory=list)
    # What the web server answers instead of its 307 (in order; None: the 307).
    web_answers: list[Whole | None] = field(default_factory=list)
    models: list[str] = field(default_factory=list)
    web_seen: list[Seen] = field(default_factory=list)
    stream_seen: list[Seen] = field(default_factory=list)
    grants: set[str] = field(default_factory=set)
    _numbers: Iterator[int] = field(default_factory=itertools.count)

    def next_answer(self) -> Stream | Whole:
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]

    @property
    def asked(self) -> list[Any]:
        """The bodies the stream process got, in order."""
        return [s.body for s in self.stream_seen]


def _chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "tiny",
            "choices": [{"index": 0, "delta": delta, "logprobs": None,
                         "finish_reason": finish}]}  # fmt: skip


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # chunked bodies, as the stream process sends
    fake: FakeInference
    door: str  # "web" or "stream"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _json(self, status: int, obj: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(obj).encode()
        self.send_response(status)
        for name, value in {"Content-Type": "application/json", **(headers or {})}.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _seen(self) -> Seen:
        parts = urlsplit(self.path)
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = json.loads(raw) if raw else None
        return Seen(parts.path, parse_qs(parts.query), dict(self.headers), body)

    def do_GET(self) -> None:
        if self.door == "web" and urlsplit(self.path).path == "/api/v1/models":
            data = [{"id": m, "object": "model", "created": None, "owned_by": "trainhub"}
                    for m in self.fake.models]  # fmt: skip
            self._json(200, {"object": "list", "data": data})
            return
        self._json(404, error("Not found.", "not_found"))

    def do_POST(self) -> None:
        seen = self._seen()
        if seen.path != COMPLETIONS:
            self._json(404, error("Not found.", "not_found"))
            return
        if self.door == "web":
            self.fake.web_seen.append(seen)
            scripted = self.fake.web_answers.pop(0) if self.fake.web_answers else None
            if scripted is not None:
                self._json(scripted.status, scripted.body, scripted.headers)
                return
            grant = f"grant-{next(self.fake._numbers)}"
            self.fake.grants.add(grant)
            self.send_response(307)
            self.send_header("Location", f"{self.fake.stream_url}{COMPLETIONS}?grant={grant}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.fake.stream_seen.append(seen)
        grant = (seen.query.get("grant") or [""])[0]
        if grant not in self.fake.grants:  # forged, or used once already
            self._json(401, error("Invalid or missing API key (or an expired redirect grant).",
                                  "invalid_api_key"))  # fmt: skip
            return
        self.fake.grants.discard(grant)
        answer = self.fake.next_answer()
        if isinstance(answer, Whole):
            self._json(answer.status, answer.body, answer.headers)
        else:
            self._stream(answer, seen.body)

    def _write(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):X}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _event(self, obj: Any) -> None:
        self._write(f"data: {json.dumps(obj)}\n\n".encode())

    def _stream(self, answer: Stream, body: dict[str, Any]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self._event(_chunk({"role": "assistant", "content": ""}))
        for n, piece in enumerate(answer.pieces):
            if answer.cut is not None and n == answer.cut:
                self.close_connection = True  # the body never ends: an unfinished chunked read
                return
            if n == 1 and answer.gate is not None:
                answer.gate.wait(30)
            self._event(_chunk({"content": piece}))
        if answer.error is not None:
            self._event(answer.error)
        else:
            self._event(_chunk({}, answer.finish))
            wants = (body.get("stream_options") or {}).get("include_usage")
            if wants and answer.usage is not None:
                self._event({**_chunk({}), "choices": [], "usage": answer.usage})
        if not answer.no_done:
            self._write(b"data: [DONE]\n\n")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client gone (closed, reset, Ctrl-C) is what several tests do; the rest is a failure.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


def _serve(fake: FakeInference, door: str) -> ThreadingHTTPServer:
    handler = type(f"{door}Handler", (_Handler,), {"fake": fake, "door": door})
    server = _Server(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    return server


@contextmanager
def fake_inference() -> Iterator[FakeInference]:
    """The web server and the stream process, each on its own loopback port (another origin:
    the client drops its Authorization header on the 307, as clients do)."""
    fake = FakeInference()
    web, stream = _serve(fake, "web"), _serve(fake, "stream")
    fake.web_url = f"http://127.0.0.1:{web.server_address[1]}"
    fake.stream_url = f"http://127.0.0.1:{stream.server_address[1]}"
    try:
        yield fake
    finally:
        for server in (web, stream):
            server.shutdown()
            server.server_close()
