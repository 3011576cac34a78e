"""The executor's event vocabulary and how a value becomes part of an event: what
``jobs.services.core.events.clean_executor_event`` accepts on the control plane's side."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

EVENT_TYPES = frozenset(
    {"status", "log", "metrics", "checkpoint", "artifact", "error", "heartbeat"}
)
LEVELS = ("debug", "info", "warning", "error")
_LEVEL_ALIASES = {"warn": "warning", "critical": "error", "fatal": "error", "exception": "error"}
# The control plane stores at most this much of a message (jobs.services.core.events.MAX_MESSAGE_CHARS).
MAX_MESSAGE_CHARS = 4000


def jsonable(value: Any) -> Any:
    """A JSON-safe copy: non-finite floats become None (PostgreSQL jsonb rejects NaN), numpy/
    torch scalars their Python value, unknown objects their str()."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [jsonable(v) for v in value]
    item = getattr(value, "item", None)  # numpy / torch scalars
    if callable(item):
        try:
            return jsonable(item())
        except (TypeError, ValueError, RuntimeError):
            pass
    return str(value)


def _format_metric(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def metrics_message(values: Mapping[str, Any]) -> str:
    parts = []
    if "step" in values:
        total = values.get("total_steps")
        parts.append(f"step {values['step']}" + (f"/{total}" if total is not None else ""))
    parts += [
        f"{k}={_format_metric(v)}" for k, v in values.items() if k not in ("step", "total_steps")
    ]
    return " ".join(parts)


def level(level: str) -> str:
    norm = str(level).lower()
    norm = _LEVEL_ALIASES.get(norm, norm)
    if norm not in LEVELS:
        raise ValueError(f"log level {level!r} is not one of {', '.join(LEVELS)}")
    return norm
