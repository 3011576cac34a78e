"""The job spec's field rules as JSON Schemas (draft 2020-12), and the translation of the first
violation into a :class:`SpecError` that names the dotted field path and what is allowed.
``trainhub_contract.spec`` builds the typed spec on top of these."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any, cast

import jsonschema

from trainhub_contract.dataset_formats import FORMATS

SPEC_VERSION: int = 1
SUPPORTED_SPEC_VERSIONS: tuple[int, ...] = (SPEC_VERSION,)
ADAPTER_TYPES = ("lora", "qlora", "dora")
ALL_LINEAR = "all-linear"
# Providers whose preemption warning the executor can watch (gpu_worker.preemption).
PREEMPTION_NOTICES = ("aws",)
# How a job trains: supervised (SFT) or dpo (direct preference optimization).
METHODS = ("supervised", "dpo")
# Which saved checkpoint becomes the job's adapter (gpu_worker.grading).
CHECKPOINT_SELECTIONS = ("last", "best_valid_loss", "best_eval")
MAX_EVAL_TOKENS = 1024
# Signed URLs are issued per attempt with a TTL covering max_runtime; S3 caps presigned URLs at 7 days.
MAX_RUNTIME_LIMIT_SECONDS = 7 * 24 * 3600


class SpecError(ValueError):
    """An invalid spec field.

    ``param`` is the dotted field path (``hyperparameters.learning_rate``, list items as
    ``adapter.target_modules[2]``), or None when the whole document is wrong; ``message`` is
    human text that says what was wrong and what is allowed.
    """

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


# --- schemas (JSON Schema draft 2020-12) ------------------------------------------------------
# Keyword order matters: errors are reported in schema order, so "type" and unknown keys come
# before per-field problems. A "description" is the allowed-values text used in messages.
# fmt: off

_NAME = "^[A-Za-z_][A-Za-z0-9_]*$"
_URL = {"type": "string", "pattern": r"^(https?|file)://\S+$", "maxLength": 16384,
        "description": "a URL starting with http://, https:// or file://"}

ADAPTER_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "type": {"enum": list(ADAPTER_TYPES)},
        "r": {"type": "integer", "minimum": 1, "maximum": 1024},
        "alpha": {"type": "number", "exclusiveMinimum": 0, "maximum": 4096},
        "dropout": {"type": "number", "minimum": 0, "exclusiveMaximum": 1},
        "target_modules": {
            "description": "a non-empty list (at most 64) of unique module names such as "
                           '"q_proj", or the string "all-linear"',
            "oneOf": [
                {"type": "array", "minItems": 1, "maxItems": 64, "uniqueItems": True,
                 "items": {"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_.]*$",
                           "maxLength": 256,
                           "description": "a module name of letters, digits, '_' and '.'"}},
                {"const": ALL_LINEAR},
            ],
        },
    },
}

HYPERPARAMETERS_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "n_epochs": {"type": "integer", "minimum": 1, "maximum": 100},
        "batch_size": {"type": "integer", "minimum": 1, "maximum": 1024},
        "learning_rate": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
        "max_seq_length": {"type": "integer", "minimum": 32, "maximum": 131072},
        "gradient_accumulation_steps": {"type": "integer", "minimum": 1, "maximum": 1024},
        "warmup_ratio": {"type": "number", "minimum": 0, "maximum": 0.5},
        "gradient_checkpointing": {"type": "boolean"},
        "packing": {
            "type": "boolean",
            "default": True,
            "description": "train without padding: each batch's examples share rows, position "
            "ids restart per example and attention stays inside each (gpu_worker.packing); "
            "false pads each batch to its longest example",
        },
        "eval_interval": {
            "type": "integer",
            "minimum": 0,
            "maximum": 1000000,
            "default": 0,
            "description": "with a validation file: the steps between two validation passes "
            "(valid_loss, valid_mean_token_accuracy) on a sample of at most 64 of its "
            "examples; 0 (auto) evaluates every tenth of the run. The whole file is "
            "evaluated once at the end (full_valid_loss, full_valid_mean_token_accuracy)",
        },
        "beta": {
            "type": "number",
            "exclusiveMinimum": 0,
            "maximum": 2,
            "default": 0.1,
            "description": "dpo only: how far the trained model may move from the reference "
            "(the model the job starts from); a number > 0 and <= 2, higher stays closer",
        },
    },
}

_DATASET_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["url", "sha256", "format"],
    "properties": {
        "url": _URL,
        "sha256": {"type": "string", "pattern": "^[0-9a-f]{64}$",
                   "description": "64 lowercase hexadecimal characters"},
        "format": {"enum": list(FORMATS)},
    },
}

JOB_SPEC_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "additionalProperties": False,
    "required": ["version", "job_id", "attempt", "model", "dataset", "outputs"],
    "properties": {
        "version": {"type": "integer", "enum": list(SUPPORTED_SPEC_VERSIONS)},
        "job_id": {"type": "string", "pattern": "^ftjob-[A-Za-z0-9_-]+$", "maxLength": 128,
                   "description": "a job id starting with 'ftjob-'"},
        "attempt": {"type": "integer", "minimum": 1},
        "model": {"type": "string", "maxLength": 4096},  # the rest: validate_model_name
        "dataset": _DATASET_SCHEMA,
        # Object-only keywords are ignored for null, so one schema serves "dataset or null".
        "validation_dataset": {**_DATASET_SCHEMA, "type": ["object", "null"]},
        "outputs": {
            "type": "object",
            "additionalProperties": False,
            "required": ["artifact_url", "checkpoint_url"],
            "properties": {
                "artifact_url": _URL,
                "checkpoint_url": _URL,
                "resume_url": {**_URL, "type": ["string", "null"],
                               "description": f"{_URL['description']}, or null"},
            },
        },
        "adapter": {**ADAPTER_SCHEMA, "type": ["object", "null"]},
        "hyperparameters": {**HYPERPARAMETERS_SCHEMA, "type": ["object", "null"]},
        "seed": {"type": "integer", "minimum": 0, "maximum": 2**31 - 1},
        "max_runtime_seconds": {"type": "integer", "minimum": 60,
                                "maximum": MAX_RUNTIME_LIMIT_SECONDS},
        "secrets": {
            "type": "object",
            "propertyNames": {"pattern": _NAME, "maxLength": 128,
                              "description": "a name of letters, digits and '_'"},
            "additionalProperties": {
                "type": "string", "pattern": _NAME, "maxLength": 128,
                "description": "the NAME of a secret (letters, digits and '_'), never its value",
            },
        },
        "report": {"type": "object"},  # sink config, read by gpu_worker.report
        # Optional and added without a version bump: a spec without it reads as before, and
        # the control plane writes it only for attempts on spot machines.
        # Optional too, written only when they differ from what an older executor did.
        "method": {
            "enum": list(METHODS),
            "description": '"supervised" (default) or "dpo" (a preference dataset)',
        },
        "parent_adapter": {
            "type": "object",
            "additionalProperties": False,
            "required": ["url", "sha256"],
            "properties": {
                "url": _URL,
                "sha256": {"type": "string", "pattern": "^[0-9a-f]{64}$",
                           "description": "64 lowercase hexadecimal characters"},
            },
            "description": "the adapter the job continues (a bundle or a checkpoint tar)",
        },
        "evals": {
            "type": "object",
            "additionalProperties": False,
            "required": ["url", "sha256", "grader"],
            "properties": {
                "url": _URL,
                "sha256": {"type": "string", "pattern": "^[0-9a-f]{64}$",
                           "description": "64 lowercase hexadecimal characters"},
                "grader": {"type": "object"},  # trainhub_contract.graders.parse_grader checks it
                "max_tokens": {"type": "integer", "minimum": 1, "maximum": MAX_EVAL_TOKENS},
            },
            "description": "eval items (the eval format) and the grader that scores answers",
        },
        "checkpoint_selection": {"enum": list(CHECKPOINT_SELECTIONS)},
        "preemption_notice": {
            "enum": [*PREEMPTION_NOTICES, None],
            "description": '"aws" (watch the EC2 spot interruption notice) or null',
        },
    },
}

_TYPE_WORDS = {"integer": "an integer", "number": "a number", "string": "a string",
               "object": "an object", "array": "a list", "null": "null", "boolean": "a boolean"}
# fmt: on

# NaN and infinities pass every range check (comparisons with NaN are false), so "number" means
# a finite number here. Booleans are already not integers/numbers in jsonschema's type checker.
_TYPE_CHECKER = jsonschema.Draft202012Validator.TYPE_CHECKER.redefine(
    "number",
    lambda _checker, v: isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v),
)
# types-jsonschema leaves validators.extend unannotated.
_Validator = jsonschema.validators.extend(  # type: ignore[no-untyped-call]
    jsonschema.Draft202012Validator, type_checker=_TYPE_CHECKER
)
ADAPTER_VALIDATOR = _Validator(ADAPTER_SCHEMA)
HYPERPARAMETERS_VALIDATOR = _Validator(HYPERPARAMETERS_SCHEMA)
JOB_SPEC_VALIDATOR = _Validator(JOB_SPEC_SCHEMA)


def got(value: object) -> str:
    text = json.dumps(value, default=repr) if not isinstance(value, float) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _range(schema: Mapping[str, Any]) -> str:
    parts = [
        f"{op} {schema[kw]}"
        for kw, op in (
            ("minimum", ">="),
            ("exclusiveMinimum", ">"),
            ("maximum", "<="),
            ("exclusiveMaximum", "<"),
        )
        if kw in schema
    ]
    return " and ".join(parts)


def _describe(schema: Mapping[str, Any]) -> str:
    """What a field accepts, in words, derived from its schema."""
    if "description" in schema:
        return str(schema["description"])
    if "enum" in schema:
        return "one of " + ", ".join(json.dumps(v) for v in schema["enum"])
    types = schema.get("type", [])
    types = [types] if isinstance(types, str) else types
    text = " or ".join(_TYPE_WORDS[t] for t in types)
    return f"{text} {_range(schema)}".strip()


def _path(prefix: str, parts: Any) -> str:
    out = prefix
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


def _to_spec_error(err: jsonschema.ValidationError, prefix: str) -> SpecError:
    param: str | None = _path(prefix, err.absolute_path) or None
    kind = err.validator
    # Every schema here is an object; the instance is whatever JSON the caller sent.
    schema: Mapping[str, Any] = err.schema if isinstance(err.schema, Mapping) else {}
    value: Any = err.instance
    where = param or "the spec"
    if kind == "additionalProperties" and schema.get("additionalProperties") is False:
        known = list(schema.get("properties", {}))
        extra = next(k for k in value if k not in known)
        param = _path(param or "", [extra])
        return SpecError(f"{param} is not a known field; known fields: {', '.join(known)}", param)
    if kind == "required":
        missing = next(k for k in schema["required"] if k not in value)
        param = _path(param or "", [missing])
        return SpecError(f"{param} is required", param)
    if "propertyNames" in err.relative_schema_path:
        param = _path(param or "", [value])
        return SpecError(
            f"{param} is not a valid key: {where} keys must be {_describe(schema)}", param
        )
    if kind == "oneOf":
        # A list that fails is more helpful reported item by item than as "not one of".
        branch = [
            e for e in err.context if isinstance(value, list) and e.relative_schema_path[0] == 0
        ]
        if branch:
            return _to_spec_error(branch[0], prefix)
    if where == "secrets" or where.startswith("secrets."):
        # Never echo a secrets value: a user who pasted a real token must not see it in logs.
        return SpecError(f"{where} must be {_describe(schema)}", param)
    if kind in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        return SpecError(f"{where} must be {_range(schema)} (got {got(value)})", param)
    if kind == "minItems":
        return SpecError(f"{where} must not be empty", param)
    if kind == "maxItems":
        return SpecError(
            f"{where} must have at most {schema['maxItems']} items (got {len(value)})", param
        )
    if kind == "uniqueItems":
        return SpecError(f"{where} must not contain duplicates (got {got(value)})", param)
    if kind == "maxLength":
        return SpecError(f"{where} must be at most {schema['maxLength']} characters long", param)
    return SpecError(f"{where} must be {_describe(schema)} (got {got(value)})", param)


def validate(validator: Any, data: object, prefix: str) -> dict[str, Any]:
    for err in validator.iter_errors(data):
        raise _to_spec_error(err, prefix)
    return cast(dict[str, Any], data)  # the schemas require an object
