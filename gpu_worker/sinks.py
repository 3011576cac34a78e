"""Where executor events go: the sinks a :class:`gpu_worker.report.Reporter` delivers to."""

from __future__ import annotations

import collections
import json
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from gpu_worker import celery_conf

RUNPOD_WINDOW = 200  # events carried by each RunPod progress update


class Sink(Protocol):
    """Where events go. ``send`` delivers a batch or raises; a batch that raised is re-sent
    (possibly merged with later events) on the next flush, so sending twice must be harmless."""

    def send(self, job_id: str, attempt: int, events: list[dict[str, Any]]) -> None: ...


class MemorySink:
    """Keeps every delivered event in ``events`` (tests, debugging)."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.calls: list[tuple[str, int, list[dict[str, Any]]]] = []

    def send(self, job_id: str, attempt: int, events: list[dict[str, Any]]) -> None:
        self.calls.append((job_id, attempt, list(events)))
        self.events.extend(events)


class JsonlSink:
    """Appends one JSON object per line: ``{"job_id", "attempt", **event}``.

    The control plane tails the file over SSH; ``job_id``/``attempt`` make every line
    self-describing when a later attempt appends to the same file. Each batch is fsynced so a
    line the reader saw survives a crash. A torn last line (crash mid-write) is terminated
    before the next batch, so it cannot swallow the next event; readers skip unparsable lines.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def send(self, job_id: str, attempt: int, events: list[dict[str, Any]]) -> None:
        lines = "".join(
            json.dumps({"job_id": job_id, "attempt": attempt, **e}, separators=(",", ":")) + "\n"
            for e in events
        ).encode()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                lines = b"\n" + lines
            view = memoryview(lines)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)

    def __repr__(self) -> str:
        return f"JsonlSink({str(self.path)!r})"


class CelerySink:
    """Sends ``trainhub.record_events(job_id, attempt, events)`` to the control plane's queue.

    On a GPU node the supervisor passes the node's identity in ``TRAINHUB_NODE_NAME`` and
    ``TRAINHUB_NODE_TOKEN``; they ride along as ``node``/``token`` keyword arguments, and the
    control plane drops events of a node attempt that do not carry that node's current token.

    Publishing is not retried by Celery/kombu (a dead broker raises within about
    ``connect_timeout``); the reporter keeps the batch and re-sends it, which is the retry.
    """

    def __init__(
        self,
        broker_url: str | None = None,
        *,
        queue: str = celery_conf.DEFAULT_QUEUE,
        connect_timeout: float = 3.0,
        node: str | None = None,
        token: str | None = None,
    ) -> None:
        url = broker_url or os.environ.get("CELERY_BROKER_URL", "")
        if not url:
            raise ValueError(
                "the celery report sink needs a broker: set CELERY_BROKER_URL in the executor's "
                "environment (it is never read from the job spec)"
            )
        self._broker_url = url
        self.queue = queue
        node = node or os.environ.get("TRAINHUB_NODE_NAME", "")
        token = token or os.environ.get("TRAINHUB_NODE_TOKEN", "")
        self._identity = {"node": node, "token": token} if node and token else {}
        self._connect_timeout = connect_timeout
        self._app: Any = None
        self._app_lock = threading.Lock()

    def _celery(self) -> Any:
        with self._app_lock:
            if self._app is None:
                from celery import Celery  # lazy: RunPod/SSH executors need not import Celery

                config = celery_conf.base_config(self._broker_url)
                transport = dict(config["broker_transport_options"])  # type: ignore[call-overload]
                # kombu's own reconnect loop (2 s, 4 s, ...) and redis-py's retries would hold
                # the training thread for seconds per attempt; the reporter re-sends instead.
                transport.update(
                    max_retries=0,
                    socket_connect_timeout=self._connect_timeout,
                    socket_timeout=max(self._connect_timeout, 10.0),
                )
                config.update(
                    # Celery lets the CELERY_BROKER_URL environment variable override broker_url;
                    # publishing reads broker_write_url first, so this URL is the one used.
                    broker_write_url=self._broker_url,
                    broker_transport_options=transport,
                    broker_connection_timeout=self._connect_timeout,
                    broker_connection_retry_on_startup=False,
                )
                app = Celery("trainhub-executor-report", set_as_current=False)
                app.conf.update(config)
                self._app = app
            return self._app

    def send(self, job_id: str, attempt: int, events: list[dict[str, Any]]) -> None:
        self._celery().send_task(
            celery_conf.RECORD_EVENTS,
            args=[job_id, attempt, events],
            kwargs=self._identity,
            queue=self.queue,
            retry=False,
            ignore_result=True,
        )

    def close(self) -> None:
        with self._app_lock:
            if self._app is not None:
                self._app.close()
                self._app = None

    def __repr__(self) -> str:  # never show the URL: it may hold a password
        return f"CelerySink(queue={self.queue!r})"


class RunpodSink:
    """``runpod.serverless.progress_update(job, {"attempt", "events"})`` with the latest
    ``window`` events: RunPod keeps only the latest progress output, so every update carries
    a rolling window and the control plane, polling ``/status``, dedupes by ``seq``.

    ``progress_update`` posts from a background thread and never raises, so this sink never
    reports a failure; the handler's final output carries the window again.
    """

    def __init__(self, job: Mapping[str, Any], *, window: int = RUNPOD_WINDOW) -> None:
        self.job = job
        self._window: collections.deque[dict[str, Any]] = collections.deque(maxlen=window)
        self._lock = threading.Lock()

    def send(self, job_id: str, attempt: int, events: list[dict[str, Any]]) -> None:
        import runpod.serverless  # lazy: heavy, and only present on RunPod workers

        with self._lock:
            self._window.extend(events)
            progress = {"attempt": attempt, "events": list(self._window)}
        runpod.serverless.progress_update(dict(self.job), progress)

    def window(self) -> list[dict[str, Any]]:
        """The latest events sent (oldest first)."""
        with self._lock:
            return list(self._window)
