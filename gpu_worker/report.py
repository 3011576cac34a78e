"""Progress reporting from the executor to the control plane (no Django here).

One :class:`Reporter` per attempt numbers every event it creates (``seq`` 0, 1, 2, ...) and
delivers them to one or more sinks, chosen by the spec's ``report`` block
(gpu_worker.report_settings):

* ``http``: POSTs to the attempt's events URL with its report token (GPU nodes). Both come from
  the executor's environment, never from the spec: the spec is written into provider job
  inputs and logs.
* ``jsonl``: one JSON line per event appended to a file, which the control plane tails over SSH.
* ``runpod``: ``runpod.serverless.progress_update`` with a rolling window of the latest events
  (RunPod keeps only the latest progress output).

Delivery is at-least-once: an event stays in a sink's backlog until that sink's ``send``
returned, so a failed batch is re-sent (identical, the ``seq`` is fixed at creation) and the
control plane drops duplicates keyed on ``(attempt, seq)``. Each sink has its own backlog, so a
dead broker does not hold back the JSON-lines file.

Event shape (what ``jobs.services.core.events.clean_executor_event`` accepts)::

    {"seq": 7, "type": "metrics", "level": "info", "message": "step 7/100 loss=1.234",
     "data": {"step": 7, "total_steps": 100, "loss": 1.234}, "ts": 1767225600.123}

When events are sent: status, error, checkpoint and artifact events at once; otherwise when 50
events have accumulated, every ``flush_interval`` seconds and every heartbeat (background
thread, started by :meth:`Reporter.start`), and on :meth:`Reporter.flush` / :meth:`Reporter.close`.
Metrics are throttled to one event per ``metrics_interval``: values reported in between are
merged (latest wins) and sent with the next metrics event or flush.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any

from gpu_worker.delivery import Channel
from gpu_worker.events import MAX_MESSAGE_CHARS, jsonable, metrics_message
from gpu_worker.events import level as event_level
from gpu_worker.report_settings import report_settings
from gpu_worker.sinks import HttpSink, JsonlSink, MemorySink, RunpodSink, Sink
from trainhub_contract.outcomes import Outcome

if TYPE_CHECKING:
    from trainhub_contract.spec import JobSpec

__all__ = ["HttpSink", "JsonlSink", "MemorySink", "Reporter", "RunpodSink", "Sink"]
log = logging.getLogger(__name__)

BATCH_SIZE = 50  # pending events that trigger a send
_IMMEDIATE_TYPES = frozenset({"status", "error", "checkpoint", "artifact"})


# --- reporter -------------------------------------------------------------------------------


class Reporter:
    """Numbers, batches and delivers one attempt's events to its sinks (thread-safe).

    Use as a context manager (or call :meth:`start` / :meth:`close`): ``start`` runs the
    heartbeat thread, which emits a ``heartbeat`` event every ``heartbeat_interval`` seconds
    (the control plane renews the attempt's lease on every batch) and sends pending events
    every ``flush_interval`` seconds. ``close`` stops it and makes a final delivery, retrying
    failed sinks for at most ``close_timeout`` seconds so a dead sink cannot hang the exit.
    ``clock`` drives metrics throttling and send backoff (tests pass a fake one).
    """

    def __init__(
        self,
        *,
        job_id: str,
        attempt: int,
        sinks: list[Sink],
        metrics_interval: float = 1.0,
        heartbeat_interval: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        flush_interval: float = 5.0,
        close_timeout: float = 5.0,
    ) -> None:
        if not sinks:
            raise ValueError("a Reporter needs at least one sink")
        if heartbeat_interval <= 0 or flush_interval <= 0 or metrics_interval < 0:
            raise ValueError("heartbeat/flush intervals must be > 0 and metrics_interval >= 0")
        self.job_id = job_id
        self.attempt = attempt
        self.sinks = list(sinks)
        self.metrics_interval = metrics_interval
        self.heartbeat_interval = heartbeat_interval
        self.flush_interval = flush_interval
        self.close_timeout = close_timeout
        self._clock = clock
        self._channels = [Channel(s) for s in self.sinks]
        self._lock = threading.Lock()  # seq, buffer, pending metrics
        self._flush_lock = threading.Lock()  # one delivery at a time, so sinks see seq order
        self._seq = 0
        self._buffer: list[dict[str, Any]] = []
        self._pending_metrics: dict[str, Any] | None = None
        self._last_metrics_at: float | None = None
        self._flush_requested = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._drains: list[Callable[[], None]] = []

    # --- construction from the spec ---------------------------------------------------------

    @classmethod
    def from_spec(cls, spec: JobSpec, *, runpod_job: Mapping[str, Any] | None = None) -> Reporter:
        """The reporter the spec's ``report`` block asks for (gpu_worker.report_settings); with
        ``runpod_job`` (the RunPod handler's job) a RunPod sink is always included. Raises
        ValueError for an unknown sink type or a malformed value."""
        settings = report_settings(spec.report, runpod_job=runpod_job)
        return cls(
            job_id=spec.job_id,
            attempt=spec.attempt,
            sinks=settings.sinks,
            heartbeat_interval=settings.heartbeat_interval,
            flush_interval=settings.flush_interval,
            metrics_interval=settings.metrics_interval,
        )

    # --- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        """Start the heartbeat/flush thread (idempotent)."""
        if self._thread is None and not self._closed:
            self._thread = threading.Thread(
                target=self._background, name=f"reporter-{self.job_id}-{self.attempt}", daemon=True
            )
            self._thread.start()

    def close(self) -> None:
        """Stop the background thread and deliver everything still pending (bounded time)."""
        self._closed = True
        self._stop.set()
        deadline = time.monotonic() + self.close_timeout
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=max(0.0, deadline - time.monotonic()))
        done = threading.Event()

        def final() -> None:
            try:
                while True:
                    self._deliver(wait=True, force=True)
                    if self._all_delivered() or time.monotonic() >= deadline:
                        return
                    time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
            except Exception:  # never let reporting break the caller's shutdown
                log.exception("final event delivery failed")
            finally:
                done.set()

        # A sink that hangs (not just raises) must not hang the exit: deliver from a daemon
        # thread and stop waiting at the deadline.
        threading.Thread(target=final, name="reporter-close", daemon=True).start()
        done.wait(timeout=max(0.0, deadline - time.monotonic()) + 0.5)
        if not self._all_delivered():
            lost = {repr(c.sink): len(c.backlog) for c in self._channels if c.backlog}
            log.warning(
                "gave up delivering events after %.1f s; undelivered per sink: %s",
                self.close_timeout,
                lost,
            )
        for channel in self._channels:
            closer = getattr(channel.sink, "close", None)
            if callable(closer):
                try:
                    closer()
                except Exception:
                    log.warning("closing %r failed", channel.sink, exc_info=True)

    def __enter__(self) -> Reporter:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # --- events -----------------------------------------------------------------------------

    def status(self, status: Outcome, message: str = "", **data: Any) -> None:
        """A status report (running, succeeded with ``sha256``, failed with ``code``,
        cancelled); sent at once. The wire carries the plain string value."""
        self._run_drains()
        self._emit("status", message, {"status": Outcome(status).value, **data}, "info")

    def error(self, code: str, message: str, **data: Any) -> None:
        """A failure with its typed reason (an EndReason value such as ``oom``); sent at once."""
        self._run_drains()
        self._emit("error", message, {"code": code, **data}, "error")

    def add_drain(self, drain: Callable[[], None]) -> None:
        """Run ``drain`` before every status or error event, so events another thread still
        holds (captured log lines, gpu_worker.logcapture) come before the outcome they led to."""
        self._drains.append(drain)

    def remove_drain(self, drain: Callable[[], None]) -> None:
        if drain in self._drains:
            self._drains.remove(drain)

    def log(self, message: str, level: str = "info", **data: Any) -> None:
        self._emit("log", message, data, event_level(level))

    def metrics(self, **values: Any) -> None:
        """Training metrics (step, total_steps, epoch, loss, lr, tokens_per_second, grad_norm,
        ...). At most one event per ``metrics_interval``; values in between are merged."""
        now = self._clock()
        with self._lock:
            if self._pending_metrics is None:
                self._pending_metrics = dict(values)
            else:
                self._pending_metrics.update(values)
            if (
                self._last_metrics_at is not None
                and now - self._last_metrics_at < self.metrics_interval
            ):
                return
            self._take_metrics_locked(now)
            full = len(self._buffer) >= BATCH_SIZE
        if full:
            self._deliver(wait=False, force=False)

    def checkpoint(self, step: int, **data: Any) -> None:
        self._emit(
            "checkpoint", f"Checkpoint saved at step {step}.", {"step": step, **data}, "info"
        )

    def artifact(self, manifest: dict[str, Any], sha256: str, size: int) -> None:
        self._emit(
            "artifact",
            f"Adapter bundle uploaded ({size} bytes, sha256 {sha256}).",
            {"manifest": manifest, "sha256": sha256, "size": size},
            "info",
        )

    def heartbeat(self) -> None:
        """Emit a heartbeat and send everything pending (the background thread calls this)."""
        self._emit("heartbeat", "", {}, "debug", send=False)
        self._deliver(wait=True, force=True)

    def flush(self) -> None:
        """Deliver every unconfirmed event (pending metrics included) to every sink now; a sink
        that raises keeps its backlog for the next flush. Never raises for a sink failure."""
        self._deliver(wait=True, force=True)

    @property
    def next_seq(self) -> int:
        return self._seq

    # --- internals --------------------------------------------------------------------------

    def _run_drains(self) -> None:
        for drain in list(self._drains):
            try:
                drain()
            except Exception:  # a status report must go out whatever a drain does
                log.exception("draining %r before a status event failed", drain)

    def _emit(
        self,
        type_: str,
        message: str,
        data: Mapping[str, Any],
        level: str,
        *,
        send: bool | None = None,
    ) -> None:
        event = {
            "type": type_,
            "level": level,
            "message": str(message)[:MAX_MESSAGE_CHARS],
            "data": jsonable(data),
            "ts": time.time(),
        }
        with self._lock:
            if type_ in _IMMEDIATE_TYPES:
                # The newest metrics go before the checkpoint or outcome they led to, in the
                # same batch: a batch after an attempt's final status is dropped upstream.
                self._take_metrics_locked(self._clock())
            self._append_locked(event)
            full = len(self._buffer) >= BATCH_SIZE
        if send is None:
            send = full or type_ in _IMMEDIATE_TYPES or self._closed
        if send:
            # An immediate event goes out before the caller continues (a caller about to exit
            # relies on it), unless another thread is delivering right now: that thread sends
            # it (see _deliver) and the training thread does not wait on a slow sink.
            self._deliver(wait=False, force=type_ in _IMMEDIATE_TYPES)

    def _append_locked(self, event: dict[str, Any]) -> None:
        self._buffer.append({"seq": self._seq, **event})
        self._seq += 1

    def _take_metrics_locked(self, now: float) -> None:
        values = self._pending_metrics
        if not values:
            return
        self._pending_metrics = None
        self._last_metrics_at = now
        data = jsonable(values)
        self._append_locked(
            {
                "type": "metrics",
                "level": "info",
                "message": metrics_message(data)[:MAX_MESSAGE_CHARS],
                "data": data,
                "ts": time.time(),
            }
        )

    def _deliver(self, *, wait: bool, force: bool) -> None:
        with self._lock:
            self._flush_requested = True
        while True:
            if not self._flush_lock.acquire(blocking=wait):
                return  # the thread holding it re-checks _flush_requested before leaving
            try:
                self._deliver_locked(force)
            finally:
                self._flush_lock.release()
            with self._lock:
                if not self._flush_requested:
                    return
            wait = False  # events arrived meanwhile; go again unless someone else already is

    def _deliver_locked(self, force: bool) -> None:
        with self._lock:
            self._flush_requested = False
            now = self._clock()
            # Batch-size and periodic sends keep the metrics throttle; flush()/heartbeat/close
            # and immediate events (a final status wants the latest metrics before it) do not.
            last = self._last_metrics_at
            if force or last is None or now - last >= self.metrics_interval:
                self._take_metrics_locked(now)
            batch, self._buffer = self._buffer, []
        for channel in self._channels:
            channel.backlog.extend(batch)
        now = self._clock()
        for channel in self._channels:
            if channel.backlog and (force or now >= channel.retry_at):
                channel.send_backlog(self.job_id, self.attempt, self._clock)

    def _all_delivered(self) -> bool:
        with self._lock:
            if self._buffer or self._pending_metrics:
                return False
        return all(not c.backlog for c in self._channels)

    def _background(self) -> None:
        next_beat = time.monotonic() + self.heartbeat_interval
        next_flush = time.monotonic() + self.flush_interval
        while True:
            timeout = max(0.0, min(next_beat, next_flush) - time.monotonic())
            if self._stop.wait(timeout):
                return
            now = time.monotonic()
            try:
                if now >= next_beat:
                    self.heartbeat()
                    next_beat = now + self.heartbeat_interval
                    next_flush = now + self.flush_interval
                elif now >= next_flush:
                    with self._lock:
                        idle = not self._buffer and not self._pending_metrics
                    if not idle or any(c.backlog for c in self._channels):
                        self._deliver(wait=True, force=False)
                    next_flush = now + self.flush_interval
            except Exception:  # the thread must survive anything a sink does
                log.exception("reporter background delivery failed")
