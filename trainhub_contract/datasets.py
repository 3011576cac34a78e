"""Training dataset formats: detection and streaming validation of JSONL files.

Used twice with the same rules: by the control plane when a file is uploaded (so a broken file
fails before any GPU is paid for) and by the executor when it reads the examples.

Accepted record shapes (trainhub_contract.dataset_formats), one JSON object per line (detection
precedence in this order):

- ``messages``: ``{"messages": [{"role": "system"|"user"|"assistant"|"tool", "content": "..."}]}``
- ``prompt_completion``: ``{"prompt": "...", "completion": "..."}``
- ``alpaca``: ``{"instruction": "...", "input": "..." (optional), "output": "..."}``
- ``text``: ``{"text": "..."}``
- ``preference`` (what a dpo job trains on, OpenAI's shape): ``{"input": {"messages": [...],
  "tools": [...] (optional)}, "preferred_output": [{"role": "assistant", ...}],
  "non_preferred_output": [{"role": "assistant", ...}]}``

Line numbers are 1-based and count every line, blank ones included. File-level problems (no
examples, too few examples) are reported as ``LineError(line=0, ...)``, and as
``DatasetError(line=None, ...)`` by :func:`iter_examples`.

Standard library only: this module runs inside Django and on GPU machines without it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from trainhub_contract.dataset_formats import (
    FORMATS,
    ROLES,
    SHAPES,
    check_record,
    detect_format,
    estimate_tokens,
)

__all__ = [
    "FORMATS",
    "MAX_LINE_BYTES",
    "MAX_REPORTED_ERRORS",
    "ROLES",
    "DatasetError",
    "DatasetReport",
    "LineError",
    "detect_format",
    "estimate_tokens",
    "iter_examples",
    "validate_jsonl",
    "validate_path",
]

MAX_REPORTED_ERRORS = 20
MAX_LINE_BYTES = 1 << 20  # a single line above 1 MiB is an error for that line
READ_CHUNK_BYTES = 1 << 20

_BOM = b"\xef\xbb\xbf"
_JSON_TYPES = {list: "an array", str: "a string", int: "a number", float: "a number",
               bool: "a boolean", type(None): "null"}  # fmt: skip


@dataclass(frozen=True)
class LineError:
    """One problem in a dataset file; ``line`` is 1-based, 0 for the file as a whole."""

    line: int
    message: str


@dataclass
class DatasetReport:
    """The outcome of validating one file.

    ``errors`` holds the first MAX_REPORTED_ERRORS problems in line order (file-level first);
    ``error_count`` counts all of them. ``format`` is the format of the first valid example.
    """

    format: str | None = None
    example_count: int = 0
    token_estimate: int = 0
    errors: list[LineError] = field(default_factory=list)
    error_count: int = 0

    @property
    def ok(self) -> bool:
        return self.error_count == 0 and self.example_count >= 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "example_count": self.example_count,
            "token_estimate": self.token_estimate,
            "errors": [asdict(e) for e in self.errors],
            "error_count": self.error_count,
            "ok": self.ok,
        }

    def _add(self, error: LineError) -> None:
        self.error_count += 1
        if len(self.errors) < MAX_REPORTED_ERRORS:
            self.errors.append(error)


class DatasetError(ValueError):
    """The first bad line met by :func:`iter_examples` (``line`` None: the whole file)."""

    def __init__(self, line: int | None, message: str) -> None:
        super().__init__(f"line {line}: {message}" if line is not None else message)
        self.line = line
        self.message = message


# --- streaming ------------------------------------------------------------------------------


def _strip_bom(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """Drop a UTF-8 BOM at the very start, even when it is split across chunks."""
    it = iter(chunks)
    head = b""
    for chunk in it:
        head += bytes(chunk)
        if len(head) >= len(_BOM) or not _BOM.startswith(head):
            break
    yield head[len(_BOM) :] if head.startswith(_BOM) else head
    yield from it


def _split_lines(chunks: Iterable[bytes]) -> Iterator[tuple[int, bytes | None, int]]:
    """Yield ``(line_number, line_bytes, size)`` for every line, terminator stripped.

    ``line_bytes`` is None for a line over MAX_LINE_BYTES: its bytes are counted and dropped,
    so memory stays bounded by one line whatever the chunking.
    """
    limit = MAX_LINE_BYTES  # read at call time so tests can lower it
    buf = bytearray()
    size = 0  # bytes of the current line so far, counted even once they are dropped
    ends_cr = False  # whether the current line's last byte so far is '\r' (CRLF endings)
    number = 1
    for chunk in _strip_bom(chunks):
        chunk = bytes(chunk) if isinstance(chunk, memoryview) else chunk
        start = 0
        while True:
            end = chunk.find(b"\n", start)
            piece = chunk[start:] if end == -1 else chunk[start:end]
            if piece:
                size += len(piece)
                ends_cr = piece.endswith(b"\r")
                # +1 leaves room for the '\r' of a CRLF line exactly at the limit.
                if size <= limit + 1:
                    buf += piece
                else:
                    buf.clear()
            if end == -1:
                break
            yield _finish(number, buf, size - ends_cr, limit)
            buf.clear()
            size, ends_cr, number, start = 0, False, number + 1, end + 1
    if size:
        yield _finish(number, buf, size - ends_cr, limit)


def _finish(number: int, buf: bytearray, size: int, limit: int) -> tuple[int, bytes | None, int]:
    if size > limit:
        return number, None, size
    return number, bytes(buf[:size]), size


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


class _Checker:
    """Checks lines one at a time and remembers the file's format (set by its first valid line)."""

    def __init__(self) -> None:
        self.format: str | None = None
        self.format_line = 0

    def check(
        self, number: int, raw: bytes | None, size: int
    ) -> tuple[dict[str, Any] | None, str | None, list[str]]:
        """Returns (record, error, texts); record and error are both None for a blank line."""
        if raw is None:
            return (
                None,
                f"line is {size} bytes; the limit is {MAX_LINE_BYTES} bytes per example",
                [],
            )
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            return (
                None,
                f"invalid UTF-8 at byte {e.start + 1} of the line; save the file as UTF-8",
                [],
            )
        if not text.strip():
            return None, None, []
        try:
            record = json.loads(text, parse_constant=_reject_constant)
        except json.JSONDecodeError as e:
            return None, f"invalid JSON: {e.msg} at column {e.colno}", []
        except (ValueError, RecursionError) as e:  # NaN, huge integers, absurd nesting
            return (
                None,
                f"invalid JSON: {e if isinstance(e, ValueError) else 'nested too deeply'}",
                [],
            )
        if not isinstance(record, dict):
            return (
                None,
                f"expected a JSON object, got {_JSON_TYPES.get(type(record), 'a value')}; {SHAPES}",
                [],
            )
        fmt = detect_format(record)
        if fmt is None:
            keys = ", ".join(sorted(record)[:10]) or "none"
            return None, f"unrecognised example (keys: {keys}); {SHAPES}", []
        if self.format is not None and fmt != self.format:
            return (
                None,
                (
                    f"line {number} is {fmt} but the file started as {self.format} "
                    f"(line {self.format_line}); use one format per file"
                ),
                [],
            )
        error, texts = check_record(fmt, record)
        if error is not None:
            return None, error, []
        if self.format is None:
            self.format, self.format_line = fmt, number
        return record, None, texts


def validate_jsonl(chunks: Iterable[bytes], *, min_examples: int = 1) -> DatasetReport:
    """Validate a JSONL dataset given as byte chunks split anywhere; memory stays flat.

    Every line is checked (one error per line); the report keeps the first
    MAX_REPORTED_ERRORS errors and counts all. Fewer than ``min_examples`` valid examples adds
    a file-level error at line 0.
    """
    report = DatasetReport()
    checker = _Checker()
    line_errors = 0
    for number, raw, size in _split_lines(chunks):
        record, error, texts = checker.check(number, raw, size)
        if error is not None:
            line_errors += 1
            report._add(LineError(number, error))
        elif record is not None:
            report.example_count += 1
            report.token_estimate += sum(estimate_tokens(t) for t in texts)
    report.format = checker.format
    if report.example_count < min_examples:
        if report.example_count == 0 and line_errors == 0:
            message = "the file contains no examples (it is empty or only blank lines)"
        else:
            message = f"the file has {report.example_count} valid example(s); at least {min_examples} required"
        # File-level errors go first (line 0) so the cap never hides them.
        report.errors.insert(0, LineError(0, message))
        report.error_count += 1
        del report.errors[MAX_REPORTED_ERRORS:]
    return report


def _read_chunks(path: str | os.PathLike[str]) -> Iterator[bytes]:
    with open(path, "rb") as f:
        while chunk := f.read(READ_CHUNK_BYTES):
            yield chunk


def validate_path(path: str | os.PathLike[str]) -> DatasetReport:
    """Validate a file on disk (read in 1 MiB chunks). OSError propagates to the caller."""
    return validate_jsonl(_read_chunks(path))


def iter_examples(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """Yield the parsed examples of a file for training, with the same checks as validation.

    Raises DatasetError on the first bad line, or DatasetError(None, ...) if the file has no
    examples (raised after the last line, as the generator is exhausted).
    """
    checker = _Checker()
    count = 0
    for number, raw, size in _split_lines(_read_chunks(path)):
        record, error, _ = checker.check(number, raw, size)
        if error is not None:
            raise DatasetError(number, error)
        if record is not None:
            count += 1
            yield record
    if count == 0:
        raise DatasetError(None, "the file contains no examples")
