"""Mean token accuracy, the figure OpenAI reports beside the loss: of the tokens trained on
(labels not -100), the share whose next-token prediction (the argmax of the logits one position
before) is the label. Counted per token over every micro-batch of a logged training step, and
over a whole evaluation pass, so neither is a mean of batch means.

An evaluation pass's loss is counted the same way here, the cross-entropy summed over its
tokens and divided by their number: a figure that does not depend on how the pass was batched
or packed (the Trainer's own averages batch means, weighted by rows).

A backend that hands back no logits (Unsloth's fused loss returns none unless asked) gives no
accuracy, and the Trainer's own evaluation loss stands: None or the Trainer's, never a guess.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

IGNORE_INDEX = -100  # transformers' label for a token that is not trained on


@dataclass
class TokenStats:
    """Counts over some batches: tokens trained on, those predicted right, their summed loss."""

    counted: int = 0
    correct: int = 0
    loss_sum: float = 0.0

    def add(self, other: TokenStats) -> None:
        self.counted += other.counted
        self.correct += other.correct
        self.loss_sum += other.loss_sum

    @property
    def accuracy(self) -> float | None:
        return self.correct / self.counted if self.counted else None

    @property
    def loss(self) -> float | None:
        return self.loss_sum / self.counted if self.counted else None

    def take(self) -> TokenStats:
        """These counts, and start afresh."""
        taken = TokenStats(self.counted, self.correct, self.loss_sum)
        self.counted, self.correct, self.loss_sum = 0, 0, 0.0
        return taken


def batch_stats(logits: Any, labels: Any, *, with_loss: bool = False) -> TokenStats:
    """One batch: logits [batch, seq, vocab], labels [batch, seq] unshifted, as the model takes
    them (the token at i is predicted at i - 1). Empty without logits that match the labels.
    ``with_loss`` (evaluation: no graph to keep) also sums the cross-entropy, in float32."""
    if logits is None or labels is None or tuple(logits.shape[:2]) != tuple(labels.shape):
        return TokenStats()
    import torch

    with torch.no_grad():
        scores = logits[:, :-1, :]
        target = labels[:, 1:].to(scores.device)
        trained = target != IGNORE_INDEX
        correct = (scores.argmax(dim=-1) == target) & trained
        loss_sum = 0.0
        if with_loss:
            loss_sum = torch.nn.functional.cross_entropy(
                scores.float().reshape(-1, scores.shape[-1]),
                target.reshape(-1),
                ignore_index=IGNORE_INDEX,
                reduction="sum",
            ).item()
    return TokenStats(int(trained.sum().item()), int(correct.sum().item()), float(loss_sum))


def accuracy_trainer(base: type[Any]) -> type[Any]:
    """``base`` (a ``transformers.Trainer``) that logs ``mean_token_accuracy`` with each
    training loss, and ``<prefix>_loss`` and ``<prefix>_mean_token_accuracy`` per token for
    each evaluation pass."""

    class AccuracyTrainer(base):  # type: ignore[misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.train_tokens = TokenStats()
            self.eval_tokens = TokenStats()

        def compute_loss(
            self,
            model: Any,
            inputs: dict[str, Any],
            return_outputs: bool = False,
            *args: Any,
            **kwargs: Any,
        ) -> Any:
            labels = inputs.get("labels")  # before the Trainer may pop them
            loss, outputs = super().compute_loss(model, inputs, True, *args, **kwargs)
            logits = outputs.get("logits") if hasattr(outputs, "get") else None
            if model.training:
                self.train_tokens.add(batch_stats(logits, labels))
            else:
                self.eval_tokens.add(batch_stats(logits, labels, with_loss=True))
            return (loss, outputs) if return_outputs else loss

        def log(self, logs: dict[str, float], *args: Any, **kwargs: Any) -> None:
            if "loss" in logs:
                accuracy = self.train_tokens.take().accuracy
                if accuracy is not None:
                    logs["mean_token_accuracy"] = round(accuracy, 6)
            super().log(logs, *args, **kwargs)

        def evaluation_loop(self, *args: Any, **kwargs: Any) -> Any:
            self.eval_tokens.take()  # a pass counts its own batches only
            output = super().evaluation_loop(*args, **kwargs)
            prefix = kwargs.get("metric_key_prefix", "eval")
            stats = self.eval_tokens.take()
            if stats.accuracy is not None:
                output.metrics[f"{prefix}_loss"] = stats.loss
                output.metrics[f"{prefix}_mean_token_accuracy"] = round(stats.accuracy, 6)
            return output

    return AccuracyTrainer
