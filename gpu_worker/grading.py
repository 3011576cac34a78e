"""Graded checkpoints: the job's eval items answered and scored inside the attempt, and the
choice of which checkpoint becomes the job's adapter.

With ``evals`` in the spec, each item's conversation is answered greedily (at most
``max_tokens`` new tokens) by the model being trained, already in memory: once before the first
step (the starting model, so a score says whether training helped) and at every saved
checkpoint, then once more at the end. Each answer is scored by the job's grader
(trainhub_contract.graders) against the item's reference field; the mean is the step's
``eval_score``, reported as a log event at that step, which is how the control plane finds it
for each checkpoint.

``checkpoint_selection`` picks the adapter: ``last`` (OpenAI's rule), ``best_eval`` (the
highest eval_score) or ``best_valid_loss`` (the lowest loss on the validation sample; a
validation pass then runs at every checkpoint). Candidates are the saved checkpoints and the
final step; the best one's adapter weights are kept in memory (an adapter is small), written
into every checkpoint the run ships so that a resumed attempt still knows them, and put back
into the model before it is packaged when the final step is not the best.

A job that asks for selection or evals checkpoints at least every evaluation interval (the
Trainer's ``eval_steps``), so there are points to choose from.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpu_worker.errors import INVALID_DATASET, ExecutorError
from trainhub_contract.graders import passed, score

if TYPE_CHECKING:
    from gpu_worker.report import Reporter
    from trainhub_contract.spec import Evals, JobSpec

MAX_EVAL_ITEMS = 500  # each is a generation at every checkpoint; the API refuses more
SELECTION_STATE = "trainhub_selection.json"  # written into each checkpoint folder
BEST_WEIGHTS = "trainhub_best_adapter.safetensors"


@dataclass(frozen=True)
class EvalItem:
    messages: list[dict[str, Any]]
    tools: list[Any] | None
    reference: str


def eval_items(records: list[dict[str, Any]], evals: Evals) -> list[EvalItem]:
    """The items of an eval file; ExecutorError names the first one the grader cannot score."""
    field = evals.grader.reference_field
    if len(records) > MAX_EVAL_ITEMS:
        raise ExecutorError(
            INVALID_DATASET, f"the evals file has {len(records)} items; at most {MAX_EVAL_ITEMS}"
        )
    items = []
    for number, record in enumerate(records, start=1):
        reference = record.get(field)
        if not isinstance(reference, str):
            raise ExecutorError(
                INVALID_DATASET,
                f"evals item {number} has no string {field!r}, which the grader "
                f"{evals.grader.name!r} compares answers with",
            )
        prompt = record["input"]
        items.append(EvalItem(prompt["messages"], prompt.get("tools"), reference))
    return items


def answers(
    model: Any, tokenizer: Any, items: list[EvalItem], max_tokens: int, batch_size: int
) -> list[str]:
    """Greedy answers to ``items``, batched with left padding (generation continues from the
    right edge), special tokens dropped. The model is put in eval mode and back."""
    import torch

    from gpu_worker.backends import generation_mode
    from gpu_worker.formatting import pad_token_id

    was_training, side = model.training, tokenizer.padding_side
    model.eval()
    tokenizer.padding_side = "left"
    pad = pad_token_id(tokenizer)
    device = next(model.parameters()).device
    out: list[str] = []
    try:
        with torch.no_grad(), generation_mode(model):
            for first in range(0, len(items), batch_size):
                chunk = items[first : first + batch_size]
                prompts = [
                    list(
                        tokenizer.apply_chat_template(
                            item.messages, tools=item.tools, tokenize=True,
                            add_generation_prompt=True, return_dict=True,
                        )["input_ids"]
                    )
                    for item in chunk
                ]  # fmt: skip
                width = max(len(p) for p in prompts)
                ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=device)
                mask = torch.tensor(
                    [[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device
                )
                generated = model.generate(
                    input_ids=ids,
                    attention_mask=mask,
                    max_new_tokens=max_tokens,
                    do_sample=False,
                    use_cache=True,
                    pad_token_id=pad,
                )
                for row in generated[:, width:].tolist():
                    out.append(tokenizer.decode(row, skip_special_tokens=True).strip())
    finally:
        tokenizer.padding_side = side
        model.train(was_training)
    return out


@dataclass
class Candidate:
    """A point the adapter may be taken from, with what it scored."""

    step: int
    eval_score: float | None = None
    valid_loss: float | None = None
    adapter_sha256: str | None = None  # the checkpoint's adapter file; None for the final step


class GradedCheckpoints:
    """Scores (when the spec has evals) and the best candidate (for checkpoint_selection)."""

    def __init__(
        self,
        *,
        evals: Evals | None,
        items: list[EvalItem],
        tokenizer: Any,
        selection: str,
        reporter: Reporter,
        batch_size: int,
    ) -> None:
        self.evals = evals
        self.items = items
        self.tokenizer = tokenizer
        self.selection = selection
        self.reporter = reporter
        self.batch_size = batch_size
        self.best: Candidate | None = None
        self.best_weights: dict[str, Any] | None = None
        self.valid_loss: tuple[int, float] | None = None  # the newest sample pass: step, loss

    @classmethod
    def for_spec(
        cls, spec: JobSpec, items: list[EvalItem], tokenizer: Any, reporter: Reporter
    ) -> GradedCheckpoints | None:
        """The run's graded checkpoints, or None when the job has neither evals nor a
        selection other than the last step."""
        if spec.evals is None and spec.checkpoint_selection == "last":
            return None
        return cls(
            evals=spec.evals,
            items=items,
            tokenizer=tokenizer,
            selection=spec.checkpoint_selection,
            reporter=reporter,
            batch_size=spec.hyperparameters.batch_size,
        )

    @property
    def evaluates_at_checkpoints(self) -> bool:
        """A validation pass at each checkpoint gives best_valid_loss its figures."""
        return self.selection == "best_valid_loss"

    def note_valid_loss(self, step: int, loss: float) -> None:
        self.valid_loss = (step, loss)

    def grade(self, model: Any, step: int, where: str) -> float | None:
        """Answer and score the eval items now; reports the score at ``step``."""
        if self.evals is None or not self.items:
            return None
        grader = self.evals.grader
        said = answers(model, self.tokenizer, self.items, self.evals.max_tokens, self.batch_size)
        grades = [
            score(grader, a, item.reference) for a, item in zip(said, self.items, strict=True)
        ]
        mean = sum(grades) / len(grades)
        passes = sum(1 for g in grades if passed(grader, g))
        self.reporter.log(
            f"Eval {grader.name!r} ({where}): {mean:.4f} over {len(grades)} items, "
            f"{passes} passed.",
            step=step,
            eval_score=round(mean, 6),
            eval_passed=passes,
            eval_items=len(grades),
            eval_example=said[0][:200],
        )
        return mean

    def at_checkpoint(self, model: Any, step: int, folder: Path, *, grade: bool = True) -> None:
        """Grade the checkpoint in ``folder`` (unless told not to), keep it if it is the best,
        and write what a resumed attempt needs to go on choosing into the folder before it is
        shipped."""
        from gpu_worker.checkpoints import file_sha256

        weights = folder / "adapter_model.safetensors"
        candidate = Candidate(
            step=step,
            eval_score=self.grade(model, step, f"checkpoint at step {step}") if grade else None,
            valid_loss=self._valid_loss_at(step),
            adapter_sha256=file_sha256(weights) if weights.exists() else None,
        )
        self._consider(candidate, model)
        if self.best is not None and self.best_weights is not None:
            from safetensors.torch import save_file

            save_file(self.best_weights, str(folder / BEST_WEIGHTS))
            (folder / SELECTION_STATE).write_text(json.dumps(asdict(self.best)))

    def resume(self, folder: Path) -> None:
        """Pick up the best candidate so far from the checkpoint a run resumes from."""
        state, weights = folder / SELECTION_STATE, folder / BEST_WEIGHTS
        if not (state.exists() and weights.exists()):
            return
        from safetensors.torch import load_file

        self.best = Candidate(**json.loads(state.read_text()))
        self.best_weights = load_file(str(weights))

    def finish(self, model: Any, step: int) -> Candidate | None:
        """Grade the final step, then put the chosen candidate's weights into ``model``.
        Returns the chosen candidate (None when the selection is ``last``)."""
        final = Candidate(
            step=step,
            eval_score=self.grade(model, step, "after the last step"),
            valid_loss=self._valid_loss_at(step),
        )
        if self.selection == "last":
            return None
        self._consider(final, model, keep_weights=False)
        if self.best is None:
            self.reporter.log(
                f"checkpoint_selection {self.selection}: no candidate had a figure to compare; "
                "the adapter is the last step's.",
                "warning",
            )
            return None
        if self.best is not final and self.best_weights is not None:
            from peft import set_peft_model_state_dict

            set_peft_model_state_dict(model, self.best_weights)
        figure = _figure(self.best, self.selection)
        self.reporter.log(
            f"checkpoint_selection {self.selection}: the adapter is the one of step "
            f"{self.best.step} ({figure}).",
            step=self.best.step,
            selected_step=self.best.step,
            selected_adapter_sha256=self.best.adapter_sha256,
        )
        return self.best

    def _valid_loss_at(self, step: int) -> float | None:
        return self.valid_loss[1] if self.valid_loss and self.valid_loss[0] == step else None

    def _consider(self, candidate: Candidate, model: Any, *, keep_weights: bool = True) -> None:
        if self.selection == "last" or not _better(candidate, self.best, self.selection):
            return
        self.best = candidate
        if keep_weights:
            from peft import get_peft_model_state_dict

            self.best_weights = {
                k: v.detach().to("cpu", copy=True).contiguous()
                for k, v in get_peft_model_state_dict(model).items()
            }


def _key(candidate: Candidate, selection: str) -> float | None:
    value = candidate.eval_score if selection == "best_eval" else candidate.valid_loss
    if value is None or not math.isfinite(value):
        return None
    return value if selection == "best_eval" else -value


def _better(candidate: Candidate, best: Candidate | None, selection: str) -> bool:
    """Higher score or lower loss; a tie goes to the later step (trained longer)."""
    mine = _key(candidate, selection)
    if mine is None:
        return False
    theirs = _key(best, selection) if best is not None else None
    return theirs is None or mine >= theirs


def _figure(candidate: Candidate, selection: str) -> str:
    if selection == "best_eval":
        return f"eval_score {candidate.eval_score:.4f}"
    return f"valid_loss {candidate.valid_loss:.4f}"
