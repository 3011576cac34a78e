"""A real webhook receiver on loopback (http.server on a thread), shared by the webhook tests:
it verifies every request with the ``standardwebhooks`` package (the reference verifier, which
nobody here wrote) and answers as a test scripts it: a status, a redirect, a long body, a stall.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError

from trainhub_contract import celery_conf as cc


@dataclass
class Received:
    path: str
    headers: dict[str, str]  # lower-case names
    body: bytes
    verified_with: list[str]  # the secrets (of Receiver.secrets) whose signature verified

    @property
    def payload(self) -> dict[str, Any]:
        return json.loads(self.body)

    @property
    def webhook_id(self) -> str:
        return self.headers["webhook-id"]


@dataclass
class Receiver:
    """Answers ``statuses`` in turn (then ``default_status``); 400 to a request no secret of
    ``secrets`` verifies (a receiver must refuse those)."""

    port: int = 0
    secrets: list[str] = field(default_factory=list)
    statuses: list[int] = field(default_factory=list)
    default_status: int = 204
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    stall_seconds: float = 0.0
    received: list[Received] = field(default_factory=list)
    server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hooks/trainhub"

    def verified(self) -> list[Received]:
        return [r for r in self.received if r.verified_with]

    def start(self) -> Receiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                headers = {k.lower(): v for k, v in self.headers.items()}
                ok = []
                for secret in receiver.secrets:
                    with contextlib.suppress(WebhookVerificationError):
                        Webhook(secret).verify(body, headers)
                        ok.append(secret)
                receiver.received.append(Received(self.path, headers, body, ok))
                if receiver.stall_seconds:
                    time.sleep(receiver.stall_seconds)
                status = receiver.statuses.pop(0) if receiver.statuses else receiver.default_status
                if not ok:
                    status = 400
                self.send_response(status)
                for name, value in receiver.headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(receiver.body)))
                self.end_headers()
                with contextlib.suppress(OSError):
                    self.wfile.write(receiver.body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        """Down: the port is closed (connections refused) until start() again."""
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None


@contextlib.contextmanager
def receiving(**options: Any) -> Iterator[Receiver]:
    receiver = Receiver(**options).start()
    try:
        yield receiver
    finally:
        receiver.stop()


def delivery_messages(sent: Any) -> list[int]:
    """The delivery pks of every deliver_webhook message sent (and forget them)."""
    pks = [args[0] for args in sent.named(cc.DELIVER_WEBHOOK)]
    sent.clear()
    return pks
