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
from trainhub_contract.outcomes import StopMode

# Replies that still end the way the SFT data taught ("." rather than the "!" DPO teaches).
ENDS_PLAIN = {"type": "string_check", "name": "ends plain", "operation": "like",
              "input": "{{sample.output_text}}", "reference": "{{item.ending}}"}  # fmt: skip


def _manifest_sha256(bundle: Path, member: str) -> str:
    with tarfile.open(bundle) as tar:
        manifest = json.loads(tar.extractfile(MANIFEST).read())  # type: ignore[union-attr]
    return next(f["sha256"] for f in manifest["files"] if f["path"] == member)


def _graded_dpo(
    tiny_model_dir: Path, dataset_files: dict, run_executor: Any, tmp_path: Path
) -> dict[str, Any]:
    """A DPO job on top of an SFT adapter whose held-out replies are graded on ending in "."."""
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
    return spec


def test_best_eval_keeps_the_best_scored_checkpoint_when_training_moves_away_from_it(
    tiny_model_dir: Path, dataset_files: dict, run_executor: Any, tmp_path: Path
) -> None:
    spec = _graded_dpo(tiny_model_dir, dataset_files, run_executor, tmp_path)

    run = run_executor(spec, checkpoint_every_steps=1)

    assert run.result.status == "succeeded", run.final_status
    scores = {e["data"]["step"]: e["data"] for e in run.of_type("log") if "eval_score" in e["data"]}
    saved = [e["data"]["step"] for e in run.of_type("checkpoint")]
    total = run.result.metrics["global_step"]
    assert set(scores) == {0, *saved, total}, "the start, every checkpoint and the end"
    for figures in scores.values():
        assert 0 <= figures["eval_score"] <= 1 and figures["eval_items"] == HELD_OUT
    best = max(scores[s]["eval_score"] for s in [*saved, total])
    chosen = max(s for s in [*saved, total] if scores[s]["eval_score"] == best)  # ties: later
    assert run.result.metrics["selected_step"] == chosen
    assert scores[total]["eval_score"] < best, "DPO moved the replies away from the grader's"
    (selected,) = [e["data"] for e in run.of_type("log") if "selected_step" in e["data"]]
    assert selected["selected_step"] == chosen
    adapter = _manifest_sha256(run.artifact, "adapter_model.safetensors")
    assert adapter == selected["selected_adapter_sha256"], "the chosen checkpoint's weights"


def test_a_paused_dpo_job_resumes_with_its_reference_and_its_best_checkpoint_so_far(
    tiny_model_dir: Path, dataset_files: dict, run_executor: Any, tmp_path: Path
) -> None:
    """Attempt 1 is paused at step 4: its checkpoint carries the best candidate so far (step 1,
    scored and then surpassed by nothing); attempt 2 resumes there, scores the same reference,
    and ends with the adapter of attempt 1's step 1."""
    spec = _graded_dpo(tiny_model_dir, dataset_files, run_executor, tmp_path)
    pause = StopAt(4)

    first = run_executor(spec, checkpoint_every_steps=1, callbacks=[pause], should_stop=pause)

    assert first.result.status == "cancelled" and first.of_type("checkpoint")
    scored = {
        e["data"]["step"]: e["data"] for e in first.of_type("log") if "eval_score" in e["data"]
    }
    second_spec = {**spec, "attempt": 2}
    second_spec["outputs"] = {**spec["outputs"], "resume_url": first.checkpoint.as_uri(),
                              "artifact_url": (tmp_path / "b" / "adapter.tar").as_uri()}  # fmt: skip
    second = run_executor(second_spec, checkpoint_every_steps=1)

    assert second.result.status == "succeeded", second.final_status
    assert second.result.metrics["resumed_from_step"] == pause.stopped_at
    references = [
        e["message"].split(" computed")[0]
        for run in (first, second)
        for e in run.of_type("log")
        if e["message"].startswith("Reference log-probabilities")
    ]
    assert len(references) == 2 and references[0] == references[1]
    (selected,) = [e["data"] for e in second.of_type("log") if "selected_step" in e["data"]]
    assert selected["selected_step"] == 1 and scored[1]["eval_score"] > 0
    earlier = [e["data"] for e in first.of_type("log") if e["data"].get("step") == 1]
    assert selected["selected_adapter_sha256"] and earlier
    bundle = _manifest_sha256(tmp_path / "b" / "adapter.tar", "adapter_model.safetensors")
    assert bundle == selected["selected_adapter_sha256"]


class StopAt:
    """A TrainerCallback and stop probe: asks for a pause once step ``at`` has ended."""

    def __init__(self, at: int) -> None:
        self.at = at
        self.stopped_at = 0
        self.asked = False

    def __call__(self) -> StopMode | None:
        return StopMode.PAUSE if self.asked else None

    def __getattr__(self, name: str) -> Any:
        if name.startswith("on_"):
            return lambda *a, **k: None
        raise AttributeError(name)

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self.stopped_at = state.global_step
        self.asked = self.asked or state.global_step >= self.at
