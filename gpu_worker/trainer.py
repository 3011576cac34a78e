"""The Trainer side of a run: the stop guard, the one progress callback, and the Trainer
built the same way for both backends (so the code CI runs on CPU is the code a GPU runs)."""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpu_worker import backends, checkpoints
from gpu_worker.backends.loading import is_oom
from gpu_worker.errors import (
    CANCELLED,
    OOM,
    PREEMPTED,
    TIMEOUT,
    Cancelled,
    ExecutorError,
    Preempted,
)
from gpu_worker.grading import GradedCheckpoints
from gpu_worker.packing import choose_batching
from gpu_worker.preference import PREFERENCE_METRICS, attach_reference, dpo_trainer
from gpu_worker.token_accuracy import accuracy_trainer
from gpu_worker.token_counts import TokenCounts, counting_trainer, make_token_counter
from trainhub_contract.outcomes import StopMode

if TYPE_CHECKING:
    from gpu_worker.report import Reporter
    from trainhub_contract.spec import JobSpec

log = logging.getLogger(__name__)
# The periodic validation pass (valid_loss, as OpenAI reports it) runs on a fixed sample of the
# validation file, the same examples each time so the points compare; every tenth of the run
# unless the job sets eval_interval. The whole file is evaluated once, at the end.
VALID_SAMPLE_EXAMPLES = 64
AUTO_EVAL_FRACTION = 0.1


# What the executor polls for a stop: falsy to go on; truthy to stop; StopMode.PAUSE to stop
# after saving a checkpoint; StopMode.PREEMPT to do the same and end as preempted.
StopProbe = Callable[[], "bool | StopMode | None"]


class StopGuard:
    """Answers "should training stop, and why" (cancel request, preemption or max_runtime);
    sticky. ``mode``: how the stop was asked; a pause or a preemption checkpoints the last
    finished step first (``saves_checkpoint``)."""

    def __init__(self, should_stop: StopProbe | None, max_runtime: float) -> None:
        self._should_stop = should_stop
        self.max_runtime = max_runtime
        self.started = time.monotonic()
        self.deadline = self.started + max_runtime
        self.reason: str | None = None
        self.mode: StopMode | None = None

    @property
    def pausing(self) -> bool:
        return self.mode is StopMode.PAUSE

    @property
    def saves_checkpoint(self) -> bool:
        return self.mode is not None and self.mode.saves_checkpoint

    def check(self) -> str | None:
        if self.reason is None:
            try:
                requested = self._should_stop() if self._should_stop else None
            except Exception:  # a broken probe must not kill a training run
                log.exception("should_stop() raised; treated as not stopping")
                requested = None
            if requested:
                self.mode = StopMode.CANCEL  # True, or any value it does not know
                if isinstance(requested, str) and requested in tuple(StopMode):
                    self.mode = StopMode(requested)
                self.reason = PREEMPTED if self.mode is StopMode.PREEMPT else CANCELLED
            elif time.monotonic() >= self.deadline:
                self.reason = TIMEOUT
        return self.reason

    def raise_if_stopped(self, where: str, step: int | None = None) -> None:
        reason = self.check()
        if reason == PREEMPTED:
            at = f" after step {step}" if step is not None else ""
            raise Preempted(f"Preempted {where}{at}.")
        if reason == CANCELLED and self.pausing:
            at = f" after step {step}" if step is not None else ""
            raise Cancelled(f"Paused {where}{at}.")
        if reason == CANCELLED:
            raise Cancelled(f"Cancelled {where}.")
        if reason == TIMEOUT:
            at = f" at step {step}" if step is not None else f" {where}"
            raise ExecutorError(
                TIMEOUT,
                f"max_runtime_seconds={int(self.max_runtime)} ran out{at}; raise "
                "max_runtime_seconds or shorten the job (fewer epochs or examples, smaller "
                "max_seq_length)",
            )


def make_callback(
    reporter: Reporter,
    stop: StopGuard,
    checkpointer: checkpoints.Checkpointer,
    counter: Any,
    graded: GradedCheckpoints | None = None,
) -> Any:
    """``counter``: the run's token counter (gpu_worker.token_counts), registered before this
    callback so that its totals are current when this one reads them. ``graded``: the job's
    evals and checkpoint selection (gpu_worker.grading), when it has either."""
    from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

    class ExecutorCallback(TrainerCallback):
        """Progress metrics, stop requests and checkpoints: the one hook into the Trainer."""

        def __init__(self) -> None:
            self.stop_reason: str | None = None
            self.counter = counter
            self.batching = ""  # gpu_worker.packing mode, for the final metrics
            self._t = time.monotonic()
            self._last = TokenCounts()

        def on_train_begin(
            self,
            args: TrainingArguments,
            state: TrainerState,
            control: TrainerControl,
            **kwargs: Any,
        ) -> None:
            # After a resume the counter already holds the earlier attempts' tokens.
            self._t, self._last = time.monotonic(), counter.session_start
            if graded is not None:  # points to choose from: a checkpoint every eval interval
                every = state.eval_steps or args.eval_steps or AUTO_EVAL_FRACTION
                steps = math.ceil(state.max_steps * every) if every < 1 else int(every)
                checkpointer.every_steps = max(1, min(checkpointer.every_steps, steps))

        def on_log(
            self,
            args: TrainingArguments,
            state: TrainerState,
            control: TrainerControl,
            logs: dict[str, float] | None = None,
            **kwargs: Any,
        ) -> None:
            logs = logs or {}
            if "loss" in logs:
                now, total = time.monotonic(), counter.total
                done, seconds = total.minus(self._last), now - self._t
                self._t, self._last = now, total.copy()
                reporter.metrics(
                    step=state.global_step,
                    total_steps=state.max_steps,
                    epoch=round(float(state.epoch or 0.0), 4),
                    loss=float(logs["loss"]),
                    mean_token_accuracy=to_float(logs.get("mean_token_accuracy")),
                    lr=float(logs.get("learning_rate", 0.0)),
                    grad_norm=to_float(logs.get("grad_norm")),
                    tokens_per_second=rate(done.tokens, seconds) or 0.0,
                    useful_tokens_per_second=rate(done.useful, seconds) or 0.0,
                    trained_tokens=total.tokens,
                    useful_tokens=total.useful,
                    padding_share=total.padding_share,
                    **{name: float(logs[name]) for name in PREFERENCE_METRICS if name in logs},
                )
            if "eval_loss" in logs:
                if graded is not None:
                    graded.note_valid_loss(state.global_step, float(logs["eval_loss"]))
                reporter.log(
                    f"Validation loss {logs['eval_loss']:.4f} at step {state.global_step}"
                    + _accuracy_note(logs.get("eval_mean_token_accuracy"))
                    + " (a sample of the validation file).",
                    step=state.global_step,
                    eval_loss=float(logs["eval_loss"]),
                    eval_mean_token_accuracy=to_float(logs.get("eval_mean_token_accuracy")),
                    **_preference_figures(logs, "eval_"),
                )
            if "full_valid_loss" in logs:
                reporter.log(
                    f"Validation loss {logs['full_valid_loss']:.4f} over the whole validation "
                    f"file after step {state.global_step}"
                    + _accuracy_note(logs.get("full_valid_mean_token_accuracy"))
                    + ".",
                    step=state.global_step,
                    full_valid_loss=float(logs["full_valid_loss"]),
                    full_valid_mean_token_accuracy=to_float(
                        logs.get("full_valid_mean_token_accuracy")
                    ),
                    **_preference_figures(logs, "full_valid_"),
                )

        def _check_stop(self, control: TrainerControl, state: TrainerState) -> str | None:
            reason = stop.check()
            if reason is not None:
                self.stop_reason = reason
                control.should_training_stop = True
                # A pause or a preemption keeps the work done: the Trainer saves the last
                # finished step (on_save ships it) before it exits; once per step, and never a
                # step already shipped.
                control.should_save = (
                    stop.saves_checkpoint and state.global_step > checkpointer.last_step
                )
                control.should_evaluate = False
            return reason

        def on_step_end(
            self,
            args: TrainingArguments,
            state: TrainerState,
            control: TrainerControl,
            **kwargs: Any,
        ) -> TrainerControl:
            if self._check_stop(control, state) is None and checkpointer.due(
                state.global_step, state.max_steps
            ):
                control.should_save = True
                # The Trainer evaluates before it saves: the checkpoint's own valid_loss.
                if graded is not None and graded.evaluates_at_checkpoints:
                    control.should_evaluate = args.eval_strategy != "no"
            return control

        def on_substep_end(
            self,
            args: TrainingArguments,
            state: TrainerState,
            control: TrainerControl,
            **kwargs: Any,
        ) -> TrainerControl:
            # Mid-accumulation: drop the partial step. A pause's (or preemption's) save comes
            # at the epoch end the Trainer runs next: of the last finished step, consistent.
            self._check_stop(control, state)
            return control

        def on_epoch_end(
            self,
            args: TrainingArguments,
            state: TrainerState,
            control: TrainerControl,
            **kwargs: Any,
        ) -> TrainerControl:
            self._check_stop(control, state)  # no end-of-epoch evaluation once stopping
            return control

        def on_save(
            self,
            args: TrainingArguments,
            state: TrainerState,
            control: TrainerControl,
            **kwargs: Any,
        ) -> TrainerControl:
            if args.output_dir is None:  # build_trainer always sets one
                raise RuntimeError("TrainingArguments.output_dir is unset: no checkpoint to ship")
            folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            if graded is not None:  # a pause or preemption saves without waiting for answers
                graded.at_checkpoint(
                    kwargs["model"], state.global_step, folder, grade=stop.reason is None
                )
            checkpointer.ship(folder, state.global_step)
            return control

    return ExecutorCallback()


def _preference_figures(logs: dict[str, float], prefix: str) -> dict[str, Any]:
    """A dpo evaluation pass's rewards, under the pass's prefix (none for supervised jobs)."""
    return {
        f"{prefix}{name}": float(logs[f"{prefix}{name}"])
        for name in PREFERENCE_METRICS
        if f"{prefix}{name}" in logs
    }


def _accuracy_note(accuracy: object) -> str:
    value = to_float(accuracy)
    return f", token accuracy {value:.1%}" if value is not None else ""


def validation_sample(examples: list[Any], seed: int) -> list[Any]:
    """At most VALID_SAMPLE_EXAMPLES of ``examples``, drawn once with the job's seed."""
    if len(examples) <= VALID_SAMPLE_EXAMPLES:
        return examples
    draw = random.Random(seed)  # noqa: S311 - a reproducible sample, not a secret
    picked = sorted(draw.sample(range(len(examples)), VALID_SAMPLE_EXAMPLES))
    return [examples[i] for i in picked]


def rate(tokens: int, seconds: float | None) -> float | None:
    return round(tokens / seconds, 1) if seconds and seconds > 0 else None


def to_float(value: Any) -> float | None:
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


def build_trainer(
    spec: JobSpec,
    model: Any,
    tokenizer: Any,
    train_examples: list[dict[str, Any]],
    eval_examples: list[dict[str, Any]] | None,
    *,
    max_len: int,
    run_dir: Path,
    reporter: Reporter,
    stop: StopGuard,
    extra_callbacks: Iterable[Any],
    checkpointer: checkpoints.Checkpointer,
    graded: GradedCheckpoints | None = None,
) -> tuple[Any, Any]:
    """The Trainer for this run and its :func:`make_callback` callback. ``max_len``: the
    sequence length examples were truncated to, also the length of a packed row."""
    import torch
    from transformers import PrinterCallback, Trainer, TrainingArguments

    hp = spec.hyperparameters
    dpo = spec.method == "dpo"
    precision = backends.precision()
    batching = choose_batching(spec, model, tokenizer, max_len, backends.select_backend())
    reporter.log(batching.note, "warning" if batching.warning else "info", batching=batching.mode)
    args = TrainingArguments(
        output_dir=str(run_dir / "trainer"),
        per_device_train_batch_size=hp.batch_size,
        per_device_eval_batch_size=hp.batch_size,
        gradient_accumulation_steps=hp.gradient_accumulation_steps,
        num_train_epochs=hp.n_epochs,
        learning_rate=hp.learning_rate,
        lr_scheduler_type="linear",
        warmup_steps=hp.warmup_ratio,  # transformers 5: a float < 1 is a ratio of the total steps
        logging_steps=1,
        save_strategy="no",  # checkpoints are ours (ExecutorCallback -> _Checkpointer)
        eval_strategy="steps" if eval_examples else "no",
        eval_steps=hp.eval_interval or AUTO_EVAL_FRACTION,  # a float < 1: a share of the run
        report_to="none",
        use_cpu=not torch.cuda.is_available(),
        seed=spec.seed,
        data_seed=spec.seed,
        remove_unused_columns=False,
        label_names=["labels"],
        include_num_input_tokens_seen="no",  # gpu_worker.token_counts counts (and sets it)
        train_sampling_strategy=batching.sampling,
        gradient_checkpointing=False,  # the backend applied the spec's setting when loading
        disable_tqdm=True,
        dataloader_num_workers=0,
        prediction_loss_only=dpo,  # an evaluation pass of pairs gives a loss, not logits
        bf16=precision["bf16"],
        fp16=precision["fp16"],
    )
    counter = make_token_counter()
    callback = make_callback(reporter, stop, checkpointer, counter, graded)
    callback.batching = batching.mode
    loop = dpo_trainer(Trainer, hp.beta) if dpo else accuracy_trainer(Trainer)
    trainer = counting_trainer(loop, counter)(
        model=model,
        args=args,
        train_dataset=train_examples,  # a list is a map-style dataset
        eval_dataset=validation_sample(eval_examples, spec.seed) if eval_examples else None,
        data_collator=batching.collator,
        callbacks=[counter, callback, *extra_callbacks],
    )
    # With tqdm off the Trainer prints every log dict to stdout; progress goes through the
    # reporter instead (stdout stays clean for the CLI's JSON summary).
    trainer.remove_callback(PrinterCallback)
    if dpo:  # the reference: the model as it starts (gpu_worker.preference)
        started = time.monotonic()
        pairs = train_examples + (eval_examples or [])
        attach_reference(trainer.model, pairs, batching.collator, hp.batch_size)
        reporter.log(
            f"Reference log-probabilities of {len(pairs)} pairs computed in "
            f"{time.monotonic() - started:.1f} s (the model the job starts from; beta {hp.beta}).",
        )
    return trainer, callback


def evaluate_whole(trainer: Any, eval_examples: list[Any] | None) -> dict[str, float | None]:
    """The trained adapter on the whole validation file (the callback reports it):
    ``full_valid_loss`` and ``full_valid_mean_token_accuracy``; nothing without one."""
    if not eval_examples:
        return {}
    found = trainer.evaluate(eval_dataset=eval_examples, metric_key_prefix="full_valid")
    return {
        name: to_float(found.get(name))
        for name in ("full_valid_loss", "full_valid_mean_token_accuracy")
    }


def train_with_oom_hint(trainer: Any, spec: JobSpec, resume_dir: Path | None) -> Any:
    try:
        return trainer.train(resume_from_checkpoint=str(resume_dir) if resume_dir else None)
    except Exception as exc:
        if not is_oom(exc):
            raise
        hp = spec.hyperparameters
        first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
        remedies = [
            "lower batch_size (and raise gradient_accumulation_steps to keep the effective batch "
            "size) or max_seq_length",
            *([] if hp.gradient_checkpointing else ["turn gradient_checkpointing on"]),
            "use the qlora adapter type",
        ]
        raise ExecutorError(
            OOM,
            f"out of memory training with batch_size={hp.batch_size} and "
            f"max_seq_length={hp.max_seq_length} (gradient_accumulation_steps="
            f"{hp.gradient_accumulation_steps}, gradient_checkpointing="
            f"{str(hp.gradient_checkpointing).lower()}): {first}. To fit: "
            + "; or ".join(remedies),
        ) from exc
