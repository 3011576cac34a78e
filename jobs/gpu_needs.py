"""Which of the operator's GPU nodes may run a job: the job's needs against a node's report.

Pure functions (no database): the API validates ``gpu`` and ``node_selector`` with
:func:`parse_gpu` / :func:`parse_node_selector`; the dispatcher asks :func:`misfit` of every
node and uses its answer both to choose and to tell the user why a job still waits.

A job's needs: ``gpu = {"count": 2, "min_vram_gb": 40, "name": "*H100*"}`` (every key
optional; a name or VRAM without a count asks for one GPU; no count asks for none, so a CPU
node qualifies) and
``node_selector = {"region": "eu-*"}`` (every label must exist on the node and match the glob).

Among the nodes that fit, the dispatcher prefers one that has the job's base model cached
(:func:`model_cached`, from the list the node reports; gpu_worker.agent.model_cache).
"""

from __future__ import annotations

import fnmatch
import posixpath
import re
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

from jobs.errors import InvalidRequest

_LABEL_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,62}$")
MAX_GPUS = 64
MIB_IN_GB = 2**20 / 1e9
MAX_SELECTOR_LABELS = 16
MAX_PRICE_PER_HOUR = 10_000  # USD: far above any machine sold, below a typo's scale


def _bad(message: str, param: str) -> InvalidRequest:
    return InvalidRequest(message, code="invalid_value", param=param)


def _printable_ascii(text: str) -> bool:
    return text.isascii() and text.isprintable()  # GPU names are ASCII; so is their glob


def parse_gpu(data: object) -> dict[str, Any]:
    """Validate a job's ``gpu`` needs; returns them normalised (absent keys left out)."""
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise _bad('gpu must be an object like {"count": 1, "min_vram_gb": 24}.', "gpu")
    unknown = sorted(set(data) - {"count", "min_vram_gb", "name"})
    if unknown:
        raise _bad(f"Unknown field gpu.{unknown[0]}; accepted: count, min_vram_gb, name.", "gpu")
    out: dict[str, Any] = {}
    count = data.get("count")
    if count is not None:
        if not isinstance(count, int) or isinstance(count, bool) or not 0 <= count <= MAX_GPUS:
            raise _bad(f"gpu.count must be an integer from 0 to {MAX_GPUS}.", "gpu.count")
        out["count"] = count
    vram = data.get("min_vram_gb")
    if vram is not None:
        if not isinstance(vram, int | float) or isinstance(vram, bool) or not 0 < vram <= 4096:
            raise _bad("gpu.min_vram_gb must be a number above 0 (GB per GPU).", "gpu.min_vram_gb")
        out["min_vram_gb"] = vram
    name = data.get("name")
    if name is not None:
        if not isinstance(name, str) or not 0 < len(name) <= 100 or not _printable_ascii(name):
            raise _bad(
                'gpu.name must be a GPU name or glob such as "*H100*" (1-100 characters).',
                "gpu.name",
            )
        out["name"] = name
    if ("name" in out or "min_vram_gb" in out) and "count" not in out:
        out["count"] = 1  # naming a GPU asks for one
    return out


def parse_price(data: object) -> Decimal | None:
    """Validate ``max_price_per_hour`` (USD per hour for the whole machine)."""
    if data is None:
        return None
    if not isinstance(data, int | float | str) or isinstance(data, bool):
        raise _bad(
            "max_price_per_hour must be a number of USD per hour, e.g. 2.5.", "max_price_per_hour"
        )
    try:
        price = Decimal(str(data))
    except InvalidOperation:
        raise _bad(f"max_price_per_hour {data!r} is not a number.", "max_price_per_hour") from None
    if not price.is_finite() or not 0 < price <= MAX_PRICE_PER_HOUR:
        raise _bad(
            f"max_price_per_hour must be above 0 and at most {MAX_PRICE_PER_HOUR} (USD per hour).",
            "max_price_per_hour",
        )
    return price.quantize(Decimal("0.0001"))


def parse_node_selector(data: object) -> dict[str, str]:
    """Validate ``{label: glob}``; label keys as Kubernetes-style names, values printable."""
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise _bad('node_selector must be an object like {"region": "eu-*"}.', "node_selector")
    if len(data) > MAX_SELECTOR_LABELS:
        raise _bad(f"node_selector has more than {MAX_SELECTOR_LABELS} labels.", "node_selector")
    out: dict[str, str] = {}
    for key, pattern in data.items():
        param = f"node_selector.{key}"
        if not isinstance(key, str) or not _LABEL_KEY.match(key):
            raise _bad(
                "node_selector keys are label names (letters, digits, . _ / -).", "node_selector"
            )
        if not isinstance(pattern, str) or not 0 < len(pattern) <= 200 or not pattern.isprintable():
            raise _bad(f"{param} must be a label value or glob (1-200 characters).", param)
        out[key] = pattern
    return out


def misfit(gpu: Mapping[str, Any], selector: Mapping[str, str], node: Any) -> str | None:
    """Why ``node`` cannot run a job with these needs, or None if it can (status aside).

    ``node`` has ``capabilities`` (``gpu_count``, ``gpus: [{name, vram_mb}]``) and ``labels``.
    """
    caps = node.capabilities or {}
    gpus = caps.get("gpus") or []
    have = int(caps.get("gpu_count") or len(gpus))
    need = int(gpu.get("count") or 0)
    if need > have:
        return f"has {have} GPU(s), the job needs {need}"
    if need and "min_vram_gb" in gpu:
        # nvidia-smi reports MiB; cards are sold in decimal GB (an "80GB" H100 is 81559 MiB).
        smallest = min((g.get("vram_mb") or 0) for g in gpus[:need] or [{}]) * MIB_IN_GB
        if smallest < gpu["min_vram_gb"]:
            return f"has {smallest:.1f} GB per GPU, the job needs {gpu['min_vram_gb']:g} GB"
    if need and "name" in gpu:
        names = {str(g.get("name", "")) for g in gpus}
        if not any(fnmatch.fnmatchcase(n, gpu["name"]) for n in names):
            return f"has {', '.join(sorted(names)) or 'no GPU'}, the job needs {gpu['name']}"
    labels = node.labels or {}
    for key, pattern in selector.items():
        if key not in labels:
            return f"has no label {key}"
        if not fnmatch.fnmatchcase(str(labels[key]), pattern):
            return f"label {key}={labels[key]} does not match {pattern}"
    return None


def _model_key(model: str) -> str:
    # A local model is named by its path: "/models/x/" and "/models/x" are the same folder.
    return posixpath.normpath(model) if model.startswith("/") else model


def model_cached(node: Any, model: str) -> bool:
    """Whether ``node`` reported ``model`` (a hub id, matched exactly as the hub cache is, or an
    absolute path) among its cached models."""
    cached = node.cached_models if isinstance(node.cached_models, list) else []
    key = _model_key(model)
    return any(isinstance(m, str) and _model_key(m) == key for m in cached)


def cached_first(nodes: list[Any], model: str) -> list[Any]:
    """``nodes`` with those that have ``model`` cached first, each group in its given order."""
    return sorted(nodes, key=lambda n: not model_cached(n, model))
