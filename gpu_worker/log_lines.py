"""Captured output as log lines: how text becomes lines, which level a line has, and how many
lines an attempt may send (pure; gpu_worker.logcapture does the capturing)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class LogLimits:
    """How much captured output becomes events.

    A token bucket: ``burst`` lines at once, then ``lines_per_second``; at most ``max_lines``
    in an attempt. The control plane keeps at most 50,000 events an attempt
    (jobs.services.core.events.MAX_EVENTS_PER_ATTEMPT) for metrics, checkpoints and logs together,
    so logs take a tenth of that. A carriage-return progress display (tqdm) is one line every
    ``progress_seconds``. What the caps drop is counted and said in a summary event every
    ``summary_seconds`` (and at the end).
    """

    lines_per_second: float = 1.0
    burst: int = 200
    max_lines: int = 5000
    max_chars: int = 1000  # a line's characters kept (a logged traceback: 3 times that)
    progress_seconds: float = 10.0
    summary_seconds: float = 300.0


class TokenBucket:
    """``take()``: True while the rate allows one more (not thread-safe; callers lock)."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float]) -> None:
        self.rate, self.burst, self._clock = rate, float(burst), clock
        self.tokens = float(burst)
        self._at = clock()

    def take(self) -> bool:
        now = self._clock()
        self.tokens = min(self.burst, self.tokens + (now - self._at) * self.rate)
        self._at = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


def truncate(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… [{len(text) - limit} characters cut]"


def truncate_middle(text: str, limit: int) -> str:
    """Head and tail (a traceback's last lines say what went wrong)."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n… [{len(text) - 2 * half} characters cut] …\n{text[-half:]}"


class LineAssembler:
    """Text of one stream, written in arbitrary pieces, as complete lines.

    A carriage return rewrites the line on a terminal (tqdm's progress bars): of a line only
    the last non-empty ``\\r`` part counts, and an unfinished line rewritten by ``\\r`` is the
    current ``display``, handed out as a progress line by the caller at its own pace.
    """

    # An unfinished line longer than this is handed out anyway (memory stays bounded).
    MAX_PENDING = 64 * 1024

    def __init__(self) -> None:
        self._partial = ""
        self.display: str | None = None  # the latest progress display not yet finished

    def feed(self, text: str) -> list[tuple[str, bool]]:
        """Complete lines in ``text`` (with what came before), each with whether it was a
        progress display (rewritten by ``\\r``); updates ``display``."""
        text = self._partial + text
        *lines, self._partial = text.split("\n")
        out = [(_last_part(line), "\r" in line.rstrip("\r")) for line in lines]
        if out:
            # The display's line was finished: a progress line even if its last piece came
            # without a carriage return.
            out[0] = (out[0][0], out[0][1] or self.display is not None)
            self.display = None
        if "\r" in self._partial:
            head, _, tail = self._partial.rpartition("\r")
            shown = tail if tail.strip() else _last_part(head)
            if shown.strip():
                self.display = shown
            self._partial = tail
        if len(self._partial) > self.MAX_PENDING:
            out.append((self._partial, False))
            self._partial = ""
        return out

    def close(self) -> list[tuple[str, bool]]:
        """What is left: an unfinished line, or the last progress display."""
        rest = self._partial if self._partial.strip() else (self.display or "")
        progress = self.display is not None
        self._partial, self.display = "", None
        return [(rest, progress)] if rest.strip() else []


def _last_part(line: str) -> str:
    if "\r" not in line:
        return line
    parts = [p for p in line.split("\r") if p.strip()]
    return parts[-1] if parts else ""


_ERROR = re.compile(
    r"\b(?:ERROR|CRITICAL|FATAL|Traceback \(most recent call last\)|[A-Z][A-Za-z]*(?:Error|Exception):)"
)
_WARNING = re.compile(r"\b(?:WARNING|WARN|[A-Z][A-Za-z]*Warning:)")
_INFO = re.compile(r"^\W{0,3}(?:\S+\s+){0,3}\W?(?:INFO|DEBUG)\b")


class LevelGuess:
    """The level of a text line: an error or warning word says so, a leading INFO/DEBUG too;
    otherwise stdout is info and stderr a warning. A traceback's lines are errors."""

    def __init__(self, stream: str) -> None:
        self.default = "warning" if stream == "stderr" else "info"
        self._in_traceback = False
        self._traceback_line = False  # the line observed last belongs to a traceback

    def observe(self, line: str) -> None:
        """Follow tracebacks; every line of the stream goes through here, kept or not."""
        if line.startswith("Traceback (most recent call last)"):
            self._in_traceback = True
        elif self._in_traceback and line[:1] not in (" ", "\t"):
            self._in_traceback = False  # the exception line, which ends it
            self._traceback_line = True
            return
        self._traceback_line = self._in_traceback

    def level(self, line: str) -> str:
        if self._traceback_line or _ERROR.search(line):
            return "error"
        if _WARNING.search(line):
            return "warning"
        if _INFO.match(line):
            return "info"
        return self.default
