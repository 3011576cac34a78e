"""A text/event-stream reader (the parts of the SSE format the stream process sends)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ServerEvent:
    event: str  # the ``event:`` field ("message" when absent)
    id: str | None
    data: Any  # the ``data:`` lines joined and parsed as JSON (the raw text if not JSON)


def parse(lines: Iterable[str]) -> Iterator[ServerEvent | None]:
    """Each event of the stream; ``None`` for a comment (a keep-alive), so a reader can check
    its clock between events."""
    kind, ident, data = "message", None, list[str]()
    for raw in lines:
        line = raw.rstrip("\r")
        if not line:
            if data:
                text = "\n".join(data)
                try:
                    value: Any = json.loads(text)
                except ValueError:
                    value = text
                yield ServerEvent(kind, ident, value)
            kind, ident, data = "message", None, []
            continue
        if line.startswith(":"):
            yield None
            continue
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "event":
            kind = value
        elif name == "data":
            data.append(value)
        elif name == "id":
            ident = value
