"""DPO in the executor, on the tiny model on CPU: the loss against its formula, pairs encoded
with labels on the replies only, and SFT then DPO on top of the SFT adapter, where a preference
the SFT data never showed (replies that end in "!" rather than ".") is learnt: on held-out pairs the share whose
policy log-probability favours the preferred reply rises to at least 90 %."""

from __future__ import annotations

import json
import math
import tarfile
from pathlib import Path
from typing import Any

import pytest

from gpu_worker.formatting import IGNORE_INDEX
from gpu_worker.preference import PairCollator, dpo_loss, encode_preference
from tests.gpu_worker.conftest import _demo_records, spec_dict, write_jsonl
from trainhub_contract.bundle import MANIFEST

HELD_OUT = 12  # of the 60 demo conversations; DPO trains on the other 48


def _pairs(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for record in records:
        *prompt, answer = record["messages"]
        plain = answer["content"]  # every demo reply ends in "."; the SFT data teaches that
        out.append(
            {
                "input": {"messages": prompt},
                "preferred_output": [{"role": "assistant", "content": plain[:-1] + "!"}],
                "non_preferred_output": [{"role": "assistant", "content": plain}],
            }
        )
    return out


def test_the_bundled_demo_pairs_are_the_demo_conversations_with_the_preference() -> None:
    from gpu_worker.tiny_model import DEMO_PREFERENCE_PATH

    bundled = [json.loads(line) for line in DEMO_PREFERENCE_PATH.read_text().splitlines()]
    assert bundled == _pairs(_demo_records())


def test_the_loss_is_dpo_s_sigmoid_loss_worked_by_hand() -> None:
    import torch

    # Two pairs; rows: chosen 1, chosen 2, rejected 1, rejected 2.
    policy = torch.tensor([-10.0, -12.0, -11.0, -9.0])
    reference = torch.tensor([-11.0, -12.0, -10.0, -9.5])
    loss, chosen, rejected = dpo_loss(policy, reference, beta=0.5)

    # Pair 1: chosen ratio +1, rejected ratio -1 -> rewards 0.5, -0.5, logit 1.
    # Pair 2: chosen ratio 0, rejected ratio +0.5 -> rewards 0, 0.25, logit -0.25.
    expected = (math.log1p(math.exp(-1.0)) + math.log1p(math.exp(0.25))) / 2
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert chosen.tolist() == [0.5, 0.0] and rejected.tolist() == [-0.5, 0.25]


def test_a_pair_is_two_conversations_with_labels_on_the_replies_only(tok: Any) -> None:
    pairs, stats = encode_preference(_pairs(_demo_records()[:3]), tok, 128)

    assert (stats.kept, stats.dropped) == (3, 0)
    chosen, rejected = pairs[0]["chosen"], pairs[0]["rejected"]
    start = next(i for i, t in enumerate(chosen["labels"]) if t != IGNORE_INDEX)
    assert chosen["input_ids"][:start] == rejected["input_ids"][:start]  # the shared prompt
    reply = tok.decode([t for t in chosen["labels"] if t != IGNORE_INDEX])
    assert reply.rstrip() == "Owl number 1 is russet!<|im_end|>"
    assert "user" not in reply and "Owlbridge" not in reply
    batch = PairCollator(0)(pairs[:2])
    assert batch["input_ids"].shape[0] == 4  # chosen rows, then rejected
    assert batch["labels"][2].tolist()[: len(rejected["labels"])] == rejected["labels"]


def _adapter_dir(artifact: Path, dest: Path) -> Path:
    with tarfile.open(artifact) as tar:
        members = [m for m in tar.getmembers() if m.name != MANIFEST]
        tar.extractall(dest, members=members, filter="data")
    return dest


def _preferred_share(base: Path, adapter_dir: Path, pairs: list[dict[str, Any]], tok: Any) -> float:
    """The share of pairs whose preferred reply the adapter finds more likely."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from gpu_worker.preference import sequence_logps

    model = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32), adapter_dir
    )
    model.eval()
    encoded, _ = encode_preference(pairs, tok, 128)
    collate = PairCollator(tok.pad_token_id)
    with torch.no_grad():
        logps = sequence_logps(model, collate(encoded))
    n = len(encoded)
    return float((logps[:n] > logps[n:]).float().mean())


def test_dpo_on_top_of_an_sft_adapter_learns_the_preference_on_held_out_pairs(
    tiny_model_dir: Path, dataset_files: dict, run_executor: Any, tmp_path: Path, tok: Any
) -> None:
    records = _demo_records()
    train_pairs, held_out = _pairs(records[HELD_OUT:]), _pairs(records[:HELD_OUT])
    sft = run_executor(
        spec_dict(tiny_model_dir, dataset_files["messages"], tmp_path / "sft", n_epochs=3)
    )
    assert sft.result.status == "succeeded", sft.final_status

    preference = write_jsonl(tmp_path / "pairs.jsonl", train_pairs)
    validation = write_jsonl(tmp_path / "held_out.jsonl", held_out)
    spec = spec_dict(
        tiny_model_dir, preference, tmp_path / "dpo", fmt="preference", n_epochs=4,
        learning_rate=5e-3, beta=0.5, eval_interval=6,
    )  # fmt: skip
    spec["method"] = "dpo"
    spec["validation_dataset"] = {**spec["dataset"], "url": validation[0].as_uri(),
                                  "sha256": validation[1]}  # fmt: skip
    spec["parent_adapter"] = {"url": sft.artifact.as_uri(), "sha256": sft.result.bundle_sha256}
    dpo = run_executor(spec)
    assert dpo.result.status == "succeeded", dpo.final_status

    before = _preferred_share(
        tiny_model_dir, _adapter_dir(sft.artifact, tmp_path / "a"), held_out, tok
    )
    after = _preferred_share(
        tiny_model_dir, _adapter_dir(dpo.artifact, tmp_path / "b"), held_out, tok
    )
    print(f"held-out pairs favouring the preferred reply: SFT {before:.0%}, DPO {after:.0%}")
    assert before < 0.5 and after >= 0.9

    steps = [e["data"] for e in dpo.of_type("metrics") if "rewards/accuracies" in e["data"]]
    assert {"rewards/chosen", "rewards/rejected", "rewards/margins"} <= set(steps[0])
    first, last = steps[0], steps[-1]
    assert last["rewards/accuracies"] > first["rewards/accuracies"]
    assert last["rewards/margins"] > first["rewards/margins"]
    logs = [e["message"] for e in dpo.of_type("log")]
    assert any(m.startswith("Continuing the parent adapter") for m in logs)
    assert any(m.startswith("Reference log-probabilities of 60 pairs") for m in logs)
    with tarfile.open(dpo.artifact) as tar:
        metrics = json.loads(tar.extractfile("metrics.json").read())  # type: ignore[union-attr]
    assert metrics["method"] == "dpo" and metrics["full_valid_loss"] is not None
    assert metrics["parent_adapter_sha256"] == sft.result.bundle_sha256


def test_a_parent_adapter_that_is_not_the_recorded_one_or_does_not_fit_is_refused(
    tiny_model_dir: Path, dataset_files: dict, run_executor: Any, tmp_path: Path
) -> None:
    """The parent's bytes must be the ones the control plane recorded, and its adapter must
    have the job's settings: either way the run fails before training, saying which."""
    sft = run_executor(spec_dict(tiny_model_dir, dataset_files["messages"], tmp_path / "sft"))
    assert sft.result.status == "succeeded", sft.final_status
    parent = {"url": sft.artifact.as_uri(), "sha256": sft.result.bundle_sha256}

    tampered = spec_dict(tiny_model_dir, dataset_files["messages"], tmp_path / "a")
    tampered["parent_adapter"] = {**parent, "sha256": "0" * 64}
    refused = run_executor(tampered)
    assert (refused.result.status, refused.result.reason) == ("failed", "download_failed")
    assert "parent adapter" in refused.result.message

    wider = spec_dict(tiny_model_dir, dataset_files["messages"], tmp_path / "b")
    wider["adapter"]["r"] = 16
    wider["parent_adapter"] = parent
    misfit = run_executor(wider)
    assert (misfit.result.status, misfit.result.reason) == ("failed", "invalid_model")
    assert "r 8 in the parent, 16 in this job" in misfit.result.message
    assert not misfit.of_type("metrics"), "refused before the first step"
