"""Stopping and continuing: cancel within one optimizer step, resume from the checkpoint slot
with the step count and optimizer state carried over, SIGTERM on the real CLI process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.gpu_worker.conftest import spec_dict
from trainhub_contract.outcomes import ExitCode

ROOT = Path(__file__).resolve().parents[2]


class StepWatch:
    """A TrainerCallback that records every step it sees; ``flip_at`` turns ``requested`` on
    once that step has ended (the should_stop the executor polls)."""

    def __init__(self, flip_at: int | None = None) -> None:
        self.flip_at = flip_at
        self.steps: list[int] = []
        self.requested = False

    def __getattr__(self, name: str) -> Any:
        if name.startswith("on_"):
            return lambda *a, **k: None
        raise AttributeError(name)

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self.steps.append(state.global_step)
        if self.flip_at is not None and state.global_step >= self.flip_at:
            self.requested = True


def test_cancel_stops_within_one_step_and_cleans_up(
    tiny_model_dir: Path, dataset_files: dict, run_executor: Any, tmp_path: Path
) -> None:
    watch = StepWatch(flip_at=4)
    spec = spec_dict(tiny_model_dir, dataset_files["messages"], tmp_path / "out", n_epochs=2)
    run = run_executor(spec, callbacks=[watch], should_stop=lambda: watch.requested)

    assert (run.result.status, run.result.reason) == ("cancelled", "cancelled")
    assert run.result.exit_code == ExitCode.CANCELLED
    # Requested after step 4 ended; the executor may finish the step in flight, no more.
    assert watch.steps[-1] <= 5, watch.steps
    assert run.final_status["data"]["status"] == "cancelled"
    assert not run.of_type("artifact") and not run.artifact.exists()
    assert not any(run.workdir.iterdir()), "cancel must remove the attempt's working files"


def test_resume_continues_the_step_count_and_optimizer_state(
    tiny_model_dir: Path, dataset_files: dict, run_executor: Any, tmp_path: Path
) -> None:
    data = dataset_files["messages"]
    # The reference: one uninterrupted run.
    full = run_executor(spec_dict(tiny_model_dir, data, tmp_path / "full", n_epochs=2))
    assert full.result.status == "succeeded", full.result.message
    total = full.result.metrics["global_step"]
    assert total == 30

    # Attempt 1 checkpoints every 8 steps and is preempted after step 19 (mid epoch 2).
    watch = StepWatch(flip_at=19)
    first = run_executor(
        spec_dict(tiny_model_dir, data, tmp_path / "a", n_epochs=2),
        callbacks=[watch],
        should_stop=lambda: watch.requested,
        checkpoint_every_steps=8,
    )
    assert first.result.status == "cancelled"
    assert [e["data"]["step"] for e in first.of_type("checkpoint")] == [8, 16]
    assert first.checkpoint.is_file()

    # Attempt 2 resumes from the checkpoint slot: steps 17..30, not 1..30.
    watch2 = StepWatch()
    second = run_executor(
        spec_dict(
            tiny_model_dir, data, tmp_path / "b", n_epochs=2, attempt=2, resume=first.checkpoint
        ),
        callbacks=[watch2],
    )
    result = second.result
    assert result.status == "succeeded", result.message
    assert result.metrics["resumed_from_step"] == 16
    assert watch2.steps[0] == 17 and watch2.steps[-1] == total
    assert result.metrics["global_step"] == total
    assert second.of_type("status")[0]["data"] == {"status": "running", "resumed_from_step": 16}
    assert second.of_type("metrics")[0]["data"]["step"] >= 17
    # Same data order, optimizer, scheduler and RNG as the uninterrupted run: same losses.
    losses = {h["step"]: h["loss"] for h in result.metrics["loss_history"]}
    reference = {h["step"]: h["loss"] for h in full.result.metrics["loss_history"]}
    assert set(losses) == set(reference)  # the log history carries the first attempt's steps
    for step in (17, 24, 30):
        assert losses[step] == pytest.approx(reference[step], abs=1e-4), step
    # The token counts continue from the checkpoint (gpu_worker.token_counts), not from zero.
    for key in ("trained_tokens", "useful_tokens", "padding_share"):
        assert result.metrics[key] == full.result.metrics[key], key


def test_an_unusable_checkpoint_trains_from_zero_with_a_warning(
    tiny_model_dir: Path, dataset_files: dict, run_executor: Any, tmp_path: Path
) -> None:
    broken = tmp_path / "broken.tar"
    broken.write_bytes(b"not a tar at all")
    spec = spec_dict(
        tiny_model_dir, dataset_files["text"], tmp_path / "out", fmt="text", resume=broken
    )
    run = run_executor(spec)
    assert run.result.status == "succeeded", run.result.message
    assert run.result.metrics["resumed_from_step"] == 0
    assert any(e["level"] == "warning" and "unusable" in e["message"] for e in run.of_type("log"))


@pytest.mark.slow
def test_sigterm_stops_the_cli_process_with_the_cancel_exit_code(
    tiny_model_dir: Path, dataset_files: dict, tmp_path: Path
) -> None:
    events_path = tmp_path / "events.jsonl"
    spec = spec_dict(tiny_model_dir, dataset_files["messages"], tmp_path / "out", n_epochs=100)
    spec["report"] = {"sinks": [{"type": "jsonl", "path": str(events_path)}]}
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(spec))
    workdir = tmp_path / "work"
    workdir.mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpu_worker", "run", str(spec_path), "--workdir", str(workdir)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            events = _read_events(events_path)
            if any(e["type"] == "metrics" for e in events):
                break
            time.sleep(0.2)
        else:
            pytest.fail(f"training never started: {proc.communicate(timeout=5)}")
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == ExitCode.CANCELLED, stderr[-3000:]
    assert json.loads(stdout.strip().splitlines()[-1])["status"] == "cancelled"
    events = _read_events(events_path)
    statuses = [e["data"]["status"] for e in events if e["type"] == "status"]
    assert statuses == ["running", "cancelled"]
    last = [e["data"] for e in events if e["type"] == "metrics"][-1]
    assert last["step"] < last["total_steps"] == 1500  # stopped early
    assert not any(workdir.iterdir())


def _read_events(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue  # a line being written
    return out
