"""Backend choice: made before transformers/peft are imported, PEFT without CUDA."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpu_worker import backends
from tests.gpu_worker.conftest import spec_dict
from trainhub_contract.spec import JobSpec, parse_job_spec

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


def _spec_with_model(model: str, tmp_path: Path) -> JobSpec:
    dataset = (tmp_path / "train.jsonl", "0" * 64)
    return parse_job_spec(spec_dict(model, dataset, tmp_path / "out"))


def test_a_hub_id_that_is_also_a_local_path_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """transformers loads an existing path before asking the hub: a hub id must not be one."""
    from gpu_worker.backends.loading import model_reference
    from gpu_worker.errors import INVALID_MODEL, ExecutorError

    monkeypatch.chdir(tmp_path)
    assert model_reference(_spec_with_model("owner/name", tmp_path)) == "owner/name"
    (tmp_path / "owner" / "name").mkdir(parents=True)
    with pytest.raises(ExecutorError) as exc:
        model_reference(_spec_with_model("owner/name", tmp_path))
    assert exc.value.reason == INVALID_MODEL
    assert "working directory" in str(exc.value) and str(tmp_path) in str(exc.value)
    # An absolute path is a local model by intent (listed by the operator): passed as is.
    absolute = str(tmp_path / "owner" / "name")
    assert model_reference(_spec_with_model(absolute, tmp_path)) == absolute
