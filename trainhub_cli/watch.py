"""``trainhub jobs watch``: a job followed to its end over the live SSE stream (the stream
process), or by polling its events with an ``after`` cursor when no stream can be reached.

The exit code is the job's outcome (errors.ExitCode): succeeded 0, failed 10, cancelled 11,
paused 12.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import httpx
from rich.console import Group
from rich.live import Live
from rich.text import Text

from trainhub_cli import sse
from trainhub_cli.client import Api
from trainhub_cli.errors import CliError, ExitCode
from trainhub_cli.render import Output, duration, sparkline, status_text

OUTCOMES = {
    "succeeded": ExitCode.OK,
    "failed": ExitCode.JOB_FAILED,
    "cancelled": ExitCode.JOB_CANCELLED,
    "paused": ExitCode.JOB_PAUSED,
}
JOB_STATUSES = {
    "validating_files", "queued", "provisioning", "running", "finalizing", "succeeded",
    "failed", "cancelling", "cancelled", "paused",
}  # fmt: skip
PLAIN_PROGRESS_SECONDS = 5.0
LOG_LINES = 6


def stream_kind(event: dict[str, Any]) -> str:
    """The stream's name for a listed event (jobs.services.outbox.live.stream_type): ``status`` is a
    change of the job's status; an attempt's own status reports are ``attempt_status``."""
    kind = str(event.get("type") or "")
    data = _data(event)
    if kind == "status" and (event.get("attempt") or data.get("status") not in JOB_STATUSES):
        return "attempt_status"
    return kind


def _data(event: dict[str, Any]) -> dict[str, Any]:
    data = event.get("data")
    return data if isinstance(data, dict) else {}


def event_seq(event_id: str) -> int:
    """``ftevent-<job>-<n>`` → n (the events list's ids end with the event's number)."""
    tail = event_id.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else 0


class StreamUnavailable(Exception):
    pass


@dataclass
class View:
    """What the watcher knows of the job, drawn live or printed as lines."""

    job_id: str
    status: str = "?"
    step: int | None = None
    total: int | None = None
    losses: list[float] = field(default_factory=list)
    valid_losses: list[float] = field(default_factory=list)  # the validation passes' losses
    accuracy: float | None = None  # the last step's mean token accuracy
    logs: deque[Text] = field(default_factory=lambda: deque(maxlen=LOG_LINES))
    first: tuple[float, int] | None = None  # (Unix time, step) of the first metrics seen
    rate: float | None = None  # steps per second
    estimated_finish: float | None = None  # the API's, Unix seconds
    useful_rate: float | None = None  # tokens that carry loss, per second
    padding: float | None = None  # padding's share of the positions computed
    source: str = ""
    seq: int = 0

    def load(self, job: dict[str, Any]) -> None:
        self.status = str(job.get("status"))
        metrics = job.get("metrics") or {}
        if isinstance(metrics.get("step"), int):
            self.step = metrics["step"]
        if isinstance(metrics.get("total_steps"), int):
            self.total = metrics["total_steps"]
        self._throughput(metrics)
        finish = job.get("estimated_finish")
        self.estimated_finish = float(finish) if isinstance(finish, int | float) else None

    def eta(self) -> float | None:
        if self.step is not None and self.total and self.rate:
            return max(self.total - self.step, 0) / self.rate
        if self.estimated_finish:
            return max(self.estimated_finish - time.time(), 0)
        return None

    def apply(self, kind: str, event: dict[str, Any]) -> str | None:
        """Take one event; returns a line worth printing in plain mode (None: nothing)."""
        data = _data(event)
        message = str(event.get("message") or "")
        if kind == "status":
            self.status = str(data.get("status") or self.status)
            self.logs.append(Text(f"status → {self.status}", style="bold"))
            return f"status: {self.status}"
        if kind == "metrics":
            step, total, loss = data.get("step"), data.get("total_steps"), data.get("loss")
            if isinstance(step, int):
                # The pace from the events' own times: a replayed history arrives all at once.
                stamp = event.get("created_at")
                now = float(stamp) if isinstance(stamp, int | float) else time.time()
                if self.first is None:
                    self.first = (now, step)
                elif step > self.first[1] and now > self.first[0]:
                    self.rate = (step - self.first[1]) / (now - self.first[0])
                self.step = step
            if isinstance(total, int):
                self.total = total
            if isinstance(loss, int | float):
                self.losses.append(float(loss))
            accuracy = data.get("mean_token_accuracy")
            if isinstance(accuracy, int | float) and not isinstance(accuracy, bool):
                self.accuracy = float(accuracy)
            self._throughput(data)
            return None
        if kind == "log":
            valid = data.get("eval_loss")
            if isinstance(valid, int | float) and not isinstance(valid, bool):
                self.valid_losses.append(float(valid))
            self.logs.append(Text(message))
            return None
        if not message:
            return None
        style = "red" if kind == "error" or event.get("level") == "error" else "dim"
        self.logs.append(Text(f"{kind}: {message}", style=style))
        return f"{kind}: {message}"

    def _throughput(self, metrics: dict[str, Any]) -> None:
        useful, padding = metrics.get("useful_tokens_per_second"), metrics.get("padding_share")
        if isinstance(useful, int | float) and not isinstance(useful, bool):
            self.useful_rate = float(useful)
        if isinstance(padding, int | float) and not isinstance(padding, bool):
            self.padding = float(padding)

    def progress_line(self) -> str:
        parts = []
        if self.step is not None:
            parts.append(f"step {self.step}/{self.total or '?'}")
        if self.losses:
            parts.append(f"loss {self.losses[-1]:.4f}")
        if self.valid_losses:
            parts.append(f"valid {self.valid_losses[-1]:.4f}")
        if self.accuracy is not None:
            parts.append(f"token accuracy {self.accuracy:.0%}")
        if self.useful_rate is not None:
            parts.append(f"{self.useful_rate:,.0f} useful tok/s")
        if self.padding is not None:
            parts.append(f"{self.padding:.0%} padding")
        eta = self.eta()
        if eta is not None and self.status == "running":
            parts.append(f"ETA {duration(eta)}")
        return "  ".join(parts)

    def render(self) -> Group:
        head = Text.assemble(
            (self.job_id, "bold"), "  ", status_text(self.status), (f"  via {self.source}", "dim")
        )
        lines: list[Any] = [head]
        if self.step is not None:
            width = 30
            done = int(width * self.step / self.total) if self.total else 0
            bar = Text("█" * done, style="cyan").append("░" * (width - done), style="dim")
            lines.append(Text.assemble(bar, "  ", self.progress_line()))
        if self.losses:
            lines.append(Text.assemble(("loss  ", "dim"), (sparkline(self.losses), "magenta")))
        if self.valid_losses:
            lines.append(Text.assemble(("valid ", "dim"), (sparkline(self.valid_losses), "cyan")))
        lines.extend(self.logs)
        return Group(*lines)


class Watcher:
    def __init__(
        self,
        api: Api,
        out: Output,
        job_id: str,
        *,
        stream_url: str | None,
        use_stream: bool = True,
        interval: float = 2.0,
        timeout: float | None = None,
        show_logs: bool = False,
    ) -> None:
        self.api, self.out, self.job_id = api, out, job_id
        self.stream_url, self.use_stream = stream_url, use_stream
        self.interval, self.show_logs = interval, show_logs
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.timeout = timeout
        self.view = View(job_id)
        self._live: Live | None = None
        self._printed_at = 0.0
        self._cursor_id: str | None = None

    # --- the loop ------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        job: dict[str, Any] = self.api.get(f"/fine_tuning/jobs/{self.job_id}")
        self.view.load(job)
        if self.view.status in OUTCOMES:
            return job
        self._plain(f"watching {self.job_id}: {self.view.status}")
        live = Live(get_renderable=self.view.render, console=self.out.err, refresh_per_second=4)
        if self.out.interactive:
            self._live = live
            live.start()
        try:
            if not (self.use_stream and self._follow_stream()):
                self._poll()
        finally:
            if self._live is not None:
                self._live.stop()
        self._plain_progress(force=True)
        return dict(self.api.get(f"/fine_tuning/jobs/{self.job_id}"))

    def _follow_stream(self) -> bool:
        """True once the stream showed the job's end; False to go on by polling."""
        events = f"/jobs/{self.job_id}/events"
        base = self.stream_url or self.api.discover_stream(events)
        if base is None:
            self._note(
                "no live stream (TRAINHUB_STREAM_URL not set here or on the server); polling"
            )
            return False
        for attempt in range(3):  # a dropped stream is re-joined from the last event seen
            try:
                if self._read_stream(base, f"{events}?stream=true&after={self.view.seq}"):
                    return True
            except CliError as exc:
                if exc.exit_code == ExitCode.AUTH:
                    raise
                self._note(f"live stream at {base} refused ({exc.message}); polling")
                return False
            except StreamUnavailable as exc:
                if attempt == 2:
                    self._note(f"live stream at {base} unavailable ({exc}); polling")
                    return False
                time.sleep(0.5 * (attempt + 1))
        return False

    def _read_stream(self, base: str, path: str) -> bool:
        self.view.source = "live stream"
        try:
            with self.api.stream_events(base, path) as resp:
                for item in sse.parse(resp.iter_lines()):
                    self._check_deadline()
                    if item is None or not isinstance(item.data, dict):
                        continue
                    if item.event == "resync":
                        continue  # the server re-sends from our cursor
                    if item.id and item.id.isdigit():
                        self.view.seq = int(item.id)
                    if self._take(item.event, item.data):
                        return True
        except httpx.HTTPError as exc:
            raise StreamUnavailable(f"{exc.__class__.__name__}: {exc}") from None
        raise StreamUnavailable("the stream ended before the job did")

    def _poll(self) -> None:
        self.view.source = "polling"
        while True:
            self._check_deadline()
            # The job first: once it has ended, its last status event is stored (in the same
            # transaction), so the events read next end with it.
            job = self.api.get(f"/fine_tuning/jobs/{self.job_id}")
            while True:  # every page of new events
                page = self.api.get(
                    f"/jobs/{self.job_id}/events", after=self._cursor_id or None, limit=100
                )
                for event in page.get("data") or []:
                    self._cursor_id = str(event.get("id"))
                    self.view.seq = event_seq(self._cursor_id)
                    if self._take(stream_kind(event), event):
                        return
                if not page.get("has_more"):
                    break
            self.view.load(job)
            if self.view.status in OUTCOMES:
                return
            time.sleep(self.interval)

    # --- one event -----------------------------------------------------------------------
    def _take(self, kind: str, event: dict[str, Any]) -> bool:
        """Apply one event; True when it is the job's end."""
        line = self.view.apply(kind, event)
        if kind == "log" and self.show_logs:
            self._plain(f"log: {event.get('message')}")
        elif line:
            self._plain(line)
        if kind == "metrics":
            self._plain_progress()
        return kind == "status" and self.view.status in OUTCOMES

    def _check_deadline(self) -> None:
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise CliError(
                f"{self.job_id} is still {self.view.status} after {self.timeout:.0f} s "
                "(--timeout); it goes on: `trainhub jobs watch` it again later.",
                ExitCode.TIMEOUT,
            )

    def _plain(self, line: str) -> None:
        """A line for a log or a pipe (not --json, not the live view)."""
        if self._live is None and not self.out.json_mode:
            self.out.err.print(Text(line), soft_wrap=True)

    def _plain_progress(self, force: bool = False) -> None:
        now = time.monotonic()
        if (
            force or now - self._printed_at >= PLAIN_PROGRESS_SECONDS
        ) and self.view.step is not None:
            self._printed_at = now
            self._plain(self.view.progress_line())

    def _note(self, text: str) -> None:
        if self._live is not None:
            self.view.logs.append(Text(text, style="yellow"))
        else:
            self._plain(text)


def outcome(job: dict[str, Any]) -> ExitCode:
    return OUTCOMES.get(str(job.get("status")), ExitCode.UNEXPECTED)
