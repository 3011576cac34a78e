"""Graded checkpoints in the executor, on the tiny model on CPU: the eval items are answered
and scored before training and at every checkpoint, and ``best_eval`` makes the job's adapter
the best-scored checkpoint's, byte for byte, even when that is not the last step."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path
from typing import Any

from tests.gpu_worker.conftest import _demo_records, spec_dict, write_jsonl
from tests.gpu_worker.test_dpo import HELD_OUT, _pairs
from trainhub_contract.bundle import MANIFEST

# Replies that still end the way the SFT data taught ("." rather than the "!" DPO teaches).
ENDS_PLAIN = {"type": "string_check", "name": "ends plain", "operation": "like",
              "input": "{{sample.output_text}}", "reference": "{{item.ending}}"}  # fmt: skip


def _manifest_sha256(bundle: Path, member: str) -> str:
    with tarfile.open(bundle) as tar:
        manifest = json.loads(tar.extractfile(MANIFEST).read())  # type: ignore[union-attr]
    return next(f["sha256"] for f in manifest["files"] if f["path"] == member)


def test_best_eval_keeps_the_best_scored_checkpoint_when_training_moves_away_from_it(
    tiny_model_dir: Path, dataset_files: dict, run_executor: Any, tmp_path: Path
) -> None:
    records = _demo_records()
    sft = run_executor(
        spec_dict(tiny_model_dir, dataset_files["messages"], tmp_path / "sft", n_epochs=3)
    )
    assert sft.result.status == "succeeded", sft.final_status
    items = [{"input": {"messages": r["messages"][:-1]}, "ending": "."} for r in records[:HELD_OUT]]
    evals = write_jsonl(tmp_path / "evals.jsonl", items)
    spec = spec_dict(tiny_model_dir, write_jsonl(tmp_path / "pairs.jsonl", _pairs(records)),
                     tmp_path / "dpo", fmt="preference", n_epochs=1, learning_rate=5e-4,
                     beta=0.5)  # fmt: skip
    spec["method"] = "dpo"
    spec["parent_adapter"] = {"url": sft.artifact.as_uri(), "sha256": sft.result.bundle_sha256}
    spec["evals"] = {"url": evals[0].as_uri(), "sha256": evals[1], "grader": ENDS_PLAIN,
                     "max_tokens": 24}  # fmt: skip
    spec["checkpoint_selection"] = "best_eval"

    run = run_executor(spec, checkpoint_every_steps=1)

    assert run.result.status == "succeeded", run.final_status
    scores = {e["data"]["step"]: e["data"] for e in run.of_type("log") if "eval_score" in e["data"]}
    saved = [e["data"]["step"] for e in run.of_type("checkpoint")]
    total = run.result.metrics["global_step"]
    assert set(scores) == {0, *saved, total}, "the start, every checkpoint and the end"
    for figures in scores.values():
        assert 0 <= figures["eval_score"] <= 1 and figures["eval_items"] == HELD_OUT
    print({step: figures["eval_score"] for step, figures in sorted(scores.items())})
    best = max(scores[s]["eval_score"] for s in [*saved, total])
    chosen = max(s for s in [*saved, total] if scores[s]["eval_score"] == best)  # ties: later
    assert run.result.metrics["selected_step"] == chosen
    assert scores[total]["eval_score"] < best, "DPO moved the replies away from the grader's"
    (selected,) = [e["data"] for e in run.of_type("log") if "selected_step" in e["data"]]
    assert selected["selected_step"] == chosen
    adapter = _manifest_sha256(run.artifact, "adapter_model.safetensors")
    assert adapter == selected["selected_adapter_sha256"], "the chosen checkpoint's weights"
