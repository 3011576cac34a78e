"""Every message any process writes to the broker, as Redis itself sees it (MONITOR), scanned
for secrets: the rule "broker messages carry ids, never secrets" checked on live traffic of the
e2e suites, whichever process sent the message (the web side, the control worker, a node)."""

from __future__ import annotations

import base64
import binascii
import re
import threading
from urllib.parse import urlsplit

import redis

# Node tokens, API keys, signed transfer URLs (local and S3), report tokens, and the keys a
# spec used to travel under. Celery's headers repeat the arguments in plain text (argsrepr),
# and the body is base64: both are scanned.
SECRET = re.compile(
    r"thn-[A-Za-z0-9_-]{16,}|\bth-[A-Za-z0-9_-]{16,}|/transfer/\?t=|X-Amz-(?:Signature|Credential)"
    r"|report_token|claim_url|[\"']spec[\"']"
)
_WRITES = ("LPUSH", "RPUSH", "PUBLISH", "HSET", "SET", "ZADD", "SADD")
_BODY = re.compile(r'body\\": \\"([A-Za-z0-9+/=]+)')


class BrokerWatch:
    """``start()``, run the test, ``stop()``; then ``writes`` and ``leaks()``."""

    def __init__(self, broker_url: str) -> None:
        self._url = broker_url
        self._db = int(urlsplit(broker_url).path.strip("/") or 0)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.writes: list[str] = []

    def start(self) -> None:
        ready = threading.Event()
        self._thread = threading.Thread(target=self._watch, args=(ready,), daemon=True)
        self._thread.start()
        ready.wait(5)

    def _watch(self, ready: threading.Event) -> None:
        with redis.Redis.from_url(self._url).monitor() as monitor:
            ready.set()
            for command in monitor.listen():
                if self._stop.is_set():
                    return
                text = command["command"]
                if command["db"] == self._db and text.split(" ", 1)[0].upper() in _WRITES:
                    self.writes.append(text)

    def stop(self) -> None:
        self._stop.set()
        redis.Redis.from_url(self._url).ping()  # wakes the monitor so it sees the flag
        if self._thread is not None:
            self._thread.join(10)

    def leaks(self) -> list[str]:
        found = []
        for text in self.writes:
            decoded = [text]
            for chunk in _BODY.findall(text):
                try:
                    decoded.append(base64.b64decode(chunk).decode("utf-8", "replace"))
                except (binascii.Error, ValueError):
                    continue
            for part in decoded:
                match = SECRET.search(part)
                if match:
                    found.append(f"{match.group(0)!r} in {part[:300]}")
        return found
