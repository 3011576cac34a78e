"""Training on top of a fine-tuned model: the parent's adapter weights, loaded into the job's
fresh adapter before the first step.

The job's adapter has the parent's settings (the control plane copies r, alpha, targets and
type from the parent job), so the child is the same adapter trained on, not a second adapter on
merged weights: its bundle alone applies to the base model like any other job's, which is what
serving many adapters on one base (vLLM's runtime LoRA) and a one-step merge for export need.
It also makes the parent the natural DPO reference (gpu_worker.preference): the model as the
job starts.

The parent arrives as a manifest-first tar (an adapter bundle, or a training checkpoint: both
hold ``adapter_config.json`` and ``adapter_model.safetensors`` at the top), verified against the
sha256 the control plane recorded while it downloads and against its manifest before anything
is read from it.
"""

from __future__ import annotations

import json
import tarfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpu_worker import checkpoints
from gpu_worker.errors import INVALID_MODEL, ExecutorError
from trainhub_contract.bundle import BundleError, verify_bundle
from trainhub_contract.spec import ALL_LINEAR

if TYPE_CHECKING:
    from trainhub_contract.spec import JobSpec

CONFIG, WEIGHTS = "adapter_config.json", "adapter_model.safetensors"


def unpack_adapter(tar_path: Path, dest: Path) -> Path:
    """Verify the tar against its manifest and extract its adapter config and weights into
    ``dest``; returns ``dest``. Raises ExecutorError when it holds no intact adapter."""
    try:
        verified = verify_bundle(checkpoints.file_chunks(tar_path))
    except BundleError as exc:
        raise ExecutorError(INVALID_MODEL, f"the parent adapter is damaged: {exc.message}") from exc
    listed = {f.path for f in verified.files}
    missing = [name for name in (CONFIG, WEIGHTS) if name not in listed]
    if missing:
        raise ExecutorError(
            INVALID_MODEL, f"the parent adapter holds no {' or '.join(missing)} (not an adapter)"
        )
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(tar_path, mode="r:") as tar:
        members = [m for m in tar.getmembers() if m.name in (CONFIG, WEIGHTS)]
        tar.extractall(dest, members=members, filter="data")  # plain files, inside dest only
    return dest


def _settings_mismatch(spec: JobSpec, config: dict[str, Any]) -> str | None:
    adapter = spec.adapter
    wanted_targets = (
        None if adapter.target_modules == (ALL_LINEAR,) else set(adapter.target_modules)
    )
    found = config.get("target_modules")
    found_targets = set(found) if isinstance(found, list) else found
    pairs: list[tuple[str, object, object]] = [
        ("r", adapter.r, config.get("r")),
        ("alpha", float(adapter.alpha), float(config.get("lora_alpha") or 0)),
        ("dora", adapter.type == "dora", bool(config.get("use_dora"))),
    ]
    if wanted_targets is not None and found_targets != wanted_targets:
        pairs.append(("target_modules", sorted(wanted_targets), found))
    for name, wanted, got in pairs:
        if wanted != got:
            return f"{name} {got} in the parent, {wanted} in this job"
    return None


def load_parent_weights(spec: JobSpec, model: Any, adapter_dir: Path) -> int:
    """Load the parent's adapter weights into ``model``'s adapter; returns how many tensors.
    Every adapter tensor of the model must come from the parent, and nothing else may be in it."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    config = json.loads((adapter_dir / CONFIG).read_text())
    mismatch = _settings_mismatch(spec, config)
    if mismatch:
        raise ExecutorError(
            INVALID_MODEL,
            f"the parent adapter does not fit this job's adapter ({mismatch}); a job continues "
            "its parent's adapter with the same settings",
        )
    weights = load_file(str(adapter_dir / WEIGHTS))
    result: Any = set_peft_model_state_dict(model, weights)  # torch's load result
    adapter_keys = [k for k in result.missing_keys if "lora_" in k]
    if result.unexpected_keys or adapter_keys:
        extra = (result.unexpected_keys or adapter_keys)[0]
        raise ExecutorError(
            INVALID_MODEL,
            f"the parent adapter's tensors do not match this model's adapter (first: {extra}); "
            "was it trained on another base model?",
        )
    return len(weights)
