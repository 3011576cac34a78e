"""The end of a successful run: its metrics (``metrics.json``, also the job's metrics) and the
adapter bundle (the adapter, its tokenizer and the metrics, as a verified tar)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpu_worker import checkpoints
from gpu_worker.formatting import FormatStats
from gpu_worker.preference import PREFERENCE_METRICS
from gpu_worker.trainer import rate, to_float
from trainhub_contract.bundle import FORMAT_VERSION, write_bundle

if TYPE_CHECKING:
    from trainhub_contract.spec import JobSpec


def final_metrics(
    spec: JobSpec,
    backend: str,
    trainer: Any,
    train_output: Any,
    stats: FormatStats,
    callback: Any,
    resume_step: int,
) -> dict[str, Any]:
    import peft
    import torch
    import transformers

    state = trainer.state
    history = [(e["step"], float(e["loss"])) for e in state.log_history if "loss" in e]
    evals = [(e["step"], float(e["eval_loss"])) for e in state.log_history if "eval_loss" in e]

    def last(name: str) -> float | None:  # the newest logged value of a metric
        return next((to_float(e[name]) for e in reversed(state.log_history) if name in e), None)

    out = dict(train_output.metrics) if train_output is not None else {}
    runtime = to_float(out.get("train_runtime"))
    counts = callback.counter.total
    session = counts.minus(callback.counter.session_start)
    metrics: dict[str, Any] = {
        "job_id": spec.job_id,
        "attempt": spec.attempt,
        "model": spec.model,
        "backend": backend,
        "adapter": spec.adapter.to_dict(),
        "hyperparameters": spec.hyperparameters.to_dict(),
        "seed": spec.seed,
        "method": spec.method,
        "parent_adapter_sha256": spec.parent_adapter.sha256 if spec.parent_adapter else None,
        "dataset_format": spec.dataset.format,
        "global_step": state.global_step,
        "total_steps": state.max_steps,
        "epochs": float(state.epoch or 0.0),
        "resumed_from_step": resume_step,
        "train_loss": to_float(out.get("train_loss")),
        "first_loss": history[0][1] if history else None,
        "last_loss": history[-1][1] if history else None,
        "eval_loss": evals[-1][1] if evals else None,
        # OpenAI's names (token_accuracy): the last training step's, the last sample pass's.
        "train_mean_token_accuracy": last("mean_token_accuracy"),
        "valid_mean_token_accuracy": last("eval_mean_token_accuracy"),
        "loss_history": [{"step": s, "loss": v} for s, v in history],
        # dpo (gpu_worker.preference): the last logged step's and the last sample pass's.
        **{name: last(name) for name in PREFERENCE_METRICS if last(name) is not None},
        **{
            f"eval_{n}": last(f"eval_{n}")
            for n in PREFERENCE_METRICS
            if last(f"eval_{n}") is not None
        },
        # What each count means: gpu_worker.token_counts. Rates cover this attempt only.
        "trained_tokens": counts.tokens,
        "useful_tokens": counts.useful,
        "padding_share": counts.padding_share,
        "batching": callback.batching,
        "train_runtime_seconds": runtime,
        "tokens_per_second": rate(session.tokens, runtime),
        "useful_tokens_per_second": rate(session.useful, runtime),
        "examples": stats.kept,
        "dropped_examples": stats.dropped,
        "truncated_examples": stats.truncated,
        "loss_on": stats.loss_on,
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "peft": peft.__version__,
        },
    }
    if backend == "unsloth":
        import unsloth

        metrics["versions"]["unsloth"] = getattr(unsloth, "__version__", "unknown")
    return metrics


def package_adapter(
    spec: JobSpec, model: Any, tokenizer: Any, metrics: dict[str, Any], run_dir: Path
) -> tuple[Path, dict[str, Any], str, int]:
    out = run_dir / "adapter"
    out.mkdir()
    model.save_pretrained(str(out))  # a PeftModel saves the adapter only (safetensors)
    (out / "README.md").unlink(missing_ok=True)  # peft's auto-generated model card stub
    config_path = out / "adapter_config.json"
    config = json.loads(config_path.read_text())
    config["base_model_name_or_path"] = spec.model  # not the executor's local cache path
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    tokenizer.save_pretrained(str(out))
    (out / "metrics.json").write_text(json.dumps(metrics, indent=1, sort_keys=True) + "\n")

    tar = run_dir / "adapter.tar"
    with tar.open("wb") as fh:
        files = write_bundle(out, fh)
    manifest = {"format": FORMAT_VERSION, "files": [asdict(f) for f in files]}
    return tar, manifest, checkpoints.file_sha256(tar), tar.stat().st_size
