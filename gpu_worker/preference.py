"""Direct preference optimization (DPO, Rafailov et al. 2023) in the executor's one Trainer loop.

A preference line (OpenAI's shape: ``input.messages``, one ``preferred_output`` and one
``non_preferred_output``) becomes two rows, the conversation ending in each reply, with labels
on the reply only. A batch of B pairs is one padded batch of 2B rows, chosen rows first, so the
collator, the token counts and the checkpoints are the supervised ones. The loss is DPO's
sigmoid loss: ``-log sigmoid(beta * ((log p(y_w) - log p_ref(y_w)) - (log p(y_l) - log p_ref(y_l))))``,
each log-probability summed over the reply's tokens.

The reference p_ref is the model as the job starts: the base with a fresh adapter (whose B
matrices are zero, so exactly the base) or, when the job continues a fine-tuned model, that
model. Its log-probabilities of every pair are computed once, before the first step, without
gradients and without dropout, and travel with the examples: no second model in memory and no
second forward pass per step. A resumed attempt computes them again from the same starting
weights before the Trainer loads the checkpoint, so every attempt trains against the same
reference.

Why not trl's ``DPOTrainer``: the newest version Unsloth allows (1.15) computes the head with a
Triton kernel that does not run on CPU, and it brings its own tokenization and batching; this
keeps the code CI runs the code a GPU runs (Unsloth's kernels still do the forward and backward
there), with the packing, checkpoints, stop handling and token counts every job has.

Logged as trl logs them: ``rewards/chosen`` and ``rewards/rejected`` (beta times the log-ratio of
each reply), ``rewards/margins`` (their difference) and ``rewards/accuracies`` (the share of
pairs whose chosen reward is the higher), means over the pairs of a logged step or of an
evaluation pass.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from gpu_worker.formatting import IGNORE_INDEX, FormatError, FormatStats, PadCollator

PREFERENCE_METRICS = ("rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies")
REFERENCE_KEY = "reference_logps"  # per row of a collated batch: chosen rows, then rejected
_SIDES = (("chosen", "preferred_output"), ("rejected", "non_preferred_output"))


# --- encoding ---------------------------------------------------------------------------------


def _prompt_length(prompt_ids: list[int], chosen: list[int], rejected: list[int]) -> int:
    """Where the replies start: after the prompt the chat template renders when it is a prefix
    of both conversations (the usual case), else after what the two have in common (tokens
    shared by both replies cancel out of the loss anyway)."""
    if chosen[: len(prompt_ids)] == prompt_ids and rejected[: len(prompt_ids)] == prompt_ids:
        return len(prompt_ids)
    common = 0
    for a, b in zip(chosen, rejected, strict=False):
        if a != b:
            break
        common += 1
    return common


def encode_preference(
    records: Iterable[dict[str, Any]], tokenizer: Any, max_seq_length: int
) -> tuple[list[dict[str, Any]], FormatStats]:
    """Tokenize preference records into ``{"chosen": row, "rejected": row}`` pairs, each row
    ``{"input_ids", "labels"}`` with labels on the reply only. A pair either of whose replies
    has no token left after truncation is dropped (and counted)."""
    if getattr(tokenizer, "chat_template", None) is None:
        raise FormatError(
            1,
            "the model's tokenizer has no chat template, so preference conversations cannot be "
            "formatted; use a chat/instruct model",
        )
    stats = FormatStats(loss_on="the preferred and non-preferred replies")
    pairs: list[dict[str, Any]] = []
    for index, record in enumerate(records, start=1):
        stats.examples += 1
        prompt = record["input"]
        tools = prompt.get("tools")
        try:
            prompt_ids = list(
                tokenizer.apply_chat_template(
                    prompt["messages"],
                    tools=tools,
                    tokenize=True,
                    add_generation_prompt=True,
                    return_dict=True,
                )["input_ids"]
            )
            full = {
                side: list(
                    tokenizer.apply_chat_template(
                        [*prompt["messages"], *record[key]],
                        tools=tools,
                        tokenize=True,
                        return_dict=True,
                    )["input_ids"]
                )
                for side, key in _SIDES
            }
        except Exception as exc:  # template errors come as jinja/ValueError/TypeError alike
            raise FormatError(index, f"could not be tokenized: {exc}") from exc
        start = _prompt_length(prompt_ids, full["chosen"], full["rejected"])
        pair: dict[str, Any] = {}
        for side, ids in full.items():
            labels = [IGNORE_INDEX] * start + ids[start:]
            if len(ids) > max_seq_length:
                stats.truncated += 1
                ids, labels = ids[:max_seq_length], labels[:max_seq_length]
            pair[side] = {"input_ids": ids, "labels": labels}
        trainable = [sum(1 for t in pair[s]["labels"][1:] if t != IGNORE_INDEX) for s in pair]
        if min(trainable) == 0:
            stats.dropped += 1
            continue
        stats.kept += 1
        stats.tokens += sum(len(pair[s]["input_ids"]) for s in pair)
        stats.trainable_tokens += sum(trainable)
        pairs.append(pair)
    return pairs, stats


class PairCollator:
    """B pairs -> one padded batch of 2B rows (chosen rows, then rejected), with the pairs'
    reference log-probabilities under :data:`REFERENCE_KEY` once they are known."""

    def __init__(self, pad_token_id: int) -> None:
        self.pad = PadCollator(pad_token_id)

    def __call__(self, pairs: list[dict[str, Any]]) -> dict[str, Any]:
        import torch

        batch = self.pad([p["chosen"] for p in pairs] + [p["rejected"] for p in pairs])
        if all("reference" in p for p in pairs):
            batch[REFERENCE_KEY] = torch.tensor(
                [p["reference"][0] for p in pairs] + [p["reference"][1] for p in pairs],
                dtype=torch.float32,
            )
        return batch


# --- log-probabilities and the loss -----------------------------------------------------------


def sequence_logps(model: Any, batch: dict[str, Any]) -> Any:
    """Each row's summed log-probability of its labelled tokens (float32), one row at a time
    through the log-softmax so only one row's vocabulary-wide floats exist at once."""
    import torch

    logits = model(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False
    ).logits
    labels = batch["labels"][:, 1:].to(logits.device)
    sums = []
    for row in range(logits.shape[0]):
        scores = logits[row, :-1, :].float()
        target = labels[row]
        trained = target != IGNORE_INDEX
        picked = scores.gather(-1, target.clamp(min=0).unsqueeze(-1)).squeeze(-1)
        token_logps = picked - torch.logsumexp(scores, dim=-1)
        sums.append((token_logps * trained).sum())
    return torch.stack(sums)


def attach_reference(
    model: Any, pairs: list[dict[str, Any]], collator: Any, batch_size: int
) -> None:
    """Store the starting model's log-probabilities of each pair's replies on the pair (eval
    mode: no dropout; no gradients)."""
    import torch

    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    try:
        with torch.no_grad():
            for first in range(0, len(pairs), batch_size):
                chunk = pairs[first : first + batch_size]
                batch = {k: v.to(device) for k, v in collator(chunk).items() if k != REFERENCE_KEY}
                logps = sequence_logps(model, batch).tolist()
                for i, pair in enumerate(chunk):
                    pair["reference"] = (logps[i], logps[len(chunk) + i])
    finally:
        model.train(was_training)


@dataclass
class PairStats:
    """Sums over some pairs: the rewards of each side and how many pairs the chosen one won."""

    pairs: int = 0
    chosen: float = 0.0
    rejected: float = 0.0
    won: int = 0
    chosen_logps: float = 0.0
    rejected_logps: float = 0.0

    def add(self, chosen: Any, rejected: Any, chosen_logps: Any, rejected_logps: Any) -> None:
        self.pairs += int(chosen.numel())
        self.chosen += float(chosen.sum())
        self.rejected += float(rejected.sum())
        self.won += int((chosen > rejected).sum())
        self.chosen_logps += float(chosen_logps.sum())
        self.rejected_logps += float(rejected_logps.sum())

    def means(self, prefix: str = "") -> dict[str, float]:
        """The means as trl names them (``prefix`` before each); nothing without pairs."""
        if not self.pairs:
            return {}
        n = self.pairs
        out = {
            f"{prefix}rewards/chosen": self.chosen / n,
            f"{prefix}rewards/rejected": self.rejected / n,
            f"{prefix}rewards/margins": (self.chosen - self.rejected) / n,
            f"{prefix}rewards/accuracies": self.won / n,
            f"{prefix}logps/chosen": self.chosen_logps / n,
            f"{prefix}logps/rejected": self.rejected_logps / n,
        }
        return {k: round(v, 6) for k, v in out.items()}


def dpo_loss(logps: Any, reference: Any, beta: float) -> tuple[Any, Any, Any]:
    """The batch's mean sigmoid DPO loss and each pair's chosen and rejected rewards, from the
    rows' log-probabilities under the policy and the reference (chosen rows first)."""
    import torch

    pairs = logps.shape[0] // 2
    ratios = logps - reference.to(logps.device)
    chosen, rejected = beta * ratios[:pairs], beta * ratios[pairs:]
    loss = -torch.nn.functional.logsigmoid(chosen - rejected).mean()
    return loss, chosen.detach(), rejected.detach()


def dpo_trainer(base: type[Any], beta: float) -> type[Any]:
    """``base`` (a ``transformers.Trainer``) training with the DPO loss on :class:`PairCollator`
    batches, logging the rewards with each training loss and each evaluation pass."""

    class DPOTrainer(base):  # type: ignore[misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            # The loss is a mean over the micro-batch's pairs: the Trainer divides it by the
            # accumulation steps itself only when told the model does not.
            self.model_accepts_loss_kwargs = False
            self.train_pairs = PairStats()
            self.eval_pairs = PairStats()

        def compute_loss(
            self,
            model: Any,
            inputs: dict[str, Any],
            return_outputs: bool = False,
            *args: Any,
            **kwargs: Any,
        ) -> Any:
            reference = inputs.pop(REFERENCE_KEY)
            logps = sequence_logps(model, inputs)
            loss, chosen, rejected = dpo_loss(logps, reference, beta)
            stats = self.train_pairs if model.training else self.eval_pairs
            half = logps.shape[0] // 2
            stats.add(chosen, rejected, logps[:half].detach(), logps[half:].detach())
            return (loss, {"loss": loss}) if return_outputs else loss

        def log(self, logs: dict[str, float], *args: Any, **kwargs: Any) -> None:
            if "loss" in logs:
                logs.update(self.train_pairs.means())
                self.train_pairs = PairStats()
            super().log(logs, *args, **kwargs)

        def evaluation_loop(self, *args: Any, **kwargs: Any) -> Any:
            self.eval_pairs = PairStats()  # a pass counts its own pairs only
            output = super().evaluation_loop(*args, **kwargs)
            prefix = kwargs.get("metric_key_prefix", "eval")
            output.metrics.update(self.eval_pairs.means(f"{prefix}_"))
            return output

    return DPOTrainer
