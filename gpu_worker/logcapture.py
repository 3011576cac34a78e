"""The executor's own output as ``log`` events: Python logging records and the text written to
stdout/stderr while training runs, rate-capped and with secrets masked.

    with reporter, LogCapture(reporter, redactor=Redactor(secret_values(spec))):
        train.run(spec, reporter=reporter, ...)

* **Text** (``fds=True``, the executor's own process; gpu_worker.fdtee): file descriptors 1
  and 2 are pointed at pipes for the duration, so prints, warnings, tqdm and native writes
  (C++ libraries, CUDA) are all seen, and every byte still reaches where the descriptor pointed
  before (the SSH executor's ``executor.log``, the node's console, RunPod's log). The text is
  cut into lines (gpu_worker.log_lines: ``\\r`` progress collapsed). Nothing printed after the
  capture (the CLI's JSON summary) goes through it.
* **Logging records** (transformers, peft, accelerate, datasets, unsloth, the executor's own
  loggers) keep their level (gpu_worker.log_routing): each is heard once, as a record, and
  console handlers write past the capture so it is not heard again as text.
* **Caps** (gpu_worker.log_lines.LogLimits): a token bucket, a per-attempt total, long lines
  cut; what is dropped is counted and said in a summary event.

Training never waits on the reporter: readers and the logging handler only queue lines; one
pump thread masks them (gpu_worker.redaction) and hands them to ``reporter.log``. Records
from the reporter's own threads and delivery are not captured (a failing sink would feed
itself).
"""

from __future__ import annotations

import collections
import contextlib
import logging
import re
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import IO, TYPE_CHECKING, Any

from gpu_worker.fdtee import STREAMS, FdTee
from gpu_worker.log_lines import (
    LevelGuess,
    LineAssembler,
    LogLimits,
    TokenBucket,
    truncate,
    truncate_middle,
)
from gpu_worker.log_routing import LogRouting
from gpu_worker.redaction import Redactor

if TYPE_CHECKING:
    from gpu_worker.report import Reporter

log = logging.getLogger(__name__)

# Records of these loggers and threads are about delivering events; capturing them would loop.
_OWN_LOGGERS = ("gpu_worker.report", "gpu_worker.delivery", "gpu_worker.logcapture")
_OWN_THREADS = ("reporter-", "logcapture-")
_TICK = 0.25  # the pump's pace: queued lines reach the reporter within this


def _level_of(levelno: int) -> str:
    if levelno >= logging.ERROR:
        return "error"
    if levelno >= logging.WARNING:
        return "warning"
    return "info" if levelno >= logging.INFO else "debug"


class _RecordHandler(logging.Handler):
    def __init__(self, capture: LogCapture) -> None:
        super().__init__(logging.INFO)
        self.capture = capture

    def handle(self, record: logging.LogRecord) -> bool:
        # One handler on several loggers: a record reaching it twice (a library turned its
        # propagation on) is taken once.
        if getattr(record, "_trainhub_captured", False):
            return False
        record._trainhub_captured = True
        return super().handle(record)

    def emit(self, record: logging.LogRecord) -> None:
        # Logging must never break the caller, nor print about it (it would be captured).
        with contextlib.suppress(Exception):
            self.capture.take_record(record)


class LogCapture:
    """Captures output into ``reporter.log`` events; a context manager (see the module doc).

    ``ignore``: lines (of text) matching it are copied through but never become events (the
    RunPod SDK's own log lines, which quote our events back). ``fds=False`` captures logging
    records only (plus what :meth:`write` is given: tests, callers without descriptors).
    """

    def __init__(
        self,
        reporter: Reporter,
        *,
        redactor: Redactor | None = None,
        limits: LogLimits | None = None,
        fds: bool = True,
        ignore: re.Pattern[str] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.reporter = reporter
        self.redact = redactor or Redactor()
        self.limits = limits or LogLimits()
        self.fds = fds
        self.ignore = ignore
        self._clock = clock
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._process_lock = threading.Lock()  # the pump or a drain: one sends at a time
        self._queue: collections.deque[tuple[str, str, dict[str, Any], int, bool]] = (
            collections.deque()
        )
        self._bucket = TokenBucket(self.limits.lines_per_second, self.limits.burst, clock)
        self._lines = {s: LineAssembler() for s in STREAMS}
        self._levels = {s: LevelGuess(s) for s in STREAMS}
        self._progress_at: dict[str, float] = {}
        self.sent = 0  # lines admitted (sent or about to be)
        self.dropped = 0  # lines the caps dropped, in all
        self._dropped_unsaid = 0  # ... since the last summary
        self._budget_said = False
        self._summary_at = clock()
        self._handler = _RecordHandler(self)
        self._tee: FdTee | None = None
        self._console: dict[int, IO[str]] = {}  # fd -> a text stream on where it pointed
        self._routing = LogRouting(self._handler, {})
        self._pump_stop = threading.Event()
        self._pump: threading.Thread | None = None
        self._started = False

    # --- lifecycle --------------------------------------------------------------------------

    def __enter__(self) -> LogCapture:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        if self._started:
            return
        self._started = True
        self._pump = threading.Thread(target=self._run_pump, name="logcapture-pump", daemon=True)
        self._pump.start()
        self.reporter.add_drain(self.drain)
        if self.fds:
            tee = FdTee(self.write, thread_prefix="logcapture-")
            try:
                tee.start()
            except OSError as exc:  # no usable descriptors (closed, a sandbox): records only
                log.warning("cannot capture stdout/stderr (%s); capturing logging only", exc)
            else:
                self._tee, self._console = tee, tee.console
        self._routing = LogRouting(self._handler, self._console)
        with contextlib.suppress(Exception):  # never a reason not to train
            self._routing.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop capturing; lines still queued and the drop summary go out (bounded time).
        Never raises: the caller is finishing a run."""
        if not self._started:
            return
        self._started = False
        deadline = time.monotonic() + timeout
        if self._tee is not None:
            with contextlib.suppress(Exception):
                self._tee.stop(deadline)
        with contextlib.suppress(Exception):
            self._routing.stop()
        with contextlib.suppress(Exception):
            for stream in STREAMS:
                with self._lock:
                    rest = self._lines[stream].close()
                for line, progress in rest:
                    self._take_line(stream, line, progress=progress)
        self.reporter.remove_drain(self.drain)
        self._pump_stop.set()
        with self._wake:
            self._wake.notify()
        if self._pump is not None:
            self._pump.join(max(0.1, deadline - time.monotonic()))
        if self._tee is not None:
            self._tee.close()
        self._console = {}

    # --- input ------------------------------------------------------------------------------

    def write(self, stream: str, text: str) -> None:
        """Text written to ``stream`` ("stdout" or "stderr"), in any pieces."""
        with self._lock:
            lines = self._lines[stream].feed(text)
            display = self._lines[stream].display
        for line, progress in lines:
            self._take_line(stream, line, progress=progress)
        if display is not None:
            now = self._clock()
            if now - self._progress_at.get(stream, -1e18) >= self.limits.progress_seconds:
                self._progress_at[stream] = now
                self._take_line(stream, display, progress=True)

    def take_record(self, record: logging.LogRecord) -> None:
        if record.name.startswith(_OWN_LOGGERS) or (record.threadName or "").startswith(
            _OWN_THREADS
        ):
            return
        if not self._admit():
            return
        try:
            message = record.getMessage()
        except Exception:  # a bad format string in a library: its raw message
            message = str(record.msg)
        text, limit, middle = f"{record.name}: {message}", self.limits.max_chars, False
        if record.exc_info or record.stack_info:
            extra = logging.Formatter().formatException(record.exc_info) if record.exc_info else ""
            extra += f"\n{record.stack_info}" if record.stack_info else ""
            text, limit, middle = f"{text}\n{extra.strip()}", 3 * limit, True
        self._enqueue(text, _level_of(record.levelno), {"logger": record.name}, limit, middle)

    def _take_line(self, stream: str, line: str, *, progress: bool) -> None:
        levels = self._levels[stream]
        levels.observe(line)  # every line: a traceback's state needs them all
        if not line.strip() or (self.ignore is not None and self.ignore.search(line)):
            return
        if not self._admit():
            return
        limit = self.limits.max_chars
        level = "info" if progress else levels.level(line[: 4 * limit])
        data: dict[str, Any] = {"stream": stream, **({"progress": True} if progress else {})}
        self._enqueue(line, level, data, limit, False)

    def _admit(self) -> bool:
        """One more line within the caps? Counts it either way."""
        with self._lock:
            if self.sent >= self.limits.max_lines or not self._bucket.take():
                self.dropped += 1
                self._dropped_unsaid += 1
                return False
            self.sent += 1
            return True

    def _enqueue(
        self, text: str, level: str, data: dict[str, Any], limit: int, middle: bool
    ) -> None:
        if middle:  # a traceback: its head and its tail, where the error is named
            text = truncate_middle(text, 4 * limit)
        # Cut before masking (a megabyte line costs no regex time), masked before the final
        # cut (a secret cut in half would not be recognised).
        with self._wake:
            self._queue.append((text[: 4 * limit], level, data, limit, middle))
            self._wake.notify()

    # --- the pump ---------------------------------------------------------------------------

    def _run_pump(self) -> None:
        while True:
            with self._wake:
                if not self._queue and not self._pump_stop.is_set():
                    self._wake.wait(_TICK)
                stopping = self._pump_stop.is_set()
            with contextlib.suppress(Exception):
                with self._process_lock:
                    self._process()
                if self._started:
                    self._routing.adopt()
                self._summarise(final=stopping)
            if stopping:
                return

    def drain(self) -> None:
        """Send what is queued now, on this thread (the reporter calls it before a status
        event, so the lines and the drop summary come before the outcome)."""
        if self._process_lock.acquire(timeout=1.0):  # never hold a final status for long
            try:
                self._process()
            finally:
                self._process_lock.release()
            self._summarise(final=True)

    def _process(self) -> None:
        with self._wake:
            batch = list(self._queue)
            self._queue.clear()
        for text, level, data, limit, middle in batch:
            with contextlib.suppress(Exception):  # a bad line must not stop the pump
                masked = self.redact(text)
                masked = truncate_middle(masked, limit) if middle else truncate(masked, limit)
                self.reporter.log(masked, level, **data)

    def _summarise(self, *, final: bool) -> None:
        now = self._clock()
        with self._lock:
            budget_hit = self.sent >= self.limits.max_lines and not self._budget_said
            self._budget_said |= budget_hit
            due = final or now - self._summary_at >= self.limits.summary_seconds
            dropped, total = self._dropped_unsaid, self.dropped
            if not (due and dropped):
                dropped = 0
            else:
                self._dropped_unsaid, self._summary_at = 0, now
        lim = self.limits
        if budget_hit:
            self.reporter.log(
                f"The executor's log reached {lim.max_lines:,} lines for this attempt; later "
                "lines are counted, not sent.",
                "warning",
                log_lines_limit=lim.max_lines,
            )
        if dropped:
            self.reporter.log(
                f"{dropped:,} log line(s) dropped ({total:,} in all this attempt): at most "
                f"{lim.burst} at once, then {lim.lines_per_second:g} a second, "
                f"{lim.max_lines:,} an attempt. The executor's own output has every line.",
                "warning",
                dropped_lines=dropped,
                dropped_lines_total=total,
            )
