"""Padding-free training (``hyperparameters.packing``): each micro-batch's examples laid end to
end in rows of at most ``max_seq_length`` tokens, position ids restarting at 0 for every example,
and attention that never crosses from one example into another.

Packing is per micro-batch, not over the whole dataset: the same examples make the same optimizer
steps as without packing (``batch_size`` still counts examples, the loss still averages over the
same label tokens, checkpoints and resume line up step for step); only the padding's compute
goes. The first token of every example is never a label, so the last token of one example is not
trained to predict the next example (without packing that position is shifted away anyway).

What the installed stack does with such rows (transformers 5.17, tiny Llama, CPU; tested, not
assumed):

- Given ``position_ids`` and NO ``attention_mask``, transformers' mask builder
  (``masking_utils.find_packed_sequence_indices``) reads every restart of the position ids as a
  new sequence and builds a block-diagonal causal mask, for ``sdpa`` and ``eager`` alike;
  ``flash_attention_2`` turns the same position ids into varlen ``cu_seqlens``. The logits of an
  example inside a packed row then equal its logits alone (max |diff| 6e-7 in fp32).
- Only without a KV cache: with ``use_cache=True`` (the config default, even in training) the
  model builds a ``DynamicCache``, skips that detection, and attention silently crosses examples
  (max |diff| 1.8). Training therefore runs with ``config.use_cache = False``.
- Any 2D ``attention_mask``, even all ones, also turns the detection off: packed rows carry none.
- Unsloth's own attention kernels take the boundaries from a ``packed_seq_lengths`` batch key
  (``unsloth/utils/packing.py``), not from position ids; on that backend the collator adds it.

Since all of that depends on versions, backend and attention implementation, the executor does
not trust it blindly: :func:`isolates_examples` runs the model about to be trained on two
examples, packed by the training collator and alone, and packing is used only if the logits
agree. Where they do not, training falls back to length-grouped batches (examples of similar
length share a batch, so each is padded little) and a log event says why.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpu_worker.formatting import IGNORE_INDEX, PadCollator, pad_token_id
from gpu_worker.token_counts import REAL_TOKENS_KEY

if TYPE_CHECKING:
    from trainhub_contract.spec import JobSpec

PACKED, LENGTH_GROUPED, PADDED = "packed", "length_grouped", "padded"
# An example inside a packed row must match itself alone far more closely than it matches itself
# after another example (what crossing attention gives): mean |diff| below this share of that.
# fp32 measures ~1e-7 of it; bf16 kernel noise stays well under; crossing is 1 by definition.
ISOLATION_RATIO = 0.1


def _first_fit(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    rows: list[list[int]] = []
    room: list[int] = []
    for index in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        n = lengths[index]
        for row, free in enumerate(room):
            if n <= free:
                rows[row].append(index)
                room[row] -= n
                break
        else:
            rows.append([index])
            room.append(capacity - n)
    return rows


def pack_rows(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Indices of ``lengths`` grouped into rows of at most ``capacity`` tokens: as few rows as
    first fit (longest first) needs, and of those the narrowest, so the rows come out even and
    padding them to the widest wastes little. An example longer than ``capacity`` gets a row of
    its own (encode_examples truncates to max_seq_length, so none is)."""
    rows = _first_fit(lengths, capacity)
    low = max(max(lengths, default=0), -(-sum(lengths) // max(len(rows), 1)))
    high = max(low, capacity)
    while low < high:  # binary search on the width; `high` always fits in len(rows) rows
        mid = (low + high) // 2
        if len(_first_fit(lengths, mid)) <= len(rows):
            high = mid
        else:
            low = mid + 1
    return _first_fit(lengths, high) if high < capacity else rows


class PackedCollator:
    """A batch of examples -> packed rows: ``input_ids``, ``labels`` (the first token of each
    example masked), ``position_ids`` restarting at 0 per example, and no ``attention_mask``.

    ``varlen``: the attention kernel works per example (flash varlen, Unsloth's kernels), so a
    row may hold up to ``max_length`` tokens. Otherwise (sdpa/eager with a block-diagonal mask,
    whose cost grows with the square of the row) a row is never wider than the batch's longest
    example: no step then computes more than the padded batch would, and the short examples
    share rows. A batch where no two examples share a row is returned as the ordinary padded
    batch (:class:`~gpu_worker.formatting.PadCollator`): the same math, on the plain causal path.

    Rows shorter than the widest are right-padded; the padding is a "sequence" of its own
    (position ids from 0, labels -100), so nothing attends to it and it trains nothing.
    ``seq_lengths``: also emit ``packed_seq_lengths`` (every segment's length, row by row,
    padding included), which Unsloth's kernels read. The count of real tokens travels under
    :data:`~gpu_worker.token_counts.REAL_TOKENS_KEY` (the trainer takes it out before the model).
    """

    def __init__(
        self, pad_token_id: int, max_length: int, *, varlen: bool = False, seq_lengths: bool = False
    ) -> None:
        self.pad_token_id = pad_token_id
        self.max_length = max_length
        self.varlen = varlen
        self.seq_lengths = seq_lengths
        self._padded = PadCollator(pad_token_id)

    def __call__(self, batch: list[dict[str, list[int]]]) -> dict[str, Any]:
        import torch

        lengths = [len(ex["input_ids"]) for ex in batch]
        capacity = self.max_length if self.varlen else min(self.max_length, max(lengths))
        rows = pack_rows(lengths, capacity)
        if len(rows) == len(batch):
            return self._padded(batch)
        width = max(sum(lengths[i] for i in row) for row in rows)
        ids = torch.full((len(rows), width), self.pad_token_id, dtype=torch.long)
        labels = torch.full((len(rows), width), IGNORE_INDEX, dtype=torch.long)
        positions = torch.zeros((len(rows), width), dtype=torch.long)
        segments: list[int] = []
        for r, row in enumerate(rows):
            at = 0
            for i in row:
                n = lengths[i]
                ids[r, at : at + n] = torch.tensor(batch[i]["input_ids"], dtype=torch.long)
                labels[r, at : at + n] = torch.tensor(batch[i]["labels"], dtype=torch.long)
                labels[r, at] = IGNORE_INDEX  # never the previous example's next token
                positions[r, at : at + n] = torch.arange(n)
                segments.append(n)
                at += n
            if at < width:
                positions[r, at:] = torch.arange(width - at)
                segments.append(width - at)
        out: dict[str, Any] = {
            "input_ids": ids,
            "labels": labels,
            "position_ids": positions,
            REAL_TOKENS_KEY: sum(lengths),
        }
        if self.seq_lengths:
            out["packed_seq_lengths"] = torch.tensor(segments, dtype=torch.int32)
        return out


def locate(batch: dict[str, Any], ids: Sequence[int]) -> tuple[int, int]:
    """(row, start) of the example ``ids`` in a packed ``batch``."""
    for row, (tokens, positions) in enumerate(
        zip(batch["input_ids"].tolist(), batch["position_ids"].tolist(), strict=True)
    ):
        for start, position in enumerate(positions):
            if position == 0 and tokens[start : start + len(ids)] == list(ids):
                return row, start
    raise ValueError("example not in the batch")


def _model_inputs(batch: dict[str, Any], device: Any) -> dict[str, Any]:
    return {k: v.to(device) for k, v in batch.items() if k != "labels" and k != REAL_TOKENS_KEY}


def isolates_examples(model: Any, collator: PackedCollator) -> tuple[bool, str]:
    """Whether ``model`` keeps attention inside each example of ``collator``'s packed rows.

    Three random examples (16, 9 and 7 tokens; the last two share a row whatever the collator's
    row width) go through the model packed, and the 7-token one alone, through the same collator,
    in training mode with dropout off and without gradients. Its logits in the packed row must
    match its logits alone much more closely than they match it after the 9-token one with no
    packing information (attention crossing). Returns the verdict and the measured differences.
    """
    import torch

    vocab = int(model.get_input_embeddings().num_embeddings)
    generator = torch.Generator().manual_seed(0)
    long, first, second = (
        torch.randint(0, vocab, (n,), generator=generator).tolist() for n in (16, 9, 7)
    )
    device = next(model.parameters()).device
    dropouts = [m for m in model.modules() if isinstance(m, torch.nn.Dropout)]
    saved = [m.p for m in dropouts]
    was_training = model.training
    try:
        for m in dropouts:
            m.p = 0.0
        model.train()
        with torch.no_grad():

            def logits(batch: dict[str, Any]) -> Any:
                return model(**_model_inputs(batch, device)).logits.float()

            alone = logits(collator([{"input_ids": second, "labels": second}]))[0]
            batch = collator([{"input_ids": ids, "labels": ids} for ids in (long, first, second)])
            if "position_ids" not in batch:
                return False, "the collator put every example in a row of its own"
            row, start = locate(batch, second)
            packed = logits(batch)[row, start : start + len(second)]
            joined = torch.tensor([first + second])
            straight = torch.arange(joined.shape[1])[None]  # one sequence: nothing says where
            crossed = logits({"input_ids": joined, "position_ids": straight})[0, len(first) :]
    finally:
        for m, p in zip(dropouts, saved, strict=True):
            m.p = p
        model.train(was_training)
    inside = float((packed - alone).abs().mean())
    across = float((crossed - alone).abs().mean())
    detail = (
        f"mean |logit diff| packed vs alone {inside:.2g}, attention across examples {across:.2g}"
    )
    return across > 0 and inside <= ISOLATION_RATIO * across, detail


@dataclass(frozen=True)
class Batching:
    """How the run batches: ``mode`` (packed, length_grouped or padded), the collator, the
    Trainer's ``train_sampling_strategy``, and a sentence for the run's log."""

    mode: str
    collator: Any
    sampling: str
    note: str
    warning: bool = False


def choose_batching(
    spec: JobSpec, model: Any, tokenizer: Any, max_len: int, backend: str
) -> Batching:
    """Packed rows where ``spec`` asks for packing and the model keeps examples apart; else
    length-grouped padded batches (packing asked, model cannot); else plain padded batches.

    Turns the model's KV cache off for training: with one, transformers ignores the packing."""
    pad = pad_token_id(tokenizer)
    if spec.method == "dpo":
        from gpu_worker.preference import PairCollator

        return Batching(
            PADDED,
            PairCollator(pad),
            "random",
            "DPO: each batch pads its pairs' two replies to the longest (packing does not apply "
            "to pairs).",
        )
    if not spec.hyperparameters.packing:
        return Batching(PADDED, PadCollator(pad), "random", "Packing is off: padded batches.")
    config = getattr(model, "config", None)
    if config is not None and getattr(config, "use_cache", False):
        config.use_cache = False
    attention = str(getattr(config, "_attn_implementation", None) or "")
    varlen = backend == "unsloth" or attention.startswith("flash")
    collator = PackedCollator(pad, max_len, varlen=varlen, seq_lengths=backend == "unsloth")
    ok, detail = isolates_examples(model, collator)
    if ok:
        width = (
            f"up to {max_len} tokens"
            if varlen
            else "no wider than the batch's longest example (a dense attention mask)"
        )
        return Batching(
            PACKED,
            collator,
            "random",
            f"Packing: each batch's examples share rows {width}, attention kept inside each "
            f"example ({detail}).",
        )
    return Batching(
        LENGTH_GROUPED,
        PadCollator(pad),
        "group_by_length",
        f"Packing is not used: on this model ({backend} backend) attention would cross from one "
        f"example into the next ({detail}). Training with length-grouped batches instead "
        "(examples of similar length batched together, each batch padded to its longest).",
        warning=True,
    )
