"""The reporter's settings from a spec's ``report`` block: which sinks, and how often to
heartbeat, flush and send metrics::

    {"sinks": [{"type": "http"} | {"type": "jsonl", "path": "..."} | {"type": "runpod"}],
     "heartbeat_seconds": 30, "metrics_interval_seconds": 1, "flush_seconds": 5}
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpu_worker.sinks import HttpSink, JsonlSink, RunpodSink, Sink

DEFAULT_JSONL_PATH = "events.jsonl"


@dataclass(frozen=True)
class ReportSettings:
    sinks: list[Sink]
    heartbeat_interval: float
    flush_interval: float
    metrics_interval: float


def report_settings(
    report: object, *, runpod_job: Mapping[str, Any] | None = None
) -> ReportSettings:
    """The settings a ``report`` block asks for. No sinks configured: a JSON-lines file
    ``./events.jsonl`` (a hand-started ``python -m gpu_worker run`` leaves a readable trace).
    With ``runpod_job`` (the RunPod handler's job) a RunPod sink is always included, and
    replaces that default. Raises ValueError for an unknown sink type or a malformed value."""
    report = report or {}
    if not isinstance(report, Mapping):
        raise ValueError("report must be an object")
    configs = report.get("sinks") or []
    if not isinstance(configs, list):
        raise ValueError('report.sinks must be a list such as [{"type": "jsonl", "path": ...}]')
    sinks: list[Sink] = []
    for i, cfg in enumerate(configs):
        sinks.append(_sink_from_config(cfg, f"report.sinks[{i}]", runpod_job))
    if runpod_job is not None and not any(isinstance(s, RunpodSink) for s in sinks):
        sinks.append(RunpodSink(runpod_job))
    if not sinks:
        sinks.append(JsonlSink(DEFAULT_JSONL_PATH))
    return ReportSettings(
        sinks=sinks,
        heartbeat_interval=_seconds(report, "heartbeat_seconds", 30.0, minimum_exclusive=0),
        flush_interval=_seconds(report, "flush_seconds", 5.0, minimum_exclusive=0),
        metrics_interval=_seconds(report, "metrics_interval_seconds", 1.0, minimum_exclusive=None),
    )


def _seconds(
    report: Mapping[str, Any], key: str, default: float, *, minimum_exclusive: float | None
) -> float:
    value = report.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"report.{key} must be a number of seconds (got {value!r})")
    if value < 0 or (minimum_exclusive is not None and value <= minimum_exclusive):
        bound = f"> {minimum_exclusive}" if minimum_exclusive is not None else ">= 0"
        raise ValueError(f"report.{key} must be {bound} (got {value!r})")
    return float(value)


_SINK_TYPES = ("http", "jsonl", "runpod")


def _sink_from_config(cfg: object, where: str, runpod_job: Mapping[str, Any] | None) -> Sink:
    if not isinstance(cfg, Mapping) or not isinstance(cfg.get("type"), str):
        raise ValueError(f'{where} must be an object with a "type" ({", ".join(_SINK_TYPES)})')
    kind = cfg["type"]
    if kind == "http":
        if set(cfg) - {"type"}:
            raise ValueError(
                f"{where} takes no settings: the executor reads TRAINHUB_REPORT_URL and "
                "TRAINHUB_REPORT_TOKEN from its environment (the spec is not secret)"
            )
        return HttpSink()
    if kind == "jsonl":
        path = cfg.get("path", DEFAULT_JSONL_PATH)
        if not isinstance(path, str) or not path:
            raise ValueError(f"{where}.path must be a file path")
        return JsonlSink(path)
    if kind == "runpod":
        if runpod_job is None:
            raise ValueError(f"{where}: the runpod sink works only inside the RunPod handler")
        return RunpodSink(runpod_job)
    raise ValueError(
        f"{where}.type {kind!r} is not a known sink type; use one of {', '.join(_SINK_TYPES)}"
    )
