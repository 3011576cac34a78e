"""What the throughput figures count, per run (metrics events, the job's final metrics, the bench):

- ``tokens`` (reported as ``trained_tokens``, rate ``tokens_per_second``): input tokens that are
  not padding, prompt and response alike; what OpenAI bills as trained tokens, and what
  ``trained_tokens`` has always meant here.
- ``useful`` (``useful_tokens``, ``useful_tokens_per_second``): tokens whose prediction carries
  loss (label != -100 after the causal shift): the work the run exists for.
- ``positions``: every position the model computed, padding included; ``padding_share`` is the
  part of them that was padding.

Counted per micro-batch as the Trainer computes its loss (so gradient accumulation adds up every
micro-batch, evaluation counts nothing), added to the run's totals when the optimizer step
finishes (a step cut short by a stop is not counted), and saved in every checkpoint's
``trainer_state.json`` (the Trainer's ``stateful_callbacks``), so a resumed run continues the
counts instead of restarting them. The Trainer's own ``num_input_tokens_seen`` is kept equal to
``tokens``: it cannot see the real tokens of a packed row (there is no attention mask).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from gpu_worker.formatting import IGNORE_INDEX

# A collator whose batch has no attention mask says how many of its positions are real tokens
# under this key; the trainer removes it before the batch reaches the model.
REAL_TOKENS_KEY = "trainhub_real_tokens"
_STATE_NAME = "TokenCounter"  # the callback's class name: the Trainer files its state under it


@dataclass
class TokenCounts:
    tokens: int = 0
    useful: int = 0
    positions: int = 0

    def add(self, other: TokenCounts) -> None:
        self.tokens += other.tokens
        self.useful += other.useful
        self.positions += other.positions

    def copy(self) -> TokenCounts:
        return replace(self)

    def minus(self, other: TokenCounts) -> TokenCounts:
        return TokenCounts(
            self.tokens - other.tokens, self.useful - other.useful, self.positions - other.positions
        )

    @property
    def padding_share(self) -> float | None:
        if not self.positions:
            return None
        return round((self.positions - self.tokens) / self.positions, 4)


def batch_counts(batch: dict[str, Any]) -> TokenCounts:
    """The counts of one collated batch; takes :data:`REAL_TOKENS_KEY` out of it."""
    labels = batch["labels"]
    positions = int(labels.numel())
    real = batch.pop(REAL_TOKENS_KEY, None)
    if real is None:
        mask = batch.get("attention_mask")
        real = int(mask.sum()) if mask is not None else positions
    # Position 0 of a row never carries loss: the model predicts position i from tokens < i.
    useful = int((labels[..., 1:] != IGNORE_INDEX).sum())
    return TokenCounts(tokens=int(real), useful=useful, positions=positions)


def make_token_counter() -> Any:
    """The callback holding the run's :class:`TokenCounts` (``total``: finished steps;
    ``session_start``: where this attempt began, for rates)."""
    from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
    from transformers.trainer_callback import ExportableState

    class TokenCounter(TrainerCallback, ExportableState):
        def __init__(self) -> None:
            self.total = TokenCounts()
            self.pending = TokenCounts()  # micro-batches of the step in progress
            self.session_start = TokenCounts()

        def state(self) -> dict[str, Any]:
            return {"args": {}, "attributes": asdict(self.total)}

        def on_train_begin(
            self,
            args: TrainingArguments,
            state: TrainerState,
            control: TrainerControl,
            **kwargs: Any,
        ) -> None:
            # A dict once the Trainer built or loaded the state (typed as the list it starts as).
            filed: Any = state.stateful_callbacks
            saved = filed.get(_STATE_NAME) if isinstance(filed, dict) else None
            if isinstance(saved, dict) and isinstance(saved.get("attributes"), dict):
                self.total = TokenCounts(**saved["attributes"])
            elif state.num_input_tokens_seen:
                # A checkpoint from an executor that counted only the Trainer's tokens.
                seen = int(state.num_input_tokens_seen)
                self.total = TokenCounts(tokens=seen, positions=seen)
            # The Trainer writes this entry into every checkpoint; an older checkpoint lacks it.
            if isinstance(filed, dict):
                filed[_STATE_NAME] = self.state()
            self.pending = TokenCounts()
            self.session_start = self.total.copy()
            state.num_input_tokens_seen = self.total.tokens

        def on_step_end(
            self,
            args: TrainingArguments,
            state: TrainerState,
            control: TrainerControl,
            **kwargs: Any,
        ) -> None:
            self.total.add(self.pending)
            self.pending = TokenCounts()
            state.num_input_tokens_seen = self.total.tokens

    return TokenCounter()


def counting_trainer(base: type[Any], counter: Any) -> type[Any]:
    """``base`` (a ``transformers.Trainer``) that adds each training micro-batch to
    ``counter.pending`` as its loss is computed, and keeps the count key from the model."""

    class CountingTrainer(base):  # type: ignore[misc]
        def compute_loss(
            self, model: Any, inputs: dict[str, Any], *args: Any, **kwargs: Any
        ) -> Any:
            counts = batch_counts(inputs)
            if model.training:
                counter.pending.add(counts)
            return super().compute_loss(model, inputs, *args, **kwargs)

    return CountingTrainer
