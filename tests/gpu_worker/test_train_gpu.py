"""The Unsloth backend on the tiny model (CUDA only; skipped elsewhere).

Runs the real CLI in a fresh process: Unsloth must be imported before transformers/peft, which
this test session has long since imported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest

from tests.gpu_worker.conftest import spec_dict
from trainhub_contract.bundle import verify_bundle

ROOT = Path(__file__).resolve().parents[2]


def _cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not _cuda(), reason="needs a CUDA GPU (Unsloth cannot run without one)"),
]


def _run_cli(spec: dict[str, Any], tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    spec_path = tmp_path / "spec.json"
    spec["report"] = {"sinks": [{"type": "jsonl", "path": str(tmp_path / "events.jsonl")}]}
    spec_path.write_text(json.dumps(spec))
    return subprocess.run(
        [sys.executable, "-m", "gpu_worker", "run", str(spec_path)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", **env},
        capture_output=True,
        text=True,
        timeout=900,
    )


@pytest.mark.parametrize("adapter", ["lora", "dora", "qlora"])
def test_unsloth_backend_trains_the_tiny_model(
    adapter: str, tiny_model_dir: Path, dataset_files: dict, tmp_path: Path
) -> None:
    pytest.importorskip("unsloth")  # importing it here is harmless: the training runs in a child
    out = tmp_path / "out"
    spec = spec_dict(tiny_model_dir, dataset_files["messages"], out, adapter=adapter, n_epochs=2)
    proc = _run_cli(spec, tmp_path, TRAINHUB_BACKEND="unsloth")
    assert proc.returncode == 0, proc.stderr[-4000:]
    verified = verify_bundle([(out / "adapter.tar").read_bytes()])
    assert json.loads(proc.stdout.strip().splitlines()[-1])["sha256"] == verified.sha256
    with tarfile.open(out / "adapter.tar") as tar:
        tar.extractall(tmp_path / "bundle", filter="data")
    metrics = json.loads((tmp_path / "bundle" / "metrics.json").read_text())
    assert metrics["backend"] == "unsloth"
    history = [h["loss"] for h in metrics["loss_history"]]
    assert sum(history[-3:]) / 3 < sum(history[:3]) / 3
    config = json.loads((tmp_path / "bundle" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(tiny_model_dir)
    assert config["use_dora"] is (adapter == "dora")


def test_peft_backend_on_the_gpu_matches_the_cpu_recipe(
    tiny_model_dir: Path, dataset_files: dict, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    spec = spec_dict(tiny_model_dir, dataset_files["messages"], out, n_epochs=2)
    proc = _run_cli(spec, tmp_path, TRAINHUB_BACKEND="peft")
    assert proc.returncode == 0, proc.stderr[-4000:]
    verify_bundle([(out / "adapter.tar").read_bytes()])
