"""A fake EC2 instance metadata service (IMDSv2, tokens required) on loopback.

One server can stand in for several machines: a request path ``/<machine>/latest/...`` is
machine ``<machine>``'s service, a plain ``/latest/...`` the default machine's (``""``). What
each says is set per machine: ``notices[machine]`` for ``spot/instance-action``,
``rebalances[machine]`` for ``events/recommendations/rebalance``; 404 until set, as on EC2.

A token comes from ``PUT /latest/api/token`` with a TTL header of 1..21600 seconds; a read
without a token the service issued is answered 401.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from gpu_worker.preemption import (
    INSTANCE_ACTION_PATH,
    REBALANCE_PATH,
    TOKEN_HEADER,
    TOKEN_PATH,
    TOKEN_TTL_HEADER,
)


@dataclass
class FakeImds:
    url: str = ""
    notices: dict[str, dict[str, Any]] = field(default_factory=dict)
    rebalances: dict[str, dict[str, Any]] = field(default_factory=dict)
    tokens: set[str] = field(default_factory=set)
    # (method, path without the machine prefix, lower-cased headers, machine)
    requests: list[tuple[str, str, dict[str, str], str]] = field(default_factory=list)
    notice_served: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    # The default machine's signals, for tests with one machine.
    @property
    def notice(self) -> dict[str, Any] | None:
        return self.notices.get("")

    @notice.setter
    def notice(self, value: dict[str, Any] | None) -> None:
        self._set(self.notices, "", value)

    @property
    def rebalance(self) -> dict[str, Any] | None:
        return self.rebalances.get("")

    @rebalance.setter
    def rebalance(self, value: dict[str, Any] | None) -> None:
        self._set(self.rebalances, "", value)

    def _set(self, table: dict[str, dict[str, Any]], machine: str, value: Any) -> None:
        with self.lock:
            if value is None:
                table.pop(machine, None)
            else:
                table[machine] = value

    def interrupt(self, machine: str, notice: dict[str, Any]) -> None:
        """Put machine ``machine``'s spot interruption notice up."""
        self._set(self.notices, machine, notice)

    def url_for(self, machine: str) -> str:
        return f"{self.url}/{machine}"

    def answer(self, method: str, raw_path: str, headers: dict[str, str]) -> tuple[int, bytes]:
        machine, path = "", raw_path
        if not raw_path.startswith("/latest/"):
            machine, _, rest = raw_path.lstrip("/").partition("/")
            path = "/" + rest
        with self.lock:
            self.requests.append((method, path, headers, machine))
            if path == TOKEN_PATH:
                ttl = headers.get(TOKEN_TTL_HEADER.lower(), "")
                if method != "PUT":
                    return 405, b""
                if not ttl.isdigit() or not 1 <= int(ttl) <= 21600:
                    return 400, b""
                token = f"token-{len(self.tokens)}"
                self.tokens.add(token)
                return 200, token.encode()
            if method != "GET":
                return 405, b""
            if headers.get(TOKEN_HEADER.lower()) not in self.tokens:
                return 401, b""
            if path == INSTANCE_ACTION_PATH and machine in self.notices:
                self.notice_served.set()
                return 200, json.dumps(self.notices[machine]).encode()
            if path == REBALANCE_PATH and machine in self.rebalances:
                return 200, json.dumps(self.rebalances[machine]).encode()
            return 404, b""

    def of(self, path: str, machine: str | None = None) -> list[tuple[str, str, dict[str, str]]]:
        """The requests for ``path`` (of one machine, or of any)."""
        with self.lock:
            return [r[:3] for r in self.requests if r[1] == path and machine in (None, r[3])]


@contextmanager
def serve_imds(port: int = 0) -> Iterator[FakeImds]:
    fake = FakeImds()

    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            headers = {k.lower(): v for k, v in self.headers.items()}
            status, body = fake.answer(self.command, self.path, headers)
            self.send_response(status)
            if self.path.endswith(TOKEN_PATH) and status == 200:
                self.send_header(TOKEN_TTL_HEADER, headers[TOKEN_TTL_HEADER.lower()])
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_PUT = do_POST = _serve

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    fake.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield fake
    finally:
        server.shutdown()
        server.server_close()
