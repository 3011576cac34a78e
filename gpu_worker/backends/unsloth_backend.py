"""Unsloth (CUDA only): ``FastLanguageModel.from_pretrained`` + ``get_peft_model``.

Written against unsloth 2026.10.7 (see ../shared/TRAINING_NOTES.md §4) and exercised only by
the GPU-marked tests: Unsloth cannot even be imported without a GPU. ``import unsloth`` has
already happened in :func:`gpu_worker.backends.select_backend`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpu_worker.backends.loading import hub_token, model_load_error, model_reference
from gpu_worker.errors import INVALID_MODEL, ExecutorError
from trainhub_contract.spec import ALL_LINEAR, DEFAULT_TARGET_MODULES

if TYPE_CHECKING:
    from trainhub_contract.spec import JobSpec


def load(spec: JobSpec) -> tuple[Any, Any]:
    from unsloth import FastLanguageModel

    adapter = spec.adapter
    reference = model_reference(spec)
    try:
        model, tokenizer = FastLanguageModel.from_pretrained(
            model_name=reference,  # hub id or absolute local directory
            max_seq_length=spec.hyperparameters.max_seq_length,
            dtype=None,  # auto: bf16 where supported, else fp16
            load_in_4bit=adapter.type == "qlora",
            token=hub_token(spec),
        )
    except Exception as exc:
        raise model_load_error(spec, exc) from exc

    # Unsloth's fused LoRA path is built around the standard projection names; "all-linear"
    # (every linear layer but the output head) is exactly those on the architectures it supports.
    modules = adapter.target_modules
    targets = list(DEFAULT_TARGET_MODULES) if modules == (ALL_LINEAR,) else list(modules)
    extra: dict[str, Any] = {"use_dora": True} if adapter.type == "dora" else {}  # -> LoraConfig
    try:
        model = FastLanguageModel.get_peft_model(
            model,
            r=adapter.r,
            target_modules=targets,
            lora_alpha=adapter.alpha,
            lora_dropout=adapter.dropout,
            bias="none",
            # Unsloth's variant offloads the checkpointed activations to CPU memory.
            use_gradient_checkpointing=(
                "unsloth" if spec.hyperparameters.gradient_checkpointing else False
            ),
            random_state=spec.seed,
            use_rslora=False,
            loftq_config={},
            **extra,
        )
    except (ValueError, TypeError) as exc:
        raise ExecutorError(
            INVALID_MODEL,
            f"cannot attach a {adapter.type} adapter to {spec.model!r} with Unsloth: {exc}",
        ) from exc
    return model, tokenizer
