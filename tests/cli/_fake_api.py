"""A scripted stand-in for trainhub's web server on loopback, for the CLI's cases that a real
server cannot easily be made to answer (a tampered bundle, a job that failed, a 401)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit


@dataclass
class Reply:
    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)

    @classmethod
    def json(cls, obj: Any, status: int = 200) -> Reply:
        return cls(status, json.dumps(obj).encode(), {"Content-Type": "application/json"})


@dataclass
class FakeApi:
    url: str
    # A list is answered in order, its last reply from then on.
    routes: dict[tuple[str, str], Reply | list[Reply]] = field(default_factory=dict)
    seen: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)

    def on(self, method: str, path: str, reply: Reply | list[Reply]) -> None:
        self.routes[(method, path.rstrip("/"))] = reply

    def reply(self, method: str, path: str) -> Reply | None:
        found = self.routes.get((method, path))
        if isinstance(found, list):
            return found.pop(0) if len(found) > 1 else found[0]
        return found


def _handler(api: FakeApi) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            path = urlsplit(self.path).path.rstrip("/")
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(length)
            api.seen.append((self.command, self.path, dict(self.headers)))
            reply = api.reply(self.command, path) or Reply.json(
                {"error": {"message": "Not found.", "type": "not_found_error", "param": None,
                           "code": "not_found"}}, 404)  # fmt: skip
            self.send_response(reply.status)
            for name, value in reply.headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(reply.body)))
            self.end_headers()
            self.wfile.write(reply.body)

        do_GET = do_POST = do_DELETE = _serve

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


@contextmanager
def fake_api() -> Iterator[FakeApi]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(FakeApi("")))
    api = FakeApi(f"http://127.0.0.1:{server.server_address[1]}")
    server.RequestHandlerClass = _handler(api)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield api
    finally:
        server.shutdown()
        server.server_close()
