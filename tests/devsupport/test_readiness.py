"""devsupport.readiness: a server slow to answer its first request is waited for, not fatal."""

from __future__ import annotations

import http.server
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from devsupport.processes import free_port
from devsupport.readiness import NotReady, wait_http_ready

Behaviour = Callable[[int], tuple[float, int]]  # request number -> (seconds to stall, status)


@pytest.fixture
def server() -> Iterator[Callable[[Behaviour], tuple[str, list[int]]]]:
    """``server(behaviour)``: a loopback HTTP server answering per ``behaviour``; returns its
    URL and the list of request numbers it has seen."""
    servers: list[http.server.ThreadingHTTPServer] = []

    def start(behaviour: Behaviour) -> tuple[str, list[int]]:
        seen: list[int] = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                seen.append(len(seen))
                stall, status = behaviour(seen[-1])
                time.sleep(stall)
                self.send_response(status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: object) -> None:
                pass

        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        srv.daemon_threads = True
        servers.append(srv)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{srv.server_address[1]}/ready", seen

    yield start
    for srv in servers:
        srv.shutdown()
        srv.server_close()


def test_a_first_answer_slower_than_the_request_timeout_is_retried(server) -> None:
    url, seen = server(lambda n: (1.5 if n == 0 else 0.0, 200))
    resp = wait_http_ready(url, timeout=20, request_timeout=0.5, interval=0.05)
    assert resp.status_code == 200
    assert len(seen) >= 2, "the first request timed out and a later one answered"


def test_answers_other_than_200_are_retried(server) -> None:
    url, seen = server(lambda n: (0.0, 503 if n < 2 else 200))
    assert wait_http_ready(url, timeout=20, interval=0.05).status_code == 200
    assert len(seen) == 3


def test_after_the_deadline_it_says_what_it_waited_for(server, tmp_path: Path) -> None:
    url, _ = server(lambda n: (0.0, 502))
    log = tmp_path / "server.log"
    log.write_text("booting...\n")
    with pytest.raises(NotReady) as caught:
        wait_http_ready(url, timeout=1, interval=0.05, log=log)
    message = str(caught.value)
    assert url in message and "within 1 s" in message
    assert "last error: HTTP 502" in message
    assert str(log) in message and "booting..." in message


def test_a_refused_connection_is_named_as_the_last_error() -> None:
    url = f"http://127.0.0.1:{free_port()}/"
    with pytest.raises(NotReady, match="last error: ConnectionError"):
        wait_http_ready(url, timeout=0.5, interval=0.05)


def test_a_server_process_that_exits_ends_the_wait_at_once() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    proc.wait()
    started = time.monotonic()
    with pytest.raises(NotReady, match="its process exited with 3"):
        wait_http_ready(f"http://127.0.0.1:{free_port()}/", timeout=30, proc=proc)
    assert time.monotonic() - started < 5
