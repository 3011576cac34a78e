"""The job spec: defaults, round trip, and one actionable error per bad field."""

from __future__ import annotations

import copy
import json
from typing import Any

import jsonschema
import pytest

from trainhub_contract import spec
from trainhub_contract.spec import (
    DEFAULT_TARGET_MODULES,
    AdapterSpec,
    Hyperparameters,
    JobSpec,
    SpecError,
    parse_adapter,
    parse_hyperparameters,
    parse_job_spec,
    validate_model_name,
)

SHA = "a" * 64


def minimal_spec() -> dict[str, Any]:
    return {
        "version": spec.SPEC_VERSION,
        "job_id": "ftjob-abc123",
        "attempt": 1,
        "model": "HuggingFaceTB/SmolLM2-135M",
        "dataset": {
            "url": "https://s3.example/train.jsonl?sig=x",
            "sha256": SHA,
            "format": "messages",
        },
        "outputs": {
            "artifact_url": "https://s3.example/artifact.tar?sig=y",
            "checkpoint_url": "https://s3.example/ckpt.tar?sig=z",
        },
    }


def full_spec() -> dict[str, Any]:
    data = minimal_spec()
    data.update(
        validation_dataset={
            "url": "file:///data/val.jsonl",
            "sha256": "0" * 64,
            "format": "messages",
        },
        adapter={
            "type": "qlora",
            "r": 8,
            "alpha": 16,
            "dropout": 0.1,
            "target_modules": "all-linear",
        },
        hyperparameters={"n_epochs": 2, "learning_rate": 1e-4, "warmup_ratio": 0.0},
        seed=7,
        max_runtime_seconds=3600,
        secrets={"hf_token": "HF_TOKEN"},
        report={"sink": "celery", "queue": "default", "nested": {"a": [1, 2]}},
    )
    data["outputs"]["resume_url"] = "https://s3.example/ckpt.tar?sig=r"
    return data


def test_schemas_are_valid_draft_2020_12() -> None:
    for schema in (spec.ADAPTER_SCHEMA, spec.HYPERPARAMETERS_SCHEMA, spec.JOB_SPEC_SCHEMA):
        jsonschema.Draft202012Validator.check_schema(schema)


def test_defaults() -> None:
    assert parse_adapter(None) == parse_adapter({}) == AdapterSpec()
    assert AdapterSpec() == AdapterSpec("lora", 16, 32, 0.05, DEFAULT_TARGET_MODULES)
    assert parse_hyperparameters(None) == parse_hyperparameters({}) == Hyperparameters()
    assert Hyperparameters() == Hyperparameters(3, 4, 2e-4, 2048, 1, 0.03, True)
    assert parse_hyperparameters({"gradient_checkpointing": False}).gradient_checkpointing is False
    assert Hyperparameters().packing is True
    assert parse_hyperparameters({"packing": False}).packing is False
    assert parse_adapter({"r": 64}) == AdapterSpec(r=64)
    assert parse_hyperparameters({"batch_size": 8}).n_epochs == 3

    job = parse_job_spec(minimal_spec())
    assert job.adapter == AdapterSpec()
    assert job.hyperparameters == Hyperparameters()
    assert job.validation_dataset is None
    assert job.outputs.resume_url is None
    assert job.secrets == {} and job.report == {}
    assert job.seed == spec.DEFAULT_SEED
    assert job.max_runtime_seconds == spec.DEFAULT_MAX_RUNTIME_SECONDS


def test_all_linear_and_integral_floats() -> None:
    assert parse_adapter({"target_modules": "all-linear"}).target_modules == ("all-linear",)
    assert parse_adapter({"target_modules": ["q_proj", "v_proj"]}).target_modules == (
        "q_proj",
        "v_proj",
    )
    hp = parse_hyperparameters({"n_epochs": 3.0})
    assert hp.n_epochs == 3 and isinstance(hp.n_epochs, int)


@pytest.mark.parametrize("make", [minimal_spec, full_spec])
def test_round_trip(make: Any) -> None:
    job = parse_job_spec(make())
    wire = json.loads(json.dumps(job.to_dict()))
    again = parse_job_spec(wire)
    assert again == job
    assert again.to_dict() == job.to_dict()


def test_parse_does_not_alias_input() -> None:
    data = full_spec()
    job = parse_job_spec(data)
    data["report"]["nested"]["a"].append(3)
    data["secrets"]["other"] = "X"
    assert job.report["nested"] == {"a": [1, 2]}
    assert "other" not in job.secrets


def test_jobspec_constructible_with_keywords() -> None:
    job = parse_job_spec(minimal_spec())
    built = JobSpec(
        version=1, job_id=job.job_id, attempt=1, model=job.model, dataset=job.dataset,
        validation_dataset=None, outputs=job.outputs,
    )  # fmt: skip
    assert built == job


BAD: list[tuple[str, Any, str]] = [
    # (dotted path to set, bad value, expected param)
    ("adapter.type", "prefix", "adapter.type"),
    ("adapter.r", 0, "adapter.r"),
    ("adapter.r", 1025, "adapter.r"),
    ("adapter.r", 8.5, "adapter.r"),
    ("adapter.r", True, "adapter.r"),
    ("adapter.alpha", 0, "adapter.alpha"),
    ("adapter.alpha", 4097, "adapter.alpha"),
    ("adapter.alpha", "16", "adapter.alpha"),
    ("adapter.dropout", 1, "adapter.dropout"),
    ("adapter.dropout", -0.1, "adapter.dropout"),
    ("adapter.dropout", float("nan"), "adapter.dropout"),
    ("adapter.target_modules", [], "adapter.target_modules"),
    ("adapter.target_modules", "q_proj", "adapter.target_modules"),
    ("adapter.target_modules", ["q_proj", "q_proj"], "adapter.target_modules"),
    ("adapter.target_modules", ["q_proj", "bad-name"], "adapter.target_modules[1]"),
    ("adapter.target_modules", ["q_proj", 3], "adapter.target_modules[1]"),
    ("adapter.target_modules", [f"m{i}" for i in range(65)], "adapter.target_modules"),
    ("hyperparameters.n_epochs", 0, "hyperparameters.n_epochs"),
    ("hyperparameters.n_epochs", 101, "hyperparameters.n_epochs"),
    ("hyperparameters.n_epochs", True, "hyperparameters.n_epochs"),
    ("hyperparameters.batch_size", 2000, "hyperparameters.batch_size"),
    ("hyperparameters.learning_rate", -1, "hyperparameters.learning_rate"),
    ("hyperparameters.learning_rate", 0, "hyperparameters.learning_rate"),
    ("hyperparameters.learning_rate", 1.5, "hyperparameters.learning_rate"),
    ("hyperparameters.learning_rate", float("inf"), "hyperparameters.learning_rate"),
    ("hyperparameters.max_seq_length", 16, "hyperparameters.max_seq_length"),
    ("hyperparameters.packing", "yes", "hyperparameters.packing"),
    ("hyperparameters.packing", 1, "hyperparameters.packing"),
    ("hyperparameters.max_seq_length", 131073, "hyperparameters.max_seq_length"),
    (
        "hyperparameters.gradient_accumulation_steps",
        0,
        "hyperparameters.gradient_accumulation_steps",
    ),
    ("hyperparameters.warmup_ratio", 0.6, "hyperparameters.warmup_ratio"),
    ("hyperparameters.gradient_checkpointing", "yes", "hyperparameters.gradient_checkpointing"),
    ("hyperparameters.gradient_checkpointing", 1, "hyperparameters.gradient_checkpointing"),
    ("seed", -1, "seed"),
    ("seed", 2**31, "seed"),
    ("max_runtime_seconds", 59, "max_runtime_seconds"),
    ("max_runtime_seconds", 7 * 24 * 3600 + 1, "max_runtime_seconds"),
    ("attempt", 0, "attempt"),
    ("attempt", False, "attempt"),
    ("job_id", "job-1", "job_id"),
    ("job_id", 12, "job_id"),
    ("dataset.sha256", "A" * 64, "dataset.sha256"),
    ("dataset.sha256", "a" * 63, "dataset.sha256"),
    ("dataset.url", "s3://bucket/key", "dataset.url"),
    ("dataset.url", "/local/file.jsonl", "dataset.url"),
    ("dataset.format", "csv", "dataset.format"),
    ("dataset", "https://x/y", "dataset"),
    ("validation_dataset", {"url": "https://x/y", "format": "text"}, "validation_dataset.sha256"),
    ("outputs.artifact_url", "ftp://x/y", "outputs.artifact_url"),
    ("outputs.resume_url", 5, "outputs.resume_url"),
    ("secrets", {"hf-token": "HF_TOKEN"}, "secrets.hf-token"),
    ("secrets", {"hf_token": "hf-abc 123"}, "secrets.hf_token"),
    ("secrets", {"hf_token": 1}, "secrets.hf_token"),
    ("report", [], "report"),
    ("adapter", "lora", "adapter"),
    ("model", "../etc/passwd", "model"),
    ("model", "", "model"),
]


def _set(data: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    for key in parents:
        data = data.setdefault(key, {})
    data[last] = value


@pytest.mark.parametrize(
    ("path", "value", "param"), BAD, ids=[f"{p}={v!r}"[:60] for p, v, _ in BAD]
)
def test_bad_values_name_the_field(path: str, value: Any, param: str) -> None:
    data = minimal_spec()
    _set(data, path, value)
    with pytest.raises(SpecError) as exc:
        parse_job_spec(data)
    assert exc.value.param == param
    assert param.split("[")[0] in exc.value.message
    assert str(exc.value) == exc.value.message


def test_range_message_says_what_is_allowed() -> None:
    with pytest.raises(SpecError) as exc:
        parse_hyperparameters({"learning_rate": -1})
    assert exc.value.param == "hyperparameters.learning_rate"
    assert exc.value.message == "hyperparameters.learning_rate must be > 0 and <= 1 (got -1)"


def test_bool_is_not_an_int() -> None:
    with pytest.raises(SpecError) as exc:
        parse_hyperparameters({"n_epochs": True})
    assert exc.value.param == "hyperparameters.n_epochs"
    assert "must be an integer >= 1 and <= 100 (got true)" in exc.value.message


def test_missing_required_field() -> None:
    data = minimal_spec()
    del data["outputs"]["checkpoint_url"]
    with pytest.raises(SpecError) as exc:
        parse_job_spec(data)
    assert exc.value.param == "outputs.checkpoint_url"
    assert exc.value.message == "outputs.checkpoint_url is required"


@pytest.mark.parametrize(
    ("parse", "data", "param", "known"),
    [
        (parse_adapter, {"rank": 8}, "adapter.rank", "type, r, alpha, dropout, target_modules"),
        (parse_hyperparameters, {"epochs": 1}, "hyperparameters.epochs", "n_epochs, batch_size"),
    ],
)
def test_unknown_keys(parse: Any, data: dict[str, Any], param: str, known: str) -> None:
    with pytest.raises(SpecError) as exc:
        parse(data)
    assert exc.value.param == param
    assert exc.value.message.startswith(f"{param} is not a known field; known fields: {known}")


def test_unknown_top_level_and_nested_keys() -> None:
    data = minimal_spec()
    data["priority"] = 1
    with pytest.raises(SpecError) as exc:
        parse_job_spec(data)
    assert exc.value.param == "priority"
    data = minimal_spec()
    data["adapter"] = {"rank": 8}
    with pytest.raises(SpecError) as exc:
        parse_job_spec(data)
    assert exc.value.message == (
        "adapter.rank is not a known field; known fields: type, r, alpha, dropout, target_modules"
    )


@pytest.mark.parametrize("version", [0, 2, "1", True, None])
def test_version_mismatch(version: Any) -> None:
    data = minimal_spec()
    data["version"] = version
    with pytest.raises(SpecError) as exc:
        parse_job_spec(data)
    assert exc.value.param == "version"
    assert "supports spec version(s) 1" in exc.value.message


def test_version_checked_before_unknown_fields() -> None:
    data = minimal_spec()
    data.update(version=2, new_field_from_the_future=True)
    with pytest.raises(SpecError) as exc:
        parse_job_spec(data)
    assert exc.value.param == "version"


@pytest.mark.parametrize("data", [None, [], "spec", 3])
def test_not_an_object(data: Any) -> None:
    with pytest.raises(SpecError) as exc:
        parse_job_spec(data)
    assert exc.value.param is None
    assert "must be an object" in exc.value.message


def test_secret_values_are_never_echoed() -> None:
    data = minimal_spec()
    data["secrets"] = {"hf_token": "hf_realLooking-Token value"}
    with pytest.raises(SpecError) as exc:
        parse_job_spec(data)
    assert "realLooking" not in exc.value.message
    # A value shaped like a token is still just a name: accepted, never resolved here.
    data["secrets"] = {"hf_token": "hf_AbCdEf0123456789"}
    assert parse_job_spec(data).secrets == {"hf_token": "hf_AbCdEf0123456789"}


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("meta-llama/Llama-3.1-8B", "meta-llama/Llama-3.1-8B"),
        ("  Qwen/Qwen2.5-0.5B-Instruct\n", "Qwen/Qwen2.5-0.5B-Instruct"),
        ("unsloth/llama_3.2_1b", "unsloth/llama_3.2_1b"),
        ("/models/tiny-llama", "/models/tiny-llama"),
        ("/var/lib/trainhub/models/m.v2/", "/var/lib/trainhub/models/m.v2/"),
        ("o/" + "n" * 96, "o/" + "n" * 96),
    ],
)
def test_model_name_accepted(name: str, expected: str) -> None:
    assert validate_model_name(name) == expected


@pytest.mark.parametrize(
    "name",
    [
        "", "   ", None, 42, "gpt2", "a/b/c", "/models/../etc/passwd", "../models/x",
        "owner/../x", "owner/..", "owner/na..me", "owner /name", "owner/my model",
        "/models/my model", "/models/x\x00", "-owner/name", "owner/.name", "owner/-name",
        "owner/", "owner/name!", "o/" + "n" * 97, "models/x\\..\\y", "relative/../path",
        "./x", "./owner/name", "../x/model", ".", "..", "~/models/x", "owner/name/",
    ],
)  # fmt: skip
def test_model_name_rejected(name: Any) -> None:
    with pytest.raises(SpecError) as exc:
        validate_model_name(name)
    assert exc.value.param == "model"
    assert "model" in exc.value.message


def test_model_checked_in_job_spec() -> None:
    data = minimal_spec()
    data["model"] = " owner/name "
    assert parse_job_spec(data).model == "owner/name"
    data["model"] = "owner/../x"
    with pytest.raises(SpecError) as exc:
        parse_job_spec(data)
    assert exc.value.param == "model"


def test_schema_constants_match_python_defaults() -> None:
    # The dataclass defaults must themselves be valid (a default outside the schema would be
    # rejected on the round trip).
    defaults = copy.deepcopy(parse_job_spec(minimal_spec()).to_dict())
    assert parse_job_spec(defaults).to_dict() == defaults
    assert spec.MAX_RUNTIME_LIMIT_SECONDS == 7 * 24 * 3600
