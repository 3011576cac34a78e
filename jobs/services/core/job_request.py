"""A job-create body as OpenAI's SDK sends it, turned into trainhub's own fields.

OpenAI's clients send ``method: {type: "supervised", supervised: {hyperparameters: {...}}}``
or ``method: {type: "dpo", dpo: {hyperparameters: {beta, ...}}}`` (or the older top-level
``hyperparameters``, supervised), ``"auto"`` for any value the service should pick,
``learning_rate_multiplier`` instead of a learning rate, ``metadata`` and ``integrations``.
trainhub's own settings (adapter, target, gpu, ...) arrive as extra top-level fields, which is
what the SDK's ``extra_body`` does. This module is the one place that knows the mapping; the
result is validated by ``services.jobs`` like any native request.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jobs.errors import InvalidRequest
from trainhub_contract.spec import Hyperparameters

# OpenAI multiplies its own base rate; LoRA's usual rate plays that part here, so a multiplier
# of 1 (what "auto" means) is the executor's default learning rate. DPO moves a model that
# already answers well by small steps: a quarter of a percent of it (5e-5 with LoRA; full-model
# DPO recipes use 5e-7 to 5e-6).
BASE_LEARNING_RATE = Hyperparameters.learning_rate
BASE_LEARNING_RATES = {"supervised": BASE_LEARNING_RATE, "dpo": 5e-5}
SUPPORTED_METHODS = tuple(BASE_LEARNING_RATES)
METHOD_ONLY = {"beta": "dpo"}  # hyperparameters that belong to one method
METADATA_MAX_KEYS, METADATA_KEY_CHARS, METADATA_VALUE_CHARS = 16, 64, 512


def _error(message: str, param: str, code: str = "invalid_value") -> InvalidRequest:
    return InvalidRequest(message, code=code, param=param)


def base_learning_rate(method: str) -> float:
    return BASE_LEARNING_RATES.get(method, BASE_LEARNING_RATE)


def _method_hyperparameters(method: object) -> tuple[str, dict[str, Any]]:
    if not isinstance(method, Mapping):
        raise _error(
            'method must be an object such as {"type": "supervised"}.', "method", "invalid_type"
        )
    kind = method.get("type")
    if kind not in SUPPORTED_METHODS:
        raise _error(
            f"method.type {kind!r} is not supported; supported: {', '.join(SUPPORTED_METHODS)} "
            "(reinforcement is not available on trainhub).",
            "method.type",
        )
    unknown = sorted(set(method) - {"type", kind})
    if unknown:
        raise _error(
            f"method.{unknown[0]} does not go with method.type '{kind}'.", f"method.{unknown[0]}"
        )
    block = {} if method.get(kind) is None else method[kind]
    if not isinstance(block, Mapping) or set(block) - {"hyperparameters"}:
        raise _error(
            f"method.{kind} must be an object with only 'hyperparameters'.", f"method.{kind}"
        )
    hyper = {} if block.get("hyperparameters") is None else block["hyperparameters"]
    if not isinstance(hyper, Mapping):
        raise _error(
            f"method.{kind}.hyperparameters must be an object.",
            f"method.{kind}.hyperparameters",
            "invalid_type",
        )
    return str(kind), dict(hyper)


def _resolve(hyper: dict[str, Any], where: str, method: str) -> dict[str, Any]:
    """Drop "auto" (the method's default applies) and turn a multiplier into a learning rate."""
    out = {k: v for k, v in hyper.items() if v != "auto"}
    for name, owner in METHOD_ONLY.items():
        if name in out and method != owner:
            raise _error(f"{name} goes with method.type '{owner}'.", f"{where}.{name}")
    if "learning_rate_multiplier" in out:
        multiplier = out.pop("learning_rate_multiplier")
        param = f"{where}.learning_rate_multiplier"
        if "learning_rate" in out:
            raise _error("Give learning_rate or learning_rate_multiplier, not both.", param)
        if not isinstance(multiplier, int | float) or isinstance(multiplier, bool):
            raise _error(
                'learning_rate_multiplier must be a number or "auto".', param, "invalid_type"
            )
        if not 0 < multiplier <= 10:
            raise _error(
                f"learning_rate_multiplier must be above 0 and at most 10 (got {multiplier}).",
                param,
            )
        out["learning_rate"] = base_learning_rate(method) * multiplier
    return out


def _merged_hyperparameters(data: Mapping[str, Any]) -> tuple[str, object]:
    legacy = data.get("hyperparameters")
    if "method" not in data:
        if not isinstance(legacy, Mapping):
            return "supervised", legacy
        return "supervised", _resolve(dict(legacy), "hyperparameters", "supervised")
    method, hyper = _method_hyperparameters(data["method"])
    from_method = _resolve(hyper, f"method.{method}.hyperparameters", method)
    if legacy is None:
        return method, from_method
    if not isinstance(legacy, Mapping):
        return method, legacy  # the spec's validation names the wrong type
    merged = _resolve(dict(legacy), "hyperparameters", method)
    clash = sorted(k for k in set(merged) & set(from_method) if merged[k] != from_method[k])
    if clash:
        raise _error(
            f"hyperparameters.{clash[0]} disagrees with method's; send it in one place "
            f"(method.{method}.hyperparameters).",
            f"hyperparameters.{clash[0]}",
        )
    return method, {**merged, **from_method}


def parse_metadata(value: object) -> dict[str, str]:
    """OpenAI's metadata rules: at most 16 string pairs, keys ≤ 64 and values ≤ 512 chars."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise _error(
            "metadata must be an object of string keys and values.", "metadata", "invalid_type"
        )
    if len(value) > METADATA_MAX_KEYS:
        raise _error(f"metadata holds at most {METADATA_MAX_KEYS} keys.", "metadata")
    for key, item in value.items():
        if not isinstance(key, str) or not 1 <= len(key) <= METADATA_KEY_CHARS:
            raise _error(f"metadata keys must be 1 to {METADATA_KEY_CHARS} characters.", "metadata")
        if not isinstance(item, str) or len(item) > METADATA_VALUE_CHARS:
            raise _error(
                f"metadata.{key} must be a string of at most {METADATA_VALUE_CHARS} characters.",
                f"metadata.{key}",
            )
    return dict(value)


def native_job_request(data: Mapping[str, Any]) -> dict[str, Any]:
    """``data`` with OpenAI's spellings turned into trainhub's (``method``: the method's type);
    errors name OpenAI's fields."""
    out = {k: v for k, v in data.items() if k not in ("method", "integrations")}
    integrations = data.get("integrations")
    if integrations:  # [] and null are what clients send when they mean none
        raise _error(
            "integrations (e.g. wandb) are not supported; metrics are in the job's events and "
            "its metrics result file.",
            "integrations",
        )
    out["method"], hyper = _merged_hyperparameters(data)
    if out["method"] != "supervised" and (hyper is None or isinstance(hyper, Mapping)):
        hyper = {"learning_rate": base_learning_rate(out["method"]), **(hyper or {})}
    if hyper is not None:
        out["hyperparameters"] = hyper
    return out
