"""A stand-in for the control plane on a real loopback socket, for the node's side alone (no
Django): it records every request and answers what the test scripted. That the real endpoints
answer the same way is checked in tests/jobs/services/fleet/test_node_client.py (both sides over real HTTP)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

Answer = tuple[int, Any]  # (status, JSON body)


@dataclass
class Request:
    path: str
    headers: dict[str, str]
    body: Any  # the parsed JSON (None if there was none)


@dataclass
class ControlPlane:
    url: str
    requests: list[Request] = field(default_factory=list)
    # path -> answers, used in turn (the last one repeats); unknown paths answer 404.
    answers: dict[str, list[Answer | Callable[[Request], Answer]]] = field(default_factory=dict)

    def answer(self, path: str, *answers: Answer | Callable[[Request], Answer]) -> None:
        self.answers[path] = list(answers)

    def to(self, path: str) -> list[Request]:
        return [r for r in self.requests if r.path == path]

    def _reply(self, request: Request) -> Answer:
        queue = self.answers.get(request.path)
        if not queue:
            return 404, {"error": {"message": "no such path"}}
        scripted = queue.pop(0) if len(queue) > 1 else queue[0]
        return scripted(request) if callable(scripted) else scripted


@pytest.fixture(name="control")
def control_fixture() -> Iterator[ControlPlane]:
    """The stand-in control plane, serving until the test ends (import this into a module)."""
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            request = Request(self.path, dict(self.headers), json.loads(raw) if raw else None)
            with lock:
                plane.requests.append(request)
                status, body = plane._reply(request)
            payload = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: object) -> None:  # keep pytest's output clean
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    plane = ControlPlane(f"http://127.0.0.1:{server.server_address[1]}")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield plane
    server.shutdown()
    server.server_close()
