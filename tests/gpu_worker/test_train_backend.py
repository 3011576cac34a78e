"""Backend choice: made before transformers/peft are imported, PEFT without CUDA."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpu_worker import backends

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def fresh_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backends, "_selected", None)
    monkeypatch.setattr(backends, "_note", "")


def test_importing_the_executor_imports_no_ml_library() -> None:
    """Unsloth must be imported before transformers/peft/trl, so none of the executor's modules
    may import them (or torch) at import time."""
    code = (
        "import sys\n"
        "import gpu_worker.__main__, gpu_worker.train, gpu_worker.formatting, gpu_worker.transfer\n"
        "import gpu_worker.tiny_model, gpu_worker.checkpoints, gpu_worker.backends\n"
        "import gpu_worker.backends.peft_backend, gpu_worker.backends.unsloth_backend\n"
        "print(sorted(m for m in ('torch', 'transformers', 'peft', 'trl', 'unsloth') if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert out.stdout.strip() == "[]"


@pytest.mark.usefixtures("fresh_choice")
def test_without_cuda_the_backend_is_peft(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.delenv(backends.ENV_BACKEND, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert backends.select_backend() == "peft"
    assert backends.backend_note() == "no CUDA device"
    assert backends.precision() == {"bf16": False, "fp16": False}


@pytest.mark.usefixtures("fresh_choice")
def test_with_cuda_but_no_unsloth_it_falls_back_to_peft(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.delenv(backends.ENV_BACKEND, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setitem(sys.modules, "unsloth", None)  # "import unsloth" raises ImportError
    assert backends.select_backend() == "peft"
    assert "Unsloth does not import" in backends.backend_note()


@pytest.mark.usefixtures("fresh_choice")
def test_forcing_unsloth_without_cuda_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setenv(backends.ENV_BACKEND, "unsloth")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="needs a GPU"):
        backends.select_backend()
    monkeypatch.setenv(backends.ENV_BACKEND, "tensorflow")
    with pytest.raises(RuntimeError, match="not one of"):
        backends.select_backend()


def test_the_choice_is_made_once_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    first = backends.select_backend()
    monkeypatch.setenv(backends.ENV_BACKEND, "unsloth")  # too late: already chosen
    assert backends.select_backend() == first
