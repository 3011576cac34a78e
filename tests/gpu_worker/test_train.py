"""The real executor on the tiny model: every adapter type and every dataset format trains, the
loss falls, the bundle verifies, and the adapter reloads to the same logits."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path
from typing import Any

import pytest

from gpu_worker.checkpoints import file_sha256
from tests.gpu_worker.conftest import spec_dict
from trainhub_contract.bundle import MANIFEST, verify_bundle

PROBE = "<|im_start|>user\nWhat colour is owl number 3?<|im_end|>\n<|im_start|>assistant\n"
# The same weights in the same order give the same logits; measured 0.0 for all three (QLoRA
# reloads onto a base quantized the same way).
TOLERANCE = 1e-5


class LogitsProbe:
    """A TrainerCallback that records the trained model's logits on PROBE when training ends."""

    def __init__(self, tokenizer: Any) -> None:
        self.ids = tokenizer(PROBE, return_tensors="pt")["input_ids"]
        self.logits: Any = None

    def __getattr__(self, name: str) -> Any:  # every other TrainerCallback hook: no-op
        if name.startswith("on_"):
            return lambda *a, **k: None
        raise AttributeError(name)

    def on_train_end(
        self, args: Any, state: Any, control: Any, model: Any = None, **kw: Any
    ) -> None:
        import torch

        was_training = model.training
        model.eval()
        with torch.no_grad():
            self.logits = model(input_ids=self.ids.to(model.device)).logits.float().cpu()
        model.train(was_training)


def _extract(bundle: Path, dest: Path) -> dict[str, Any]:
    with tarfile.open(bundle) as tar:
        tar.extractall(dest, filter="data")
    return json.loads((dest / MANIFEST).read_text())


def _reloaded_logits(base: Path, adapter_dir: Path, qlora: bool, ids: Any) -> Any:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    kwargs: dict[str, Any] = {"dtype": torch.float32}
    if qlora:
        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_compute_dtype=torch.float32,
            bnb_4bit_use_double_quant=True,
        )
        kwargs["device_map"] = "cpu"
    model = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(base, **kwargs), adapter_dir
    )
    model.eval()
    with torch.no_grad():
        return model(input_ids=ids).logits.float()


@pytest.mark.parametrize("fmt", ["messages", "alpaca", "prompt_completion", "text"])
@pytest.mark.parametrize("adapter", ["lora", "dora", "qlora"])
def test_trains_packages_and_reloads(
    adapter: str,
    fmt: str,
    tiny_model_dir: Path,
    dataset_files: dict,
    run_executor: Any,
    tmp_path: Path,
) -> None:
    from transformers import AutoTokenizer

    probe = LogitsProbe(AutoTokenizer.from_pretrained(tiny_model_dir))
    spec = spec_dict(tiny_model_dir, dataset_files[fmt], tmp_path / "out", fmt=fmt, adapter=adapter)
    run = run_executor(spec, callbacks=[probe])
    result = run.result
    assert (result.status, result.reason) == ("succeeded", ""), result.message

    # Loss falls: the last logged losses are well below the first ones.
    history = [h["loss"] for h in result.metrics["loss_history"]]
    assert len(history) == result.metrics["global_step"] == 15
    assert sum(history[-3:]) / 3 < sum(history[:3]) / 3 - 0.5, history

    # The uploaded bundle is what was reported, and every member matches the manifest.
    assert run.artifact.is_file()
    verified = verify_bundle([run.artifact.read_bytes()])
    assert verified.sha256 == result.bundle_sha256 == file_sha256(run.artifact)
    assert verified.size == result.bundle_size
    names = {f.path for f in verified.files}
    assert {
        "adapter_model.safetensors",
        "adapter_config.json",
        "metrics.json",
        "tokenizer.json",
    } <= names
    assert "README.md" not in names
    extracted = tmp_path / "bundle"
    manifest = _extract(run.artifact, extracted)
    assert manifest == result.manifest
    for entry in manifest["files"]:
        assert file_sha256(extracted / entry["path"]) == entry["sha256"]

    config = json.loads((extracted / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == spec["model"]
    assert config["use_dora"] is (adapter == "dora")
    assert config["r"] == 8
    metrics = json.loads((extracted / "metrics.json").read_text())
    assert metrics["loss_on"] == {"messages": "assistant tokens", "text": "all tokens"}.get(
        fmt, "response tokens"
    )
    assert metrics["backend"] == "peft"

    # The adapter reloads onto the base model and reproduces the trained model's logits.
    reloaded = _reloaded_logits(tiny_model_dir, extracted, adapter == "qlora", probe.ids)
    diff = (reloaded - probe.logits).abs().max().item()
    assert diff < TOLERANCE, diff

    # Events: running, throttled metrics, the artifact, then succeeded with the bundle's sha256.
    statuses = [e["data"]["status"] for e in run.of_type("status")]
    assert statuses == ["running", "succeeded"]
    assert run.final_status["data"]["sha256"] == result.bundle_sha256
    assert run.of_type("artifact")[0]["data"]["sha256"] == result.bundle_sha256
    last = run.of_type("metrics")[-1]["data"]
    assert last["step"] == last["total_steps"] == 15
    assert {"epoch", "loss", "lr", "grad_norm", "tokens_per_second", "trained_tokens"} <= set(last)
    assert last["trained_tokens"] == metrics["trained_tokens"] > 0
    assert [e["seq"] for e in run.events] == sorted({e["seq"] for e in run.events})
    assert not any(run.workdir.iterdir()), "the attempt's working files were not removed"


@pytest.mark.parametrize("adapter", ["lora", "qlora"])
def test_events_checkpoints_and_validation_loss(
    adapter: str, tiny_model_dir: Path, dataset_files: dict, run_executor: Any, tmp_path: Path
) -> None:
    from jobs.services.core.events import clean_executor_event

    spec = spec_dict(
        tiny_model_dir, dataset_files["text"], tmp_path / "out", fmt="text", adapter=adapter
    )
    spec["validation_dataset"] = dict(spec["dataset"])
    run = run_executor(spec, checkpoint_every_steps=5)
    assert run.result.status == "succeeded", run.result.message
    for event in run.events:  # every event is one the control plane stores
        assert clean_executor_event(event) is not None, event
    # A checkpoint every 5 steps, not at the end (the artifact is the last word), latest only.
    assert [e["data"]["step"] for e in run.of_type("checkpoint")] == [5, 10]
    assert run.checkpoint.is_file()
    assert run.of_type("checkpoint")[-1]["data"]["sha256"] == file_sha256(run.checkpoint)
    assert run.result.metrics["eval_loss"] is not None
    assert any("eval_loss" in e["data"] for e in run.of_type("log"))


@pytest.mark.parametrize("adapter", ["lora", "qlora"])
def test_gradient_checkpointing_changes_memory_not_the_math(
    adapter: str, tiny_model_dir: Path, dataset_files: dict, run_executor: Any, tmp_path: Path
) -> None:
    """The backend switches checkpointing on or off as the spec says; recomputing activations
    in the backward pass gives the same gradients, so the same seed gives the same losses."""
    from gpu_worker.backends import peft_backend
    from trainhub_contract.spec import parse_job_spec

    losses = {}
    for checkpointing in (True, False):
        spec = spec_dict(
            tiny_model_dir,
            dataset_files["messages"],
            tmp_path / f"out-{checkpointing}",
            adapter=adapter,
            gradient_checkpointing=checkpointing,
        )
        model, _ = peft_backend.load(parse_job_spec(spec))
        assert model.base_model.model.is_gradient_checkpointing is checkpointing
        run = run_executor(spec)
        assert run.result.status == "succeeded", run.result.message
        assert run.result.metrics["hyperparameters"]["gradient_checkpointing"] is checkpointing
        losses[checkpointing] = [h["loss"] for h in run.result.metrics["loss_history"]]
    assert losses[True] == pytest.approx(losses[False], abs=1e-4)
