"""OpenAI's training metrics from the executor: the mean token accuracy of a batch is a count of
next-token predictions that hit their label; a run with a validation file reports the training
accuracy per step, a sample pass every eval_interval steps, and the whole file once at the end,
whose loss and accuracy are what a separate evaluation of the uploaded adapter finds."""

from __future__ import annotations

import json
import math
import tarfile
from pathlib import Path
from typing import Any

import pytest

from gpu_worker.token_accuracy import TokenStats, batch_stats
from tests.gpu_worker.conftest import spec_dict
from trainhub_contract.bundle import MANIFEST

# Per token, in float32 on one CPU thread: the executor's batches and a separate pass one
# example at a time agree to rounding.
LOSS_TOLERANCE = 1e-4


def test_a_hand_made_batch_counts_the_predictions_that_hit_their_label() -> None:
    import torch

    # Position i predicts the label at i + 1; -100 is not trained on.
    labels = torch.tensor([[-100, 2, 3, -100], [-100, -100, 1, 0]])
    predicted = torch.tensor([[2, 0, 9, 9], [9, 1, 0, 9]])  # hits: 2, (3 missed), 1, 0
    logits = torch.nn.functional.one_hot(predicted, 10).float() * 3.0

    stats = batch_stats(logits, labels, with_loss=True)

    assert (stats.counted, stats.correct, stats.accuracy) == (4, 3, 0.75)
    pairs = [(0, 0, 2), (0, 1, 3), (1, 1, 1), (1, 2, 0)]  # (row, position, its next label)
    log_probs = torch.log_softmax(logits, dim=-1)
    expected = -sum(log_probs[r, i, t].item() for r, i, t in pairs) / len(pairs)
    assert stats.loss == pytest.approx(expected, abs=1e-6)


def test_without_logits_there_is_no_figure_rather_than_a_guess() -> None:
    import torch

    labels = torch.tensor([[-100, 1, 2]])
    assert batch_stats(None, labels) == TokenStats()
    assert batch_stats(torch.zeros(1, 0, 5), labels).accuracy is None  # a fused loss's stub
    summed = TokenStats(4, 3, 2.0)
    summed.add(TokenStats(4, 1, 2.0))
    assert (summed.accuracy, summed.loss) == (0.5, 0.5)
    assert summed.take() == TokenStats(8, 4, 4.0) and summed == TokenStats()


def _separate_evaluation(base: Path, adapter_dir: Path, examples: list[dict[str, Any]]) -> Any:
    """The adapter, loaded afresh, on each example alone: loss and accuracy per token."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32), adapter_dir
    )
    model.eval()
    total = TokenStats()
    with torch.no_grad():
        for example in examples:
            ids = torch.tensor([example["input_ids"]])
            labels = torch.tensor([example["labels"]])
            total.add(batch_stats(model(input_ids=ids).logits, labels, with_loss=True))
    return total


def test_a_run_with_a_validation_file_reports_openai_metrics_and_the_whole_file_at_the_end(
    tiny_model_dir: Path, dataset_files: dict, run_executor: Any, tmp_path: Path, tok: Any
) -> None:
    from gpu_worker.formatting import encode_examples

    spec = spec_dict(tiny_model_dir, dataset_files["messages"], tmp_path / "out", eval_interval=5)
    spec["validation_dataset"] = dict(spec["dataset"])
    run = run_executor(spec)
    assert run.result.status == "succeeded", run.result.message

    steps = run.of_type("metrics")
    assert steps and all(0.0 <= e["data"]["mean_token_accuracy"] <= 1.0 for e in steps)
    logs = [e["data"] for e in run.of_type("log")]
    samples = [d for d in logs if "eval_loss" in d]
    assert [d["step"] for d in samples] == [5, 10, 15]  # eval_interval steps of 15
    assert all(0.0 <= d["eval_mean_token_accuracy"] <= 1.0 for d in samples)
    (whole,) = [d for d in logs if "full_valid_loss" in d]
    assert whole["step"] == 15

    # What the run says is what the uploaded adapter does on the whole validation file.
    extracted = tmp_path / "bundle"
    with tarfile.open(run.artifact) as tar:
        tar.extractall(extracted, filter="data")
    assert (extracted / MANIFEST).is_file()
    records = [json.loads(line) for line in dataset_files["messages"][0].read_text().splitlines()]
    examples, _ = encode_examples(records, "messages", tok, 128)
    separate = _separate_evaluation(tiny_model_dir, extracted, examples)
    assert abs(whole["full_valid_loss"] - separate.loss) < LOSS_TOLERANCE
    assert whole["full_valid_mean_token_accuracy"] == pytest.approx(separate.accuracy, abs=1e-6)
    metrics = json.loads((extracted / "metrics.json").read_text())
    assert metrics["full_valid_loss"] == whole["full_valid_loss"]
    assert metrics["train_mean_token_accuracy"] == steps[-1]["data"]["mean_token_accuracy"]
    assert math.isfinite(metrics["valid_mean_token_accuracy"])
