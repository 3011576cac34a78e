"""Packing (gpu_worker.packing) never mixes examples, trains what padding trains, and the token
counts (gpu_worker.token_counts) count exactly the label tokens."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpu_worker.formatting import IGNORE_INDEX, PadCollator, encode_examples
from gpu_worker.packing import (
    LENGTH_GROUPED,
    PACKED,
    PackedCollator,
    choose_batching,
    isolates_examples,
    pack_rows,
)
from gpu_worker.token_counts import REAL_TOKENS_KEY, batch_counts
from tests.gpu_worker.conftest import _demo_records, spec_dict
from trainhub_contract.spec import parse_job_spec

PAD = 3


def _example(start: int, n: int, prompt: int = 0) -> dict[str, list[int]]:
    ids = list(range(start, start + n))
    return {"input_ids": ids, "labels": [IGNORE_INDEX] * prompt + ids[prompt:]}


@pytest.fixture(scope="module")
def model(tiny_model_dir: Path) -> Any:
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    loaded.config.use_cache = False  # as choose_batching leaves it for training
    return loaded.eval()


@pytest.fixture(scope="module")
def demo(tok: Any) -> list[dict[str, list[int]]]:
    examples, _ = encode_examples(_demo_records()[:8], "messages", tok, 128)
    return examples


@pytest.fixture(scope="module")
def skewed(demo: list) -> list[dict[str, list[int]]]:
    """One two-conversation example (about twice as long) and three single ones."""
    double = {k: demo[0][k] + demo[1][k] for k in ("input_ids", "labels")}
    return [double, *demo[2:5]]


def test_pack_rows_fills_rows_up_to_the_capacity_with_every_example_once() -> None:
    lengths = [30, 5, 20, 12, 7, 30, 1]
    rows = pack_rows(lengths, 32)
    assert sorted(i for row in rows for i in row) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in row) <= 32 for row in rows)
    assert len(rows) == 4  # 105 tokens need at least 4 rows of 32


def test_packed_rows_restart_positions_and_mask_every_example_start() -> None:
    from transformers.masking_utils import find_packed_sequence_indices

    batch_in = [_example(100, 6, prompt=2), _example(200, 2), _example(300, 9, prompt=4)]
    batch = PackedCollator(PAD, max_length=10)(batch_in)
    assert "attention_mask" not in batch  # any 2D mask turns transformers' packing detection off
    ids, labels, pos = batch["input_ids"], batch["labels"], batch["position_ids"]
    assert ids.shape == labels.shape == pos.shape == (2, 9)  # [9] and [6, 2, padding 1]
    assert batch[REAL_TOKENS_KEY] == 17

    # Recover every example from the rows: each starts where the position ids restart at 0.
    found = []
    for row in range(ids.shape[0]):
        starts = [i for i, p in enumerate(pos[row].tolist()) if p == 0]
        for start, end in zip(starts, [*starts[1:], ids.shape[1]], strict=True):
            segment = ids[row, start:end].tolist()
            assert pos[row, start:end].tolist() == list(range(end - start))
            # The first token is never a label: it would be the previous example's next token.
            assert labels[row, start] == IGNORE_INDEX
            if segment[0] == PAD:  # the row's padding: a segment of its own that trains nothing
                assert set(segment) == {PAD} and (labels[row, start:end] == IGNORE_INDEX).all()
                continue
            example = next(ex for ex in batch_in if ex["input_ids"] == segment)
            assert labels[row, start + 1 : end].tolist() == example["labels"][1:]
            found.append(segment)
    assert sorted(found) == sorted(ex["input_ids"] for ex in batch_in)

    # Labels never span a boundary: every target (label at p + 1) is in the same segment as p.
    segments = find_packed_sequence_indices(pos)  # what transformers builds its mask from
    assert segments is not None
    for row in range(ids.shape[0]):
        for p in range(ids.shape[1] - 1):
            if labels[row, p + 1] != IGNORE_INDEX:
                assert segments[row, p] == segments[row, p + 1]
    # The mask transformers derives is block diagonal: one block per example (and the padding).
    assert segments.tolist() == [[0] * 9, [0] * 6 + [1] * 2 + [2]]


def test_dense_rows_are_never_wider_than_the_longest_example() -> None:
    """With a dense block mask a row costs the square of its width: packing must not make any
    step dearer than padding. Where no two examples fit together the batch is the padded one."""
    lengths = [40, 10, 9, 30, 6, 25]
    batch_in = [_example(100 * (i + 1), n) for i, n in enumerate(lengths)]
    dense = PackedCollator(PAD, max_length=512)(batch_in)
    assert dense["input_ids"].shape == (3, 40)  # [40], [30, 10], [25, 9, 6]; not one row of 120
    wide = PackedCollator(PAD, max_length=512, varlen=True)(batch_in)
    assert wide["input_ids"].shape == (1, sum(lengths))
    alike = [_example(100, 20), _example(200, 18), _example(300, 19)]
    plain = PackedCollator(PAD, max_length=512)(alike)
    assert set(plain) == {"input_ids", "labels", "attention_mask"}
    assert all((plain[k] == v).all() for k, v in PadCollator(PAD)(alike).items())


def test_unsloth_gets_the_segment_lengths_its_kernels_read() -> None:
    batch = PackedCollator(PAD, max_length=10, varlen=True, seq_lengths=True)(
        [_example(100, 6), _example(200, 3), _example(300, 8)]
    )
    assert batch["packed_seq_lengths"].tolist() == [8, 1, 6, 3]  # row 1: 8 + padding 1
    assert int(batch["packed_seq_lengths"].sum()) == batch["input_ids"].numel()


def test_an_example_inside_a_packed_row_has_its_logits_alone(model: Any, demo: list) -> None:
    import torch

    examples = demo[:4]
    batch = PackedCollator(PAD, max_length=512, varlen=True)(examples)
    assert batch["input_ids"].shape[0] == 1  # all four in one row
    with torch.no_grad():
        packed = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"]).logits
        starts = [i for i, p in enumerate(batch["position_ids"][0].tolist()) if p == 0]
        for start in starts:
            n = next(
                len(ex["input_ids"])
                for ex in examples
                if ex["input_ids"][:5] == batch["input_ids"][0, start : start + 5].tolist()
            )
            ids = batch["input_ids"][:, start : start + n]
            alone = model(input_ids=ids).logits
            assert (packed[:, start : start + n] - alone).abs().max() < 1e-4


def test_the_isolation_check_catches_attention_across_examples(model: Any) -> None:
    collator = PackedCollator(PAD, max_length=64)
    ok, detail = isolates_examples(model, collator)
    assert ok, detail
    # With a KV cache (the config default) transformers skips its packed-sequence detection and
    # attention runs across the examples: the check must say so.
    model.config.use_cache = True
    try:
        crossed, detail = isolates_examples(model, collator)
    finally:
        model.config.use_cache = False
    assert not crossed, detail


class _IgnoresPositions:
    """A model that drops position ids, so nothing keeps packed examples apart."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.config = inner.config

    def __call__(self, input_ids: Any, **kwargs: Any) -> Any:
        return self.inner(input_ids=input_ids)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_without_isolation_packing_falls_back_to_length_grouped_batches(
    model: Any, tok: Any, tiny_model_dir: Path, tmp_path: Path
) -> None:
    data = tmp_path / "d.jsonl"
    data.write_text("{}\n")
    spec = parse_job_spec(spec_dict(tiny_model_dir, (data, "0" * 64), tmp_path))
    assert spec.hyperparameters.packing is True  # the default
    batching = choose_batching(spec, _IgnoresPositions(model), tok, 128, "peft")
    assert batching.mode == LENGTH_GROUPED and batching.warning
    assert batching.sampling == "group_by_length" and isinstance(batching.collator, PadCollator)
    assert "attention would cross" in batching.note
    # The config's default KV cache would turn the packing off: choose_batching turns it off.
    model.config.use_cache = True
    assert choose_batching(spec, model, tok, 128, "peft").mode == PACKED
    assert model.config.use_cache is False


@pytest.mark.parametrize("loss_on", ["assistant tokens", "all tokens"])
def test_the_loss_of_a_packed_batch_is_the_loss_of_the_padded_batch(
    model: Any, skewed: list, loss_on: str
) -> None:
    import torch

    if loss_on == "all tokens":  # every example's first token is a label too (text format)
        skewed = [{"input_ids": ex["input_ids"], "labels": ex["input_ids"]} for ex in skewed]
    padded = PadCollator(PAD)(skewed)
    packed = PackedCollator(PAD, max_length=128)(skewed)
    assert packed["input_ids"].numel() < padded["input_ids"].numel()
    with torch.no_grad():
        loss_padded = model(**padded).loss
        packed.pop(REAL_TOKENS_KEY)
        loss_packed = model(**packed).loss
    assert float(loss_packed) == pytest.approx(float(loss_padded), abs=1e-5)


def test_counts_are_label_tokens_real_tokens_and_positions(skewed: list) -> None:
    label_tokens = sum(sum(1 for t in ex["labels"][1:] if t != IGNORE_INDEX) for ex in skewed)
    tokens = sum(len(ex["input_ids"]) for ex in skewed)
    padded = batch_counts(PadCollator(PAD)(skewed))
    packed = batch_counts(PackedCollator(PAD, max_length=128)(skewed))
    assert padded.useful == packed.useful == label_tokens
    assert padded.tokens == packed.tokens == tokens
    longest = max(len(ex["input_ids"]) for ex in skewed)
    assert packed.positions < padded.positions == 4 * longest
    assert padded.padding_share == round(1 - tokens / padded.positions, 4)


def test_packed_training_matches_padded_training_and_counts_every_label_token(
    tiny_model_dir: Path, dataset_files: dict, run_executor: Any, tmp_path: Path, tok: Any
) -> None:
    """Same examples per optimizer step (batch 4 padded; batch 2 x 2 accumulation packed), same
    losses; the counts add up every micro-batch."""
    from trainhub_contract.datasets import iter_examples

    path, _ = dataset_files["messages"]
    _, stats = encode_examples(list(iter_examples(path)), "messages", tok, 128)
    runs = {}
    for packing, batch, accumulation in ((False, 4, 1), (True, 2, 2)):
        spec = spec_dict(
            tiny_model_dir,
            dataset_files["messages"],
            tmp_path / f"out-{packing}",
            packing=packing,
            batch_size=batch,
            gradient_accumulation_steps=accumulation,
            gradient_checkpointing=False,  # which would also turn the model's KV cache off
        )
        run = run_executor(spec)
        assert run.result.status == "succeeded", run.result.message
        runs[packing] = run
    plain, packed = runs[False].result.metrics, runs[True].result.metrics
    assert (plain["batching"], packed["batching"]) == ("padded", "packed")
    assert plain["global_step"] == packed["global_step"] == 15
    losses = [[h["loss"] for h in m["loss_history"]] for m in (plain, packed)]
    assert losses[1] == pytest.approx(losses[0], rel=1e-3)

    assert plain["useful_tokens"] == packed["useful_tokens"] == stats.trainable_tokens
    assert plain["trained_tokens"] == packed["trained_tokens"] == stats.tokens
    assert packed["padding_share"] < plain["padding_share"]
    assert packed["useful_tokens_per_second"] > 0
    last = runs[True].of_type("metrics")[-1]["data"]
    assert last["useful_tokens"] == stats.trainable_tokens
    assert {"useful_tokens_per_second", "padding_share"} <= set(last)
    note = next(e for e in runs[True].of_type("log") if e["data"].get("batching"))
    assert note["data"]["batching"] == "packed" and note["level"] == "info"


def test_a_run_whose_model_cannot_pack_trains_length_grouped_and_says_so(
    tiny_model_dir: Path,
    dataset_files: dict,
    run_executor: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from gpu_worker import packing

    monkeypatch.setattr(packing, "isolates_examples", lambda model, collator: (False, "forced"))
    spec = spec_dict(tiny_model_dir, dataset_files["text"], tmp_path / "out", fmt="text")
    run = run_executor(spec)
    assert run.result.status == "succeeded", run.result.message
    assert run.result.metrics["batching"] == LENGTH_GROUPED
    [note] = [e for e in run.of_type("log") if e["data"].get("batching")]
    assert note["level"] == "warning" and "forced" in note["message"]
    assert run.result.metrics["useful_tokens"] > 0
