"""Training backends behind one small interface: ``load(spec) -> (model_with_adapter, tokenizer)``.

- ``unsloth``: Unsloth's ``FastLanguageModel`` (fused kernels, 4-bit for qlora). Chosen when
  CUDA is available and ``import unsloth`` succeeds.
- ``peft``: transformers + peft (+ bitsandbytes NF4 for qlora, which also works on CPU).
  Everywhere else, and the only one CI can run.

Both hand back a ``peft.PeftModel`` that the same ``transformers.Trainer`` loop trains
(gpu_worker.train), so the code CI runs is the code a GPU runs.

Unsloth patches transformers/peft/trl when it is imported and must come first, so
:func:`select_backend` runs before anything in the process imports them; every module of the
executor therefore imports transformers/peft inside functions only. ``TRAINHUB_BACKEND=peft``
forces the plain backend on a GPU (benchmarks compare the two); ``=unsloth`` makes a missing
Unsloth an error instead of a quiet fallback.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainhub_contract.spec import JobSpec

log = logging.getLogger(__name__)

BACKENDS = ("unsloth", "peft")
ENV_BACKEND = "TRAINHUB_BACKEND"
_LATE_MODULES = ("transformers", "peft", "trl")

_selected: str | None = None
_note = ""  # why the backend was chosen, for the run's log


def select_backend() -> str:
    """Choose the backend once per process (before transformers/peft are imported)."""
    global _selected, _note
    if _selected is not None:
        return _selected
    forced = os.environ.get(ENV_BACKEND, "").strip().lower()
    if forced and forced not in BACKENDS:
        raise RuntimeError(f"{ENV_BACKEND}={forced!r} is not one of {', '.join(BACKENDS)}")
    import torch  # importing torch before unsloth is fine; transformers/peft/trl are not

    cuda = torch.cuda.is_available()
    if forced == "peft":
        _selected, _note = "peft", f"forced by {ENV_BACKEND}=peft"
    elif not cuda:
        if forced == "unsloth":
            raise RuntimeError(
                f"{ENV_BACKEND}=unsloth but CUDA is not available; Unsloth needs a GPU"
            )
        _selected, _note = "peft", "no CUDA device"
    else:
        late = [m for m in _LATE_MODULES if m in sys.modules]
        if late:
            log.warning(
                "%s imported before the backend choice; Unsloth cannot patch them fully",
                ", ".join(late),
            )
        try:
            import unsloth  # noqa: F401  (the import itself patches transformers/peft/trl)
        except Exception as exc:  # ImportError, NotImplementedError, RuntimeError all occur
            if forced == "unsloth":
                raise RuntimeError(
                    f"{ENV_BACKEND}=unsloth but Unsloth does not import: {exc}"
                ) from exc
            _selected, _note = "peft", f"CUDA present but Unsloth does not import ({exc})"
        else:
            _selected, _note = "unsloth", "CUDA present and Unsloth imports"
    log.info("training backend: %s (%s)", _selected, _note)
    return _selected


def backend_note() -> str:
    return _note


def load(spec: JobSpec) -> tuple[Any, Any]:
    """The spec's model with its (fresh) adapter, and its tokenizer, from the chosen backend."""
    if select_backend() == "unsloth":
        from gpu_worker.backends import unsloth_backend

        return unsloth_backend.load(spec)
    from gpu_worker.backends import peft_backend

    return peft_backend.load(spec)


@contextlib.contextmanager
def generation_mode(model: Any) -> Iterator[None]:
    """Generate with ``model`` mid-training (graded checkpoints): Unsloth's patched model has
    its own inference switch and must be switched back before the next step."""
    if select_backend() != "unsloth":
        yield
        return
    from unsloth import FastLanguageModel

    FastLanguageModel.for_inference(model)
    try:
        yield
    finally:
        FastLanguageModel.for_training(model)


def precision() -> dict[str, bool]:
    """TrainingArguments mixed-precision flags: bf16 where the GPU has it, else fp16; CPU fp32."""
    import torch

    if not torch.cuda.is_available():
        return {"bf16": False, "fp16": False}
    bf16 = torch.cuda.is_bf16_supported()
    return {"bf16": bf16, "fp16": not bf16}
