"""Where executor events go: the sinks a :class:`gpu_worker.report.Reporter` delivers to."""

from __future__ import annotations

import collections
import json
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

RUNPOD_WINDOW = 200  # events carried by each RunPod progress update
HTTP_BATCH = 200  # events per POST of the http sink


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


class HttpSink:
    """POSTs each batch as ``{"events": [...]}`` to the attempt's events URL on the control
    plane, with the attempt's report token (``Authorization: Bearer …``).

    On a GPU node the supervisor passes both in ``TRAINHUB_REPORT_URL`` and
    ``TRAINHUB_REPORT_TOKEN``; the token speaks for this one attempt only, so the executor
    holds neither the node's token nor any broker credential. A failed POST raises; the
    reporter keeps the batch and re-sends it, which is the retry.
    """

    def __init__(
        self, url: str | None = None, token: str | None = None, *, timeout: float = 10.0
    ) -> None:
        self.url = url or os.environ.get("TRAINHUB_REPORT_URL", "")
        token = token or os.environ.get("TRAINHUB_REPORT_TOKEN", "")
        if not self.url or not token:
            raise ValueError(
                "the http report sink needs TRAINHUB_REPORT_URL and TRAINHUB_REPORT_TOKEN in the "
                "executor's environment (the node's supervisor sets them; never the job spec)"
            )
        import requests  # lazy: only node executors report over HTTP

        self._session = requests.Session()
        self._session.headers["Authorization"] = f"Bearer {token}"
        self._timeout = timeout

    def send(self, job_id: str, attempt: int, events: list[dict[str, Any]]) -> None:
        # A backlog after an outage goes in parts the control plane stores whole (it keeps at
        # most jobs.services.core.events.MAX_EVENTS_PER_BATCH routine events from one request).
        for start in range(0, len(events), HTTP_BATCH):
            part = events[start : start + HTTP_BATCH]
            resp = self._session.post(self.url, json={"events": part}, timeout=self._timeout)
            resp.raise_for_status()

    def close(self) -> None:
        self._session.close()

    def __repr__(self) -> str:  # never the token
        return f"HttpSink({self.url!r})"


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
