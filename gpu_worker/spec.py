"""The versioned job spec: the one contract between the control plane and the executor.

The control plane builds a spec (JSON) per attempt; the executor (``python -m gpu_worker run
spec.json``, the GPU node's Celery task, the RunPod handler) parses it with
:func:`parse_job_spec`. The DRF serializers validate user input with :func:`parse_adapter` and
:func:`parse_hyperparameters`, so the API and the executor accept exactly the same values.

The JSON Schemas below are the single source of field rules (types, ranges, enums, unknown
keys); the parse functions run them and turn the first violation into a :class:`SpecError`
naming the dotted field path and what is allowed.

Secrets: the spec never carries secret values. ``secrets`` maps a purpose (``hf_token``) to the
*name* of a secret (``HF_TOKEN``) that the executor resolves from its own environment. A value
that happens to look like a real token is still treated as a name, so nothing in a spec (which
is written into provider job inputs and logs) is ever sensitive.

Only the standard library and ``jsonschema`` are imported here: this module runs inside Django
and on GPU machines that have no Django.
"""

from __future__ import annotations

import copy
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import jsonschema

from gpu_worker.datasets import FORMATS

SPEC_VERSION: int = 1
SUPPORTED_SPEC_VERSIONS: tuple[int, ...] = (SPEC_VERSION,)
ADAPTER_TYPES = ("lora", "qlora", "dora")
# fmt: off
DEFAULT_TARGET_MODULES: tuple[str, ...] = (
    "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
)
# fmt: on
ALL_LINEAR = "all-linear"
# Signed URLs are issued per attempt with a TTL covering max_runtime; S3 caps presigned URLs at 7 days.
MAX_RUNTIME_LIMIT_SECONDS = 7 * 24 * 3600
DEFAULT_SEED = 42
DEFAULT_MAX_RUNTIME_SECONDS = 24 * 3600


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
_Validator = jsonschema.validators.extend(
    jsonschema.Draft202012Validator, type_checker=_TYPE_CHECKER
)
_ADAPTER_VALIDATOR = _Validator(ADAPTER_SCHEMA)
_HYPERPARAMETERS_VALIDATOR = _Validator(HYPERPARAMETERS_SCHEMA)
_JOB_SPEC_VALIDATOR = _Validator(JOB_SPEC_SCHEMA)


def _got(value: object) -> str:
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
    kind, schema, value = err.validator, err.schema, err.instance
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
        return SpecError(f"{where} must be {_range(schema)} (got {_got(value)})", param)
    if kind == "minItems":
        return SpecError(f"{where} must not be empty", param)
    if kind == "maxItems":
        return SpecError(
            f"{where} must have at most {schema['maxItems']} items (got {len(value)})", param
        )
    if kind == "uniqueItems":
        return SpecError(f"{where} must not contain duplicates (got {_got(value)})", param)
    if kind == "maxLength":
        return SpecError(f"{where} must be at most {schema['maxLength']} characters long", param)
    return SpecError(f"{where} must be {_describe(schema)} (got {_got(value)})", param)


def _validate(validator: Any, data: object, prefix: str) -> dict[str, Any]:
    for err in validator.iter_errors(data):
        raise _to_spec_error(err, prefix)
    return cast(dict[str, Any], data)  # the schemas require an object


# --- dataclasses ----------------------------------------------------------------------------


@dataclass(frozen=True)
class AdapterSpec:
    """PEFT adapter settings. ``target_modules == ("all-linear",)`` means every linear layer."""

    type: str = "lora"
    r: int = 16
    alpha: float = 32
    dropout: float = 0.05
    target_modules: tuple[str, ...] = DEFAULT_TARGET_MODULES

    def to_dict(self) -> dict[str, Any]:
        modules: str | list[str] = (
            ALL_LINEAR if self.target_modules == (ALL_LINEAR,) else list(self.target_modules)
        )
        return {
            "type": self.type,
            "r": self.r,
            "alpha": self.alpha,
            "dropout": self.dropout,
            "target_modules": modules,
        }


@dataclass(frozen=True)
class Hyperparameters:
    """Training loop settings; the effective batch is batch_size * gradient_accumulation_steps.

    ``gradient_checkpointing`` recomputes activations in the backward pass: it is what lets long
    sequences and large batches fit, at roughly a third more compute per step. Both backends
    honour it (Unsloth's offloaded variant, transformers' otherwise); turn it off for speed when
    the batch fits without it (docs/BENCHMARKS.md, training throughput).
    """

    n_epochs: int = 3
    batch_size: int = 4
    learning_rate: float = 2e-4
    max_seq_length: int = 2048
    gradient_accumulation_steps: int = 1
    warmup_ratio: float = 0.03
    gradient_checkpointing: bool = True

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in HYPERPARAMETERS_SCHEMA["properties"]}


@dataclass(frozen=True)
class DatasetRef:
    """A dataset the executor downloads from ``url`` and must verify against ``sha256``."""

    url: str
    sha256: str
    format: str  # one of gpu_worker.datasets.FORMATS

    def to_dict(self) -> dict[str, Any]:
        return {"url": self.url, "sha256": self.sha256, "format": self.format}


@dataclass(frozen=True)
class Outputs:
    """Signed URLs for this attempt: the artifact PUT, the (overwritten) checkpoint slot, and
    an optional checkpoint to resume from."""

    artifact_url: str
    checkpoint_url: str
    resume_url: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "artifact_url": self.artifact_url,
            "checkpoint_url": self.checkpoint_url,
            "resume_url": self.resume_url,
        }


@dataclass(frozen=True)
class JobSpec:
    """Everything one attempt needs to run; built by the control plane at dispatch time.

    ``secrets`` maps a purpose to a secret *name* resolved on the executor, never a value.
    ``report`` configures the event sink (free-form JSON object, read by gpu_worker.report).
    """

    version: int
    job_id: str
    attempt: int
    model: str
    dataset: DatasetRef
    validation_dataset: DatasetRef | None
    outputs: Outputs
    adapter: AdapterSpec = field(default_factory=AdapterSpec)
    hyperparameters: Hyperparameters = field(default_factory=Hyperparameters)
    seed: int = DEFAULT_SEED
    max_runtime_seconds: int = DEFAULT_MAX_RUNTIME_SECONDS
    secrets: dict[str, str] = field(default_factory=dict)
    report: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict that :func:`parse_job_spec` turns back into an equal spec."""
        return {
            "version": self.version,
            "job_id": self.job_id,
            "attempt": self.attempt,
            "model": self.model,
            "dataset": self.dataset.to_dict(),
            "validation_dataset": self.validation_dataset.to_dict()
            if self.validation_dataset
            else None,
            "outputs": self.outputs.to_dict(),
            "adapter": self.adapter.to_dict(),
            "hyperparameters": self.hyperparameters.to_dict(),
            "seed": self.seed,
            "max_runtime_seconds": self.max_runtime_seconds,
            "secrets": dict(self.secrets),
            "report": copy.deepcopy(self.report),
        }


# --- parsing --------------------------------------------------------------------------------


def parse_adapter(data: object) -> AdapterSpec:
    """Validate adapter settings; None or {} gives the defaults, missing fields are defaulted.

    Raises SpecError with ``param='adapter.<field>'``.
    """
    data = _validate(_ADAPTER_VALIDATOR, {} if data is None else data, "adapter")
    d = AdapterSpec()
    modules = data.get("target_modules", d.target_modules)
    return AdapterSpec(
        type=data.get("type", d.type),
        r=int(data.get("r", d.r)),
        alpha=data.get("alpha", d.alpha),
        dropout=data.get("dropout", d.dropout),
        target_modules=(ALL_LINEAR,) if modules == ALL_LINEAR else tuple(modules),
    )


def parse_hyperparameters(data: object) -> Hyperparameters:
    """Validate training hyperparameters; same defaulting as :func:`parse_adapter`.

    Raises SpecError with ``param='hyperparameters.<field>'``.
    """
    data = _validate(_HYPERPARAMETERS_VALIDATOR, {} if data is None else data, "hyperparameters")
    # JSON Schema counts 3.0 as an integer; store it as one so the trainer gets real ints.
    ints = {k for k, s in HYPERPARAMETERS_SCHEMA["properties"].items() if s["type"] == "integer"}
    return Hyperparameters(**{k: int(v) if k in ints else v for k, v in data.items()})


_HUB_PART = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,95}$")
_PATH_FORBIDDEN = re.compile(r"[\s\x00-\x1f\x7f]")


def validate_model_name(name: object) -> str:
    """Syntactic check of a base model reference; returns it stripped.

    Accepts a hub id ``owner/name`` (letters, digits, '.', '_', '-'; each part at most 96
    characters, not starting with '-' or '.', no '..') or an absolute local path with no '..'
    component and no whitespace or control characters (it is passed over SSH). Whether the
    model exists is checked by the executor, not here. Raises SpecError(param='model').
    """
    if not isinstance(name, str) or not name.strip():
        raise SpecError(f"model must be a non-empty string (got {_got(name)})", "model")
    name = name.strip()
    if name.startswith("/"):
        if ".." in name.split("/") or _PATH_FORBIDDEN.search(name) or len(name) > 4096:
            raise SpecError(
                f"model path {_got(name)} must be an absolute path without '..' components, "
                "whitespace or control characters",
                "model",
            )
        return name
    parts = name.split("/")
    if len(parts) != 2 or not all(_HUB_PART.match(p) and ".." not in p for p in parts):
        raise SpecError(
            f"model {_got(name)} must be a hub id 'owner/name' (letters, digits, '.', '_', '-'; "
            "each part at most 96 characters, not starting with '.' or '-', no '..') "
            "or an absolute local path",
            "model",
        )
    return name


def _dataset(data: dict[str, Any]) -> DatasetRef:
    return DatasetRef(url=data["url"], sha256=data["sha256"], format=data["format"])


def parse_job_spec(data: object) -> JobSpec:
    """Validate a whole job spec (the parsed JSON document) and build a :class:`JobSpec`.

    Checked first: ``version`` (a spec from a newer control plane gets a clear "upgrade the
    executor" message rather than a complaint about fields this executor does not know).
    Raises SpecError whose ``param`` is the dotted path of the first invalid field.
    """
    if isinstance(data, dict) and "version" in data:
        v = data["version"]
        if isinstance(v, bool) or not isinstance(v, int) or v not in SUPPORTED_SPEC_VERSIONS:
            supported = ", ".join(map(str, SUPPORTED_SPEC_VERSIONS))
            raise SpecError(
                f"version {_got(v)} is not supported; this executor supports spec version(s) "
                f"{supported}; upgrade the executor or the control plane so they match",
                "version",
            )
    data = _validate(_JOB_SPEC_VALIDATOR, data, "")
    validation = data.get("validation_dataset")
    out = data["outputs"]
    return JobSpec(
        version=int(data["version"]),
        job_id=data["job_id"],
        attempt=int(data["attempt"]),
        model=validate_model_name(data["model"]),
        dataset=_dataset(data["dataset"]),
        validation_dataset=_dataset(validation) if validation is not None else None,
        outputs=Outputs(out["artifact_url"], out["checkpoint_url"], out.get("resume_url")),
        adapter=parse_adapter(data.get("adapter")),
        hyperparameters=parse_hyperparameters(data.get("hyperparameters")),
        seed=int(data.get("seed", DEFAULT_SEED)),
        max_runtime_seconds=int(data.get("max_runtime_seconds", DEFAULT_MAX_RUNTIME_SECONDS)),
        secrets=dict(data.get("secrets", {})),
        report=copy.deepcopy(data.get("report", {})),
    )
