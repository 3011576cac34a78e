"""Waiting for a freshly started HTTP server to answer, one way for every benchmark.

A server that is up may still be slow to answer its first request (gunicorn importing Django on
a busy machine), so every request error counts as "not yet", not only a refused connection.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import requests


class NotReady(RuntimeError):
    """A server did not answer in time, or its process exited first."""


def _is_200(resp: requests.Response) -> bool:
    return resp.status_code == 200


def wait_http_ready(
    url: str,
    *,
    timeout: float,
    session: requests.Session | None = None,
    ok: Callable[[requests.Response], bool] = _is_200,
    request_timeout: float = 5.0,
    proc: subprocess.Popen[Any] | None = None,
    check: Callable[[], object] | None = None,
    log: Path | None = None,
    interval: float = 0.2,
) -> requests.Response:
    """GET ``url`` until ``ok(response)`` (default: HTTP 200) and return that response.

    Any ``requests.RequestException`` (refused, reset, read timeout...) and any other answer is
    retried until ``timeout`` seconds have passed; then NotReady says what was waited for: the
    URL, the seconds, the last error or status, and ``log`` (the server's log file) with its
    tail. ``proc`` (the server's process) exiting ends the wait at once, as does ``check``
    raising (e.g. a sibling process that died).
    """
    http = session or requests.Session()
    start = time.monotonic()
    deadline = start + timeout
    last = "no request made"
    try:
        while True:
            if proc is not None and proc.poll() is not None:
                why = f"its process exited with {proc.returncode}"
                raise NotReady(_report(url, time.monotonic() - start, last, log, why))
            if check is not None:
                check()
            # Never let one request run past the deadline (but give it a moment to answer).
            budget = max(0.5, min(request_timeout, deadline - time.monotonic()))
            try:
                resp = http.get(url, timeout=budget)
            except requests.RequestException as exc:
                last = f"{type(exc).__name__}: {exc}"
            else:
                if ok(resp):
                    return resp
                last = f"HTTP {resp.status_code}: {resp.text[:200]!r}"
            if time.monotonic() + interval > deadline:
                raise NotReady(_report(url, timeout, last, log, "timed out"))
            time.sleep(interval)
    finally:
        if session is None:
            http.close()


def _report(url: str, waited: float, last: str, log: Path | None, why: str) -> str:
    where = ""
    if log is not None:
        tail = log.read_text(errors="replace")[-2000:] if log.exists() else "(no log yet)"
        where = f"; log {log}:\n{tail}"
    return f"{url} did not answer within {waited:.0f} s ({why}; last error: {last}){where}"
