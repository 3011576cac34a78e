"""transformers + peft: the backend for CPUs, and for GPUs without Unsloth.

qlora loads the base in 4-bit NF4 through bitsandbytes (which also runs on CPU) and prepares
it for k-bit training; lora and dora load it in full precision (fp32 on CPU, bf16/fp16 on GPU).
Gradient checkpointing (``hyperparameters.gradient_checkpointing``) is switched on here, on the
base model before the adapter is attached, so peft makes the inputs require grad for it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpu_worker.backends.loading import hub_token, model_load_error, model_reference
from gpu_worker.errors import INVALID_MODEL, ExecutorError
from trainhub_contract.spec import ALL_LINEAR

if TYPE_CHECKING:
    from trainhub_contract.spec import JobSpec


def _dtype() -> Any:
    import torch

    if not torch.cuda.is_available():
        return torch.float32
    return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16


def target_modules(spec: JobSpec) -> str | list[str]:
    modules = spec.adapter.target_modules
    return ALL_LINEAR if modules == (ALL_LINEAR,) else list(modules)


def load(spec: JobSpec) -> tuple[Any, Any]:
    import torch
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM, AutoTokenizer, BitsAndBytesConfig

    adapter = spec.adapter
    token = hub_token(spec)
    dtype = _dtype()
    kwargs: dict[str, Any] = {"dtype": dtype, "token": token}
    if adapter.type == "qlora":
        # transformers leaves BitsAndBytesConfig.__init__ unannotated.
        kwargs["quantization_config"] = BitsAndBytesConfig(  # type: ignore[no-untyped-call]
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_compute_dtype=dtype,
            bnb_4bit_use_double_quant=True,
        )
        # A quantized model cannot be moved after loading, so place it now.
        kwargs["device_map"] = {"": 0} if torch.cuda.is_available() else "cpu"
    reference = model_reference(spec)
    try:
        tokenizer = AutoTokenizer.from_pretrained(reference, token=token)
        model = AutoModelForCausalLM.from_pretrained(reference, **kwargs)
    except Exception as exc:
        raise model_load_error(spec, exc) from exc

    checkpointing = spec.hyperparameters.gradient_checkpointing
    # Non-reentrant: the variant that works with frozen base weights and no input grads.
    checkpointing_kwargs = {"use_reentrant": False}
    if adapter.type == "qlora":
        # peft leaves prepare_model_for_kbit_training unannotated.
        model = prepare_model_for_kbit_training(  # type: ignore[no-untyped-call]
            model,
            use_gradient_checkpointing=checkpointing,
            gradient_checkpointing_kwargs=checkpointing_kwargs,
        )
    elif checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=checkpointing_kwargs)
    config = LoraConfig(
        r=adapter.r,
        # peft annotates int, yet scales by alpha / r in floating point: any positive number.
        lora_alpha=adapter.alpha,  # type: ignore[arg-type]
        lora_dropout=adapter.dropout,
        target_modules=target_modules(spec),
        use_dora=adapter.type == "dora",
        bias="none",
        task_type="CAUSAL_LM",
    )
    try:
        peft_model = get_peft_model(model, config)
    except ValueError as exc:  # e.g. "Target modules {...} not found in the base model"
        raise ExecutorError(
            INVALID_MODEL,
            f"cannot attach a {adapter.type} adapter to {spec.model!r}: {exc}. Set "
            'adapter.target_modules to module names this model has, or "all-linear"',
        ) from exc
    return peft_model, tokenizer
