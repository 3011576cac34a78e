"""``trainhub jobs create``: a job from flags, uploading local training files first."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import click

from trainhub_cli.commands.files import (
    invalid_file_error,
    show_errors,
    upload_file,
    wait_validated,
)
from trainhub_cli.commands.following import watch_job, watch_options
from trainhub_cli.render import Output, details
from trainhub_cli.state import State, get_state, json_option

FILE_ID = re.compile(r"^file-[A-Za-z0-9_-]+$")
JOB_FIELDS = ("id", "status", "model", "base_model", "parent", "method", "target",
              "training_file", "validation_file", "evals", "checkpoint_selection",
              "fine_tuned_model", "adapter", "hyperparameters", "gpu", "suffix", "metadata",
              "waiting_reason", "metrics", "estimated_finish", "estimated_cost", "cost",
              "trained_tokens", "result_files", "error", "created_at", "started_at",
              "finished_at")  # fmt: skip


def show_job(out: Output, job: dict[str, Any]) -> None:
    if out.json_mode:
        out.json(job)
    else:
        out.print(details(job, JOB_FIELDS))


def _evals(state: State, opts: dict[str, Any]) -> dict[str, Any]:
    if not (opts["evals_file"] and opts["grader"]):
        raise click.UsageError("--evals and --grader go together")
    text = opts["grader"]
    if text.startswith("@"):
        try:
            text = Path(text[1:]).expanduser().read_text()
        except OSError as exc:
            raise click.BadParameter(
                f"cannot read {text[1:]!r}: {exc}", param_hint="--grader"
            ) from None
    try:
        grader = json.loads(text)
    except ValueError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint="--grader") from None
    evals = {"file": _file_ref(state, opts["evals_file"], "--evals"), "grader": grader}
    if opts["eval_max_tokens"] is not None:
        evals["max_tokens"] = opts["eval_max_tokens"]
    return evals


def key_values(values: tuple[str, ...], option: str) -> dict[str, str]:
    found: dict[str, str] = {}
    for value in values:
        key, sep, item = value.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{value!r} is not KEY=VALUE", param_hint=option)
        found[key] = item
    return found


def _file_ref(state: State, value: str, option: str) -> str:
    """A ``file-…`` id as is; a local path is uploaded first and waited on until validated."""
    path = Path(value).expanduser()
    if FILE_ID.match(value) and not path.exists():
        return value
    if not path.is_file():
        raise click.BadParameter(
            f"{value!r} is neither a file-… id nor a readable file", param_hint=option
        )
    record = wait_validated(state.api, state.output, upload_file(state.api, state.output, path))
    if record.get("status") == "error":
        if not state.output.json_mode:
            show_errors(state.output, record)
        raise invalid_file_error(record)
    return str(record["id"])


@click.command("create")
@click.option(
    "--model",
    required=True,
    help="Base model: a hub id (owner/name) or a path the operator allows; or a job's "
    "fine_tuned_model (or a checkpoint's) to train on from.",
)
@click.option(
    "--training-file",
    required=True,
    metavar="FILE_ID|PATH",
    help="A file-… id, or a local JSONL file to upload first.",
)
@click.option("--validation-file", metavar="FILE_ID|PATH")
@click.option(
    "--adapter",
    "adapter_type",
    type=click.Choice(["lora", "qlora", "dora"]),
    help="Adapter type (server default: lora).",
)
@click.option("--rank", "-r", type=int, help="Adapter rank r.")
@click.option("--alpha", type=float, help="Adapter alpha.")
@click.option("--dropout", type=float, help="Adapter dropout.")
@click.option(
    "--target-modules", metavar="M1,M2|all-linear", help="Modules to adapt (comma-separated)."
)
@click.option("--epochs", "n_epochs", type=int, help="hyperparameters.n_epochs")
@click.option(
    "--learning-rate", "--lr", "learning_rate", type=float, help="hyperparameters.learning_rate"
)
@click.option("--batch-size", type=int, help="hyperparameters.batch_size")
@click.option("--max-seq-length", type=int, help="hyperparameters.max_seq_length")
@click.option(
    "--grad-accum",
    "gradient_accumulation_steps",
    type=int,
    help="hyperparameters.gradient_accumulation_steps",
)
@click.option("--warmup-ratio", type=float, help="hyperparameters.warmup_ratio")
@click.option(
    "--gradient-checkpointing/--no-gradient-checkpointing",
    default=None,
    help="hyperparameters.gradient_checkpointing",
)
@click.option(
    "--packing/--no-packing",
    default=None,
    help="hyperparameters.packing: train without padding (on unless told).",
)
@click.option(
    "--eval-interval",
    type=int,
    metavar="STEPS",
    help="hyperparameters.eval_interval: steps between validation passes (0: a tenth of the run).",
)
@click.option(
    "--method",
    type=click.Choice(["supervised", "dpo"]),
    help="supervised (default) or dpo (a preference file: input, preferred_output, "
    "non_preferred_output).",
)
@click.option("--beta", type=float, help="dpo: hyperparameters.beta (default 0.1).")
@click.option(
    "--evals",
    "evals_file",
    metavar="FILE_ID|PATH",
    help="Eval items (input + reference) scored at every checkpoint; needs --grader.",
)
@click.option(
    "--grader",
    metavar="JSON|@FILE",
    help="OpenAI's string_check or text_similarity grader, as JSON (or @file.json).",
)
@click.option("--eval-max-tokens", type=int, help="evals.max_tokens: answer length (default 64).")
@click.option(
    "--checkpoint-selection",
    type=click.Choice(["last", "best_valid_loss", "best_eval"]),
    help="Which checkpoint becomes the adapter (default last).",
)
@click.option("--target", help="local, auto, or a provider (`trainhub providers list`).")
@click.option("--gpu-count", type=int, help="gpu.count: GPUs per machine.")
@click.option(
    "--gpu-min-vram", type=float, metavar="GB", help="gpu.min_vram_gb: GB per GPU at least."
)
@click.option("--gpu-name", metavar="GLOB", help='gpu.name, e.g. "*A100*".')
@click.option(
    "--node-selector",
    multiple=True,
    metavar="LABEL=GLOB",
    help="Own-fleet node labels (repeatable).",
)
@click.option("--max-price-per-hour", type=float, metavar="USD")
@click.option(
    "--capacity",
    type=click.Choice(["on_demand", "spot", "any"]),
    help="Cloud capacity: on demand (default), spot (interruptible, cheaper), or the cheaper.",
)
@click.option(
    "--max-preemptions", type=int, help="Spot interruptions not counted as failed attempts."
)
@click.option("--max-runtime", "max_runtime_seconds", type=int, metavar="SECONDS")
@click.option("--max-attempts", type=int)
@click.option("--priority", type=int)
@click.option("--suffix", help="Part of the fine-tuned model's name.")
@click.option("--seed", type=int)
@click.option("--metadata", multiple=True, metavar="KEY=VALUE", help="Repeatable.")
@click.option(
    "--idempotency-key",
    metavar="KEY",
    help="A retry with the same key and body returns the first job.",
)
@click.option(
    "--watch", "watch", is_flag=True, help="Then watch it to its end (exit code: its outcome)."
)
@watch_options
@json_option
def create(**opts: Any) -> None:
    """Create a fine-tuning job (uploading a local training file first)."""
    state = get_state()
    body: dict[str, Any] = {"model": opts["model"]}
    body["training_file"] = _file_ref(state, opts["training_file"], "--training-file")
    if opts["validation_file"]:
        body["validation_file"] = _file_ref(state, opts["validation_file"], "--validation-file")
    adapter = {"type": opts["adapter_type"], "r": opts["rank"], "alpha": opts["alpha"],
               "dropout": opts["dropout"]}  # fmt: skip
    if opts["target_modules"]:
        modules = opts["target_modules"]
        adapter["target_modules"] = (
            modules
            if modules == "all-linear"
            else [m.strip() for m in modules.split(",") if m.strip()]
        )
    hyper = {k: opts[k] for k in ("n_epochs", "learning_rate", "batch_size", "max_seq_length",
                                  "gradient_accumulation_steps", "warmup_ratio",
                                  "gradient_checkpointing", "packing", "eval_interval",
                                  "beta")}  # fmt: skip
    gpu = {
        "count": opts["gpu_count"],
        "min_vram_gb": opts["gpu_min_vram"],
        "name": opts["gpu_name"],
    }
    for name, value in (("adapter", adapter), ("hyperparameters", hyper), ("gpu", gpu)):
        given = {k: v for k, v in value.items() if v is not None}
        if given:
            body[name] = given
    for name in (
        "target",
        "max_price_per_hour",
        "capacity",
        "max_preemptions",
        "max_runtime_seconds",
        "max_attempts",
        "priority",
        "suffix",
        "seed",
    ):
        if opts[name] is not None:
            body[name] = opts[name]
    if opts["method"]:
        body["method"] = {"type": opts["method"]}
    if opts["checkpoint_selection"]:
        body["checkpoint_selection"] = opts["checkpoint_selection"]
    if opts["evals_file"] or opts["grader"]:
        body["evals"] = _evals(state, opts)
    if opts["node_selector"]:
        body["node_selector"] = key_values(opts["node_selector"], "--node-selector")
    if opts["metadata"]:
        body["metadata"] = key_values(opts["metadata"], "--metadata")
    headers = {"Idempotency-Key": opts["idempotency_key"]} if opts["idempotency_key"] else None
    job = state.api.post("/fine_tuning/jobs", body, headers=headers)
    out = state.output
    if not opts["watch"]:
        show_job(out, job)
        return
    out.say(f"created {job['id']} ({job.get('status')})")
    watch_job(state, job["id"], stream=opts["stream"], interval=opts["interval"],
              timeout=opts["timeout"], logs=opts["logs"])  # fmt: skip
