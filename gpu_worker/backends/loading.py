"""What both backends share when they load a model: the reference they pass to
``from_pretrained``, the hub token and the typed error a failed load becomes. Beside the
backends, so they need nothing from the package that chooses between them."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from gpu_worker.errors import INVALID_MODEL, OOM, ExecutorError

if TYPE_CHECKING:
    from trainhub_contract.spec import JobSpec


def model_reference(spec: JobSpec) -> str:
    """The model as ``from_pretrained`` must get it: an absolute path (a local model the
    operator allowed) or a hub id that no local path can shadow.

    transformers and Unsloth load any existing path first, and a hub id ``owner/name`` is
    also a relative path: a folder of that name in the working directory (which the executor
    shares with its downloads, checkpoints and, over SSH, its uploaded code) would be loaded in
    place of the hub model. Such a folder is refused, not loaded."""
    return checked_reference(spec.model)


def checked_reference(model: str) -> str:
    """:func:`model_reference` for a model name (an export's base, say)."""
    if model.startswith("/"):
        return model
    if os.path.lexists(model):
        raise ExecutorError(
            INVALID_MODEL,
            f"the hub id {model!r} is also a path in the executor's working directory "
            f"({os.getcwd()}); a hub id is never loaded from a local folder. Name a local model "
            "by its absolute path (listed in the operator's TRAINHUB_ALLOWED_MODELS)",
        )
    return model


def hub_token(spec: JobSpec) -> str | None:
    """The HF token, resolved from the environment variable the spec names (never in the spec)."""
    name = spec.secrets.get("hf_token")
    return os.environ.get(name) or None if name else None


def is_oom(exc: BaseException) -> bool:
    import torch

    if isinstance(exc, torch.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


def model_load_error(spec: JobSpec, exc: BaseException) -> Exception:
    """Map a loading failure to the executor's typed error (OOM stays an OOM)."""
    if is_oom(exc):
        return ExecutorError(
            OOM,
            f"out of memory while loading the model {spec.model!r}: {exc}; use qlora "
            "(4-bit) or a GPU with more memory",
        )
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return ExecutorError(
        INVALID_MODEL,
        f"could not load the model {spec.model!r}: {text[:500]}. Check that it is a causal "
        "language model's hub id or a local directory with config.json and weights, and, for a "
        "gated or private model, that the secret named by secrets.hf_token is set on the executor",
    )
