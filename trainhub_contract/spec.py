"""The versioned job spec: the one contract between the control plane and the executor.

The control plane builds a spec (JSON) per attempt; the executor (``python -m gpu_worker run
spec.json``, the GPU node's Celery task, the RunPod handler) parses it with
:func:`parse_job_spec`. The DRF serializers validate user input with :func:`parse_adapter` and
:func:`parse_hyperparameters`, so the API and the executor accept exactly the same values.

The JSON Schemas in :mod:`trainhub_contract.spec_schema` are the single source of field rules (types,
ranges, enums, unknown keys); the parse functions here run them and turn the first violation
into a :class:`SpecError` naming the dotted field path and what is allowed.

Secrets: the spec never carries secret values. ``secrets`` maps a purpose (``hf_token``) to the
*name* of a secret (``HF_TOKEN``) that the executor resolves from its own environment. A value
that happens to look like a real token is still treated as a name, so nothing in a spec (which
is written into provider job inputs and logs) is ever sensitive.

Only the standard library and ``jsonschema`` are imported here: this module runs inside Django
and on GPU machines that have no Django.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from typing import Any

from trainhub_contract.graders import Grader, GraderError, parse_grader
from trainhub_contract.spec_schema import (
    ADAPTER_SCHEMA,
    ADAPTER_TYPES,
    ADAPTER_VALIDATOR,
    ALL_LINEAR,
    CHECKPOINT_SELECTIONS,
    HYPERPARAMETERS_SCHEMA,
    HYPERPARAMETERS_VALIDATOR,
    JOB_SPEC_SCHEMA,
    JOB_SPEC_VALIDATOR,
    MAX_EVAL_TOKENS,
    MAX_RUNTIME_LIMIT_SECONDS,
    METHODS,
    PREEMPTION_NOTICES,
    SPEC_VERSION,
    SUPPORTED_SPEC_VERSIONS,
    SpecError,
    got,
    validate,
)

__all__ = [
    "ADAPTER_SCHEMA",
    "ADAPTER_TYPES",
    "ALL_LINEAR",
    "CHECKPOINT_SELECTIONS",
    "DEFAULT_EVAL_TOKENS",
    "DEFAULT_MAX_RUNTIME_SECONDS",
    "DEFAULT_SEED",
    "DEFAULT_TARGET_MODULES",
    "HYPERPARAMETERS_SCHEMA",
    "JOB_SPEC_SCHEMA",
    "MAX_EVAL_TOKENS",
    "MAX_RUNTIME_LIMIT_SECONDS",
    "METHODS",
    "PREEMPTION_NOTICES",
    "SPEC_VERSION",
    "SUPPORTED_SPEC_VERSIONS",
    "AdapterSpec",
    "DatasetRef",
    "Evals",
    "Hyperparameters",
    "JobSpec",
    "Outputs",
    "ParentAdapter",
    "SpecError",
    "parse_adapter",
    "parse_hyperparameters",
    "parse_job_spec",
    "validate_model_name",
]

# fmt: off
DEFAULT_TARGET_MODULES: tuple[str, ...] = (
    "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
)
# fmt: on
DEFAULT_SEED = 42
DEFAULT_MAX_RUNTIME_SECONDS = 24 * 3600
DEFAULT_EVAL_TOKENS = 64  # greedy answers to eval items stop here


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

    ``packing`` trains without padding: each micro-batch's examples are laid end to end in rows
    of at most ``max_seq_length`` tokens, position ids restarting at every example and attention
    kept inside it (gpu_worker.packing). The same examples make the same steps and the same loss
    as without it; only the padding's compute goes. Where the model cannot keep attention inside
    an example (checked on the model before training), training uses length-grouped batches
    instead and says so. Turn it off to batch exactly as before.
    """

    n_epochs: int = 3
    batch_size: int = 4
    learning_rate: float = 2e-4
    max_seq_length: int = 2048
    gradient_accumulation_steps: int = 1
    warmup_ratio: float = 0.03
    gradient_checkpointing: bool = True
    packing: bool = True
    eval_interval: int = 0  # 0: auto, a tenth of the run (spec_schema's description)
    beta: float = 0.1  # dpo only: the strength of the pull towards the reference model

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in HYPERPARAMETERS_SCHEMA["properties"]}


@dataclass(frozen=True)
class DatasetRef:
    """A dataset the executor downloads from ``url`` and must verify against ``sha256``."""

    url: str
    sha256: str
    format: str  # one of trainhub_contract.dataset_formats.FORMATS

    def to_dict(self) -> dict[str, Any]:
        return {"url": self.url, "sha256": self.sha256, "format": self.format}


@dataclass(frozen=True)
class ParentAdapter:
    """The adapter a job continues (an earlier job's bundle or one of its checkpoints): the
    executor loads its weights into the fresh adapter before training."""

    url: str
    sha256: str

    def to_dict(self) -> dict[str, Any]:
        return {"url": self.url, "sha256": self.sha256}


@dataclass(frozen=True)
class Evals:
    """Items to answer at every saved checkpoint (and before training) and the grader that
    scores the answers (trainhub_contract.graders): a JSONL file in the ``eval`` format."""

    url: str
    sha256: str
    grader: Grader
    grader_json: dict[str, Any]
    max_tokens: int = DEFAULT_EVAL_TOKENS

    @property
    def ref(self) -> DatasetRef:
        """The items as a dataset the executor downloads and checks like the others."""
        return DatasetRef(url=self.url, sha256=self.sha256, format="eval")

    def to_dict(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "sha256": self.sha256,
            "grader": copy.deepcopy(self.grader_json),
            "max_tokens": self.max_tokens,
        }


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
    ``preemption_notice``: whose preemption warning to watch on this machine (``"aws"``: the
    EC2 spot interruption notice, gpu_worker.preemption); None on machines that are not spot.
    ``method``: ``supervised`` or ``dpo`` (``dataset`` is then in the ``preference`` format).
    ``parent_adapter``: the adapter to continue training, None for a fresh one.
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
    preemption_notice: str | None = None
    method: str = "supervised"
    parent_adapter: ParentAdapter | None = None
    evals: Evals | None = None
    checkpoint_selection: str = "last"

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
            # Only when set, so a spec for a machine that is not spot still reads on executors
            # that predate the field.
            **({"preemption_notice": self.preemption_notice} if self.preemption_notice else {}),
            **({"method": self.method} if self.method != "supervised" else {}),
            **({"parent_adapter": self.parent_adapter.to_dict()} if self.parent_adapter else {}),
            **({"evals": self.evals.to_dict()} if self.evals else {}),
            **(
                {"checkpoint_selection": self.checkpoint_selection}
                if self.checkpoint_selection != "last"
                else {}
            ),
        }


# --- parsing --------------------------------------------------------------------------------


def parse_adapter(data: object) -> AdapterSpec:
    """Validate adapter settings; None or {} gives the defaults, missing fields are defaulted.

    Raises SpecError with ``param='adapter.<field>'``.
    """
    data = validate(ADAPTER_VALIDATOR, {} if data is None else data, "adapter")
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
    data = validate(HYPERPARAMETERS_VALIDATOR, {} if data is None else data, "hyperparameters")
    # JSON Schema counts 3.0 as an integer; store it as one so the trainer gets real ints.
    ints = {k for k, s in HYPERPARAMETERS_SCHEMA["properties"].items() if s["type"] == "integer"}
    fields: dict[str, Any] = {k: int(v) if k in ints else v for k, v in data.items()}
    return Hyperparameters(**fields)


_HUB_PART = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,95}$")
_PATH_FORBIDDEN = re.compile(r"[\s\x00-\x1f\x7f]")


def validate_model_name(name: object) -> str:
    """Syntactic check of a base model reference; returns it stripped.

    Accepts a hub id ``owner/name`` (letters, digits, '.', '_', '-'; each part at most 96
    characters, not starting with '-' or '.', no '..') or an absolute local path with no '..'
    component and no whitespace or control characters (it is passed over SSH). Nothing else:
    ``./x``, ``../x`` and ``a/b/c`` are refused, so a relative path never passes as a model.
    A hub id still reads as a relative path to transformers: the executor refuses one that
    exists in its working directory (``backends.loading.model_reference``). Whether the model
    exists is checked by the executor, not here. Raises SpecError(param='model').
    """
    if not isinstance(name, str) or not name.strip():
        raise SpecError(f"model must be a non-empty string (got {got(name)})", "model")
    name = name.strip()
    if name.startswith("/"):
        if ".." in name.split("/") or _PATH_FORBIDDEN.search(name) or len(name) > 4096:
            raise SpecError(
                f"model path {got(name)} must be an absolute path without '..' components, "
                "whitespace or control characters",
                "model",
            )
        return name
    parts = name.split("/")
    if len(parts) != 2 or not all(_HUB_PART.match(p) and ".." not in p for p in parts):
        raise SpecError(
            f"model {got(name)} must be a hub id 'owner/name' (letters, digits, '.', '_', '-'; "
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
                f"version {got(v)} is not supported; this executor supports spec version(s) "
                f"{supported}; upgrade the executor or the control plane so they match",
                "version",
            )
    data = validate(JOB_SPEC_VALIDATOR, data, "")
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
        preemption_notice=data.get("preemption_notice"),
        method=data.get("method", "supervised"),
        parent_adapter=ParentAdapter(**data["parent_adapter"])
        if "parent_adapter" in data
        else None,
        evals=_evals(data["evals"]) if "evals" in data else None,
        checkpoint_selection=data.get("checkpoint_selection", "last"),
    )


def _evals(data: dict[str, Any]) -> Evals:
    try:
        grader = parse_grader(data["grader"])
    except GraderError as exc:
        raise SpecError(f"evals.{exc.param}: {exc.message}", f"evals.{exc.param}") from exc
    return Evals(
        url=data["url"],
        sha256=data["sha256"],
        grader=grader,
        grader_json=copy.deepcopy(data["grader"]),
        max_tokens=int(data.get("max_tokens", DEFAULT_EVAL_TOKENS)),
    )
