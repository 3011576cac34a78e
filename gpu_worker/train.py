"""One training attempt, start to finish: ``run(spec, reporter=..., workdir=...)``.

The same function serves every launcher (``python -m gpu_worker run``, the GPU node's Celery
task, the RunPod handler, SSH). Steps:

1. choose the backend (before transformers/peft are imported), seed everything;
2. download the dataset (and validation dataset, eval items, the parent adapter), verifying
   sha256 while streaming;
3. load model + tokenizer and attach the adapter (backends.load); a job that continues a
   fine-tuned model loads the parent's weights into it (gpu_worker.lineage);
4. tokenize (gpu_worker.formatting; DPO pairs: gpu_worker.preference): loss on
   assistant/response tokens, truncation;
5. train with ``transformers.Trainer`` and ONE callback that reports metrics, checks for a
   stop request after every optimizer step, and uploads a checkpoint every N steps / T seconds
   to the checkpoint slot (latest only); with ``outputs.resume_url`` training continues from that
   checkpoint (global step, optimizer, scheduler, RNG) instead of from zero;
6. with evals or a checkpoint selection (gpu_worker.grading), put the chosen checkpoint's
   weights back; package the adapter bundle (gpu_worker.packaging), PUT it, report its sha256.

On a spot machine (the spec's ``preemption_notice``) a watcher thread checks for the provider's
interruption notice meanwhile (gpu_worker.preemption): once one is up, training stops at the
next step boundary after uploading a checkpoint of the last finished step, and the run ends
``failed`` with reason ``preempted`` (exit 5), which the control plane retries from there.

Every outcome is returned as a :class:`RunResult` and reported as the final ``status`` event;
run() does not raise for training failures. The working directory of the attempt is removed
whatever happens (checkpoints already uploaded stay in the checkpoint slot).

The steps stay together here (about 500 lines) so they read in the order they run; the
trainer, the checkpoints and the packaging are beside them (trainer, checkpoints, packaging).
"""

from __future__ import annotations

import logging
import shutil
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpu_worker import backends, checkpoints, lineage, preemption, transfer
from gpu_worker.backends.loading import is_oom
from gpu_worker.errors import (
    CANCELLED,
    INTERNAL_ERROR,
    INVALID_DATASET,
    OOM,
    PREEMPTED,
    Cancelled,
    ExecutorError,
    Preempted,
    exit_code,
)
from gpu_worker.formatting import (
    FormatError,
    FormatStats,
    encode_examples,
)
from gpu_worker.grading import GradedCheckpoints, eval_items
from gpu_worker.packaging import final_metrics, package_adapter
from gpu_worker.preference import encode_preference
from gpu_worker.trainer import (
    StopGuard,
    StopProbe,
    build_trainer,
    evaluate_whole,
    train_with_oom_hint,
)
from trainhub_contract.bundle import BundleError
from trainhub_contract.datasets import DatasetError, detect_format, iter_examples
from trainhub_contract.outcomes import ExitCode, Outcome, StopMode

if TYPE_CHECKING:
    from gpu_worker.report import Reporter
    from trainhub_contract.spec import DatasetRef, JobSpec

log = logging.getLogger(__name__)

# Checkpoint to the slot every this many optimizer steps or seconds, whichever comes first.
# Not part of the spec: how often to checkpoint is the executor's trade-off (upload cost vs
# work lost on preemption), overridable per run (run() arguments, CLI flags).
DEFAULT_CHECKPOINT_EVERY_STEPS = 200
DEFAULT_CHECKPOINT_EVERY_SECONDS = 900.0


@dataclass(frozen=True)
class RunResult:
    """How an attempt ended.

    ``status``: succeeded, failed or cancelled. ``reason``: an EndReason value (``oom``,
    ``timeout``, ``cancelled``, ``preempted``...; "" on success). For a success, the bundle's
    sha256, size and manifest (``{"format", "files": [{path, size, sha256}]}``), and the
    metrics (metrics.json).
    """

    status: Outcome
    reason: str = ""
    message: str = ""
    bundle_sha256: str = ""
    bundle_size: int = 0
    manifest: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)

    @property
    def exit_code(self) -> ExitCode:
        return exit_code(self.status, self.reason)


def run(
    spec: JobSpec,
    *,
    reporter: Reporter,
    workdir: Path,
    should_stop: StopProbe | None = None,
    callbacks: Sequence[Any] = (),
    checkpoint_every_steps: int = DEFAULT_CHECKPOINT_EVERY_STEPS,
    checkpoint_every_seconds: float | None = DEFAULT_CHECKPOINT_EVERY_SECONDS,
    imds_url: str | None = None,
    preemption_poll_seconds: float | None = None,
) -> RunResult:
    """Run one attempt of ``spec``; report progress and the outcome through ``reporter``.

    ``should_stop`` is polled after every optimizer step (and between download chunks): once it
    returns something true the run stops within one step, removes what it wrote and returns
    ``cancelled``; when that is ``StopMode.PAUSE`` it first uploads a checkpoint of the last
    finished step (if training got past the newest checkpoint); ``StopMode.PREEMPT`` does the
    same and ends ``failed`` with reason ``preempted``. ``callbacks`` are extra
    ``transformers.TrainerCallback`` objects (benchmarks, tests). The caller owns the reporter's
    lifecycle (start/close).

    When the spec (or ``$TRAINHUB_PREEMPTION_NOTICE``) names a provider, a preemption watcher
    checks its metadata service (``imds_url``, else ``$TRAINHUB_IMDS_URL``, else the link-local
    address) every ``preemption_poll_seconds`` (else ``$TRAINHUB_PREEMPTION_POLL_SECONDS``,
    else 5) and stops the run as a preemption on a notice.
    """
    watcher = preemption.watcher_for(
        spec, reporter, base_url=imds_url, interval=preemption_poll_seconds
    )
    stop = StopGuard(_with_watcher(should_stop, watcher), spec.max_runtime_seconds)
    run_dir = Path(workdir) / f"{spec.job_id}-a{spec.attempt}"
    try:
        if watcher is not None:
            watcher.start()
        if run_dir.exists():  # a leftover of an earlier process with the same attempt
            shutil.rmtree(run_dir)
        run_dir.mkdir(parents=True)
        result = _run(
            spec,
            reporter=reporter,
            run_dir=run_dir,
            stop=stop,
            callbacks=callbacks,
            every_steps=checkpoint_every_steps,
            every_seconds=checkpoint_every_seconds,
            watcher=watcher,
        )
    except Preempted as exc:
        result = RunResult(Outcome.FAILED, PREEMPTED, _preempted_message(exc, watcher))
    except Cancelled as exc:
        result = RunResult(Outcome.CANCELLED, CANCELLED, str(exc) or "Cancelled.")
    except ExecutorError as exc:
        result = RunResult(Outcome.FAILED, exc.reason, exc.message)
    except Exception as exc:
        if is_oom(exc):
            result = RunResult(Outcome.FAILED, OOM, f"out of memory: {exc}")
        else:
            log.exception("executor crashed")
            reporter.log(traceback.format_exc()[-3500:], level="error")
            result = RunResult(Outcome.FAILED, INTERNAL_ERROR, f"{type(exc).__name__}: {exc}")
    finally:
        if watcher is not None:
            watcher.stop()
        shutil.rmtree(run_dir, ignore_errors=True)

    if result.status is Outcome.SUCCEEDED:
        reporter.status(
            Outcome.SUCCEEDED,
            f"Training finished; adapter bundle uploaded ({result.bundle_size} bytes).",
            sha256=result.bundle_sha256,
            size=result.bundle_size,
        )
    elif result.status is Outcome.CANCELLED:
        reporter.status(Outcome.CANCELLED, result.message)
    else:
        reporter.status(Outcome.FAILED, result.message, code=result.reason)
    reporter.flush()
    return result


def _with_watcher(
    should_stop: StopProbe | None, watcher: preemption.PreemptionWatcher | None
) -> StopProbe | None:
    """The launcher's stop probe, then the preemption watcher's (a cancel asked at the same
    check wins: it leaves nothing to resume)."""
    if watcher is None:
        return should_stop

    def probe() -> bool | StopMode | None:
        return (should_stop() if should_stop is not None else None) or watcher()

    return probe


def _preempted_message(exc: Preempted, watcher: preemption.PreemptionWatcher | None) -> str:
    text = str(exc).rstrip(".") or "Preempted"
    if watcher is not None and watcher.notice is not None:
        text += f": {watcher.notice.describe(countdown=False)}"
    return f"{text}. The job is retried from its newest checkpoint."


# --- the steps ------------------------------------------------------------------------------


def _run(
    spec: JobSpec,
    *,
    reporter: Reporter,
    run_dir: Path,
    stop: StopGuard,
    callbacks: Sequence[Any],
    every_steps: int,
    every_seconds: float | None,
    watcher: preemption.PreemptionWatcher | None = None,
) -> RunResult:
    backend = backends.select_backend()  # before anything imports transformers/peft
    from transformers import set_seed

    set_seed(spec.seed)
    reporter.log(
        f"Attempt {spec.attempt} of {spec.job_id}: {spec.adapter.type} on {spec.model} "
        f"with the {backend} backend ({backends.backend_note()}).",
        backend=backend,
    )

    _check_method(spec)
    records = _fetch_dataset(spec.dataset, run_dir / "data" / "train.jsonl", "training", stop)
    eval_records = (
        _fetch_dataset(
            spec.validation_dataset, run_dir / "data" / "validation.jsonl", "validation", stop
        )
        if spec.validation_dataset is not None
        else None
    )
    eval_set = []
    if spec.evals is not None:  # checked now, before the model is loaded
        items = _fetch_dataset(spec.evals.ref, run_dir / "data" / "evals.jsonl", "evals", stop)
        eval_set = eval_items(items, spec.evals)
    reporter.log(f"Downloaded the dataset: {len(records)} examples ({spec.dataset.format}).")
    stop.raise_if_stopped("while downloading")

    resume_dir, resume_step = _fetch_resume(spec, run_dir, reporter, stop)
    parent_dir = _fetch_parent(spec, run_dir, stop)

    model, tokenizer = backends.load(spec)
    trainable, total = _param_counts(model)
    reporter.log(
        f"Loaded {spec.model}: {total:,} parameters, {trainable:,} trainable ({spec.adapter.type}, "
        f"r={spec.adapter.r}).",
        trainable_parameters=trainable,
        total_parameters=total,
    )
    if parent_dir is not None and spec.parent_adapter is not None:
        tensors = lineage.load_parent_weights(spec, model, parent_dir)
        reporter.log(
            f"Continuing the parent adapter ({tensors} tensors, sha256 "
            f"{spec.parent_adapter.sha256[:12]}…)."
        )
    stop.raise_if_stopped("while loading the model")

    max_len = _effective_max_len(spec, model, reporter)
    train_examples, stats = _encode(records, spec.dataset, tokenizer, max_len, "training", reporter)
    eval_examples = None
    if eval_records is not None and spec.validation_dataset is not None:
        eval_examples, _ = _encode(
            eval_records, spec.validation_dataset, tokenizer, max_len, "validation", reporter
        )

    graded = GradedCheckpoints.for_spec(spec, eval_set, tokenizer, reporter)
    trainer, callback = build_trainer(
        spec,
        model,
        tokenizer,
        train_examples,
        eval_examples,
        max_len=max_len,
        run_dir=run_dir,
        reporter=reporter,
        stop=stop,
        extra_callbacks=callbacks,
        checkpointer=checkpoints.Checkpointer(
            url=spec.outputs.checkpoint_url,
            scratch=run_dir,
            reporter=reporter,
            every_steps=every_steps,
            every_seconds=every_seconds,
            start_step=resume_step,
            asked=watcher.checkpoint_asked if watcher is not None else None,
        ),
        graded=graded,
    )
    if graded is not None and resume_dir is not None:
        graded.resume(resume_dir)  # the best checkpoint so far, of the earlier attempts
    elif graded is not None:  # the model the job starts from (placed by the Trainer)
        graded.grade(trainer.model, 0, "before training")
    reporter.status(
        Outcome.RUNNING,
        "Training started" + (f", resuming at step {resume_step}." if resume_dir else "."),
        resumed_from_step=resume_step,
    )
    train_output = train_with_oom_hint(trainer, spec, resume_dir)
    step = trainer.state.global_step
    if callback.stop_reason is not None:
        stop.raise_if_stopped("during training", step=step)
    chosen = None
    if graded is not None:
        if graded.evaluates_at_checkpoints and eval_examples and step not in _sample_steps(trainer):
            trainer.evaluate()  # the last step's valid_loss, beside the checkpoints'
        chosen = graded.finish(model, step)
    full_valid = evaluate_whole(trainer, eval_examples)

    metrics = final_metrics(spec, backend, trainer, train_output, stats, callback, resume_step)
    metrics.update(full_valid)
    if chosen is not None:
        metrics.update(selected_step=chosen.step, selected_adapter_sha256=chosen.adapter_sha256)
    if metrics["first_loss"] is not None:
        reporter.log(
            f"Trained {step} steps: loss {metrics['first_loss']:.4f} -> {metrics['last_loss']:.4f}.",
            global_step=step,
            train_loss=metrics["train_loss"],
        )
    if stop.check() == PREEMPTED:
        # Training is done and the adapter is smaller than a checkpoint: worth the minutes left.
        reporter.log("Preemption notice after the last step: uploading the adapter anyway.")
    else:
        stop.raise_if_stopped("before uploading the adapter", step=step)
    tar, manifest, sha256, size = package_adapter(spec, model, tokenizer, metrics, run_dir)
    transfer.upload(
        tar, spec.outputs.artifact_url, what="adapter bundle", content_type="application/x-tar"
    )
    reporter.artifact(manifest, sha256, size)
    return RunResult(
        Outcome.SUCCEEDED,
        "",
        "Training finished.",
        bundle_sha256=sha256,
        bundle_size=size,
        manifest=manifest,
        metrics=metrics,
    )


def _sample_steps(trainer: Any) -> set[int]:
    """The steps the validation sample was evaluated at, from the Trainer's log."""
    return {e["step"] for e in trainer.state.log_history if "eval_loss" in e}


def _check_method(spec: JobSpec) -> None:
    """A dpo job trains on preference pairs, a supervised one on anything else (the control
    plane refuses a mismatch at create; this guards a hand-written spec)."""
    for what, ref in (("training", spec.dataset), ("validation", spec.validation_dataset)):
        if ref is not None and (ref.format == "preference") != (spec.method == "dpo"):
            raise ExecutorError(
                INVALID_DATASET,
                f"a {spec.method} job cannot train on a {ref.format} {what} dataset; dpo takes "
                "the preference format and only dpo does",
            )


def _download(
    url: str, dest: Path, stop: StopGuard, *, what: str, sha256: str | None = None
) -> None:
    try:
        transfer.download(
            url, dest, sha256=sha256, what=what, should_stop=lambda: stop.check() is not None
        )
    except Cancelled:
        stop.raise_if_stopped(f"while downloading the {what}")  # cancel or timeout, whichever
        raise


def _fetch_dataset(ref: DatasetRef, dest: Path, what: str, stop: StopGuard) -> list[dict[str, Any]]:
    _download(ref.url, dest, stop, sha256=ref.sha256, what=f"{what} dataset")
    records: list[dict[str, Any]] = []
    try:
        for record in iter_examples(dest):
            if not records and detect_format(record) != ref.format:
                raise ExecutorError(
                    INVALID_DATASET,
                    f"the {what} dataset is in the {detect_format(record)} format but the job "
                    f"says {ref.format}; resubmit with the matching format",
                )
            records.append(record)
    except DatasetError as exc:
        where = f"line {exc.line}: " if exc.line is not None else ""
        raise ExecutorError(
            INVALID_DATASET,
            f"{what} dataset {where}{exc.message}; fix the file and upload it again",
        ) from exc
    return records


def _fetch_resume(
    spec: JobSpec, run_dir: Path, reporter: Reporter, stop: StopGuard
) -> tuple[Path | None, int]:
    url = spec.outputs.resume_url
    if not url:
        return None, 0
    tar = run_dir / "resume.tar"
    _download(url, tar, stop, what="checkpoint")
    dest = run_dir / "resume"
    try:
        step = checkpoints.unpack(tar, dest)
    except (BundleError, OSError, ValueError) as exc:
        # A broken checkpoint would fail every later attempt too; starting over is the useful move.
        reporter.log(
            f"The checkpoint to resume from is unusable ({exc}); training from step 0.", "warning"
        )
        shutil.rmtree(dest, ignore_errors=True)
        return None, 0
    finally:
        tar.unlink(missing_ok=True)
    reporter.log(f"Resuming from the checkpoint at step {step}.", step=step)
    return dest, step


def _fetch_parent(spec: JobSpec, run_dir: Path, stop: StopGuard) -> Path | None:
    """The adapter the job continues (gpu_worker.lineage), downloaded and verified; None for a
    job that starts a fresh adapter."""
    if spec.parent_adapter is None:
        return None
    tar = run_dir / "parent.tar"
    _download(spec.parent_adapter.url, tar, stop, sha256=spec.parent_adapter.sha256,
              what="parent adapter")  # fmt: skip
    try:
        return lineage.unpack_adapter(tar, run_dir / "parent")
    finally:
        tar.unlink(missing_ok=True)


def _param_counts(model: Any) -> tuple[int, int]:
    counter = getattr(model, "get_nb_trainable_parameters", None)
    if callable(counter):
        trainable, total = counter()
        return int(trainable), int(total)
    params = list(model.parameters())
    return sum(p.numel() for p in params if p.requires_grad), sum(p.numel() for p in params)


def _effective_max_len(spec: JobSpec, model: Any, reporter: Reporter) -> int:
    wanted = spec.hyperparameters.max_seq_length
    limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if isinstance(limit, int) and 0 < limit < wanted:
        reporter.log(
            f"max_seq_length {wanted} is above the model's {limit} positions; using {limit}.",
            "warning",
        )
        return limit
    return wanted


def _encode(
    records: list[dict[str, Any]],
    ref: DatasetRef,
    tokenizer: Any,
    max_len: int,
    what: str,
    reporter: Reporter,
) -> tuple[list[dict[str, Any]], FormatStats]:
    try:
        if ref.format == "preference":
            examples, stats = encode_preference(records, tokenizer, max_len)
        else:
            examples, stats = encode_examples(records, ref.format, tokenizer, max_len)
    except FormatError as exc:
        raise ExecutorError(INVALID_DATASET, f"{what} dataset {exc}") from exc
    for warning in stats.warnings:
        reporter.log(f"{what.capitalize()} data: {warning}.", "warning")
    if stats.dropped:
        reporter.log(
            f"Dropped {stats.dropped} of {stats.examples} {what} examples with no trainable token "
            f"left after truncation to {max_len} tokens (raise max_seq_length to keep them).",
            "warning",
            dropped=stats.dropped,
        )
    if not examples:
        raise ExecutorError(
            INVALID_DATASET,
            f"no {what} example has a trainable token within max_seq_length={max_len}; raise "
            "max_seq_length or shorten the prompts",
        )
    reporter.log(
        f"{what.capitalize()} data: {stats.kept} examples, {stats.tokens} tokens "
        f"({stats.trainable_tokens} trained), loss on {stats.loss_on}"
        + (f", {stats.truncated} truncated to {max_len} tokens" if stats.truncated else "")
        + ".",
        examples=stats.kept,
        tokens=stats.tokens,
        truncated=stats.truncated,
    )
    return examples, stats
