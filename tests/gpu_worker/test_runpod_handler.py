"""The RunPod serverless handler, run through the SDK's own job runner (``rp_job.run_job``), so
what is checked is what RunPod would record: ``output`` / ``error`` / ``stopPod``.

Most tests replace ``gpu_worker.train.run`` with a small fake that drives the reporter and
returns a RunResult-shaped object. That is acceptable here ONLY because the real ``run()`` is
tested on the tiny model in the executor's own tests; the last test runs the real thing.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.util
import sys
import threading
import time
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import runpod.serverless
from runpod.serverless.modules import rp_job

import gpu_worker
from gpu_worker.runpod_handler import handler
from gpu_worker.tiny_model import DEMO_DATASET_PATH
from trainhub_contract.outcomes import Outcome

SHA = "ab" * 32


def spec_input(tmp_path: Path, **overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "version": 1,
        "job_id": "ftjob-rp1",
        "attempt": 1,
        "model": "acme/tiny",
        "dataset": {"url": "file:///data/train.jsonl", "sha256": "0" * 64, "format": "messages"},
        "outputs": {
            "artifact_url": (tmp_path / "bundle.tar").as_uri(),
            "checkpoint_url": (tmp_path / "ckpt.tar").as_uri(),
        },
    }
    data.update(overrides)
    return data


def run_job(job_input: Any, job_id: str = "t") -> dict[str, Any]:
    return asyncio.run(rp_job.run_job(handler, {"id": job_id, "input": job_input}))


@pytest.fixture
def progress(monkeypatch: pytest.MonkeyPatch) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Captures RunPod progress updates instead of posting them (no network in tests)."""
    updates: list[tuple[dict[str, Any], dict[str, Any]]] = []
    monkeypatch.setattr(
        runpod.serverless, "progress_update", lambda job, p: updates.append((job, p))
    )
    return updates


# --- a stand-in for gpu_worker.train (see the module docstring) -----------------------------


@dataclass
class FakeRunResult:
    status: Outcome
    reason: str | None = None
    message: str = ""
    bundle_sha256: str | None = None
    bundle_size: int | None = None
    manifest: dict[str, Any] | None = None
    metrics: dict[str, Any] = field(default_factory=dict)


@pytest.fixture
def fake_train(monkeypatch: pytest.MonkeyPatch) -> Callable[[Callable[..., Any]], list[dict]]:
    """Install ``run`` as ``gpu_worker.train.run`` (a fake module: torch is never imported);
    returns the list of calls it records."""

    def install(run: Callable[..., Any]) -> list[dict]:
        calls: list[dict] = []

        def recorder(spec: Any, *, reporter: Any, workdir: Path, should_stop: Any = None) -> Any:
            calls.append(
                {"spec": spec, "reporter": reporter, "workdir": workdir, "should_stop": should_stop}
            )
            assert workdir.is_dir()
            return run(spec, reporter=reporter, workdir=workdir, should_stop=should_stop)

        module = types.ModuleType("gpu_worker.train")
        module.run = recorder  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, "gpu_worker.train", module)
        monkeypatch.setattr(gpu_worker, "train", module, raising=False)
        return calls

    return install


def succeeding_run(spec: Any, *, reporter: Any, workdir: Path, should_stop: Any) -> FakeRunResult:
    reporter.status(Outcome.RUNNING, "Training started.")
    reporter.metrics(step=1, total_steps=1, loss=1.0)
    manifest = {"files": [{"name": "adapter_model.safetensors", "size": 3, "sha256": "c" * 64}]}
    reporter.artifact(manifest, SHA, 10240)
    reporter.status(Outcome.SUCCEEDED, "Training finished.", sha256=SHA)
    return FakeRunResult(
        Outcome.SUCCEEDED,
        bundle_sha256=SHA,
        bundle_size=10240,
        manifest=manifest,
        metrics={"loss": 1.0},
    )


# --- tests ----------------------------------------------------------------------------------


def test_an_invalid_spec_is_a_string_error(progress: list, fake_train: Any) -> None:
    calls = fake_train(succeeding_run)
    result = run_job({"version": 1, "job_id": "ftjob-x"})
    assert set(result) == {"error"}
    assert isinstance(result["error"], str)
    assert "invalid job spec" in result["error"] and "attempt is required" in result["error"]
    assert calls == [] and progress == []


def test_a_missing_input_is_a_string_error() -> None:
    result = run_job(None)
    assert isinstance(result["error"], str) and "invalid job spec" in result["error"]


def test_bad_report_settings_are_a_string_error(tmp_path: Path) -> None:
    result = run_job(spec_input(tmp_path, report={"sinks": [{"type": "carrier-pigeon"}]}))
    assert isinstance(result["error"], str) and "carrier-pigeon" in result["error"]


def test_a_successful_run_returns_the_bundle_and_reports_progress(
    tmp_path: Path, progress: list, fake_train: Any
) -> None:
    calls = fake_train(succeeding_run)
    result = run_job(spec_input(tmp_path), job_id="rp-42")

    assert "error" not in result
    assert result["stopPod"] is True  # refresh_worker: no dirty GPU memory for the next job
    out = result["output"]
    assert out["status"] == "succeeded"
    assert (out["sha256"], out["size"]) == (SHA, 10240)
    assert out["manifest"]["files"][0]["name"] == "adapter_model.safetensors"
    assert out["metrics"] == {"loss": 1.0}
    assert [e["seq"] for e in out["events"]] == list(range(len(out["events"])))
    assert [e["type"] for e in out["events"]] == ["status", "metrics", "artifact", "status"]

    assert progress, "the RunPod sink never called progress_update"
    assert {job["id"] for job, _ in progress} == {"rp-42"}
    last = progress[-1][1]
    assert last["attempt"] == 1 and last["events"] == out["events"]

    (call,) = calls
    assert call["spec"].job_id == "ftjob-rp1"
    assert callable(call["should_stop"]) and call["should_stop"]() is False
    assert not call["workdir"].exists()  # scratch space removed after the run


def test_a_failed_run_is_a_reason_prefixed_string(
    tmp_path: Path, progress: list, fake_train: Any
) -> None:
    def oom(spec: Any, *, reporter: Any, **_: Any) -> FakeRunResult:
        reporter.status(Outcome.FAILED, "Out of memory.", code="oom")
        return FakeRunResult(Outcome.FAILED, "oom", "Out of memory at batch_size 8; lower it.")

    fake_train(oom)
    result = run_job(spec_input(tmp_path))
    assert result == {"error": "oom: Out of memory at batch_size 8; lower it.", "stopPod": True}
    assert progress[-1][1]["events"][-1]["data"] == {"status": "failed", "code": "oom"}


def test_a_crashing_run_is_still_a_string_error_and_an_error_event(
    tmp_path: Path, progress: list, fake_train: Any
) -> None:
    def crash(spec: Any, **_: Any) -> FakeRunResult:
        raise RuntimeError("boom")

    fake_train(crash)
    result = run_job(spec_input(tmp_path))
    assert result == {"error": "internal_error: RuntimeError: boom", "stopPod": True}
    last_event = progress[-1][1]["events"][-1]
    assert last_event["type"] == "error" and last_event["data"]["code"] == "internal_error"


def test_a_cancelled_job_asks_run_to_stop_and_waits_for_it(
    tmp_path: Path, progress: list, fake_train: Any
) -> None:
    started, seen_stop = threading.Event(), threading.Event()

    def slow(spec: Any, *, reporter: Any, should_stop: Any, **_: Any) -> FakeRunResult:
        started.set()
        deadline = time.monotonic() + 10
        while not should_stop():
            assert time.monotonic() < deadline, "should_stop never became true"
            time.sleep(0.01)
        seen_stop.set()
        reporter.status(Outcome.CANCELLED, "Stopped on request.")
        return FakeRunResult(Outcome.CANCELLED, "cancelled", "Stopped on request.")

    fake_train(slow)

    async def scenario() -> None:
        task = asyncio.ensure_future(
            rp_job.run_job(handler, {"id": "c", "input": spec_input(tmp_path)})
        )
        while not started.is_set():
            await asyncio.sleep(0.01)
        task.cancel()  # what the SDK's stop-channel monitor does
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())
    assert seen_stop.is_set()
    assert progress[-1][1]["events"][-1]["data"]["status"] == "cancelled"


# --- the real executor on the tiny model ----------------------------------------------------

_HAS_TRAIN = importlib.util.find_spec("gpu_worker.train") is not None


@pytest.mark.slow
@pytest.mark.skipif(
    not _HAS_TRAIN, reason="gpu_worker/train.py (the executor's run()) is not in the tree yet"
)
def test_the_real_handler_trains_the_tiny_model_end_to_end(tmp_path: Path, progress: list) -> None:
    from gpu_worker.tiny_model import build_tiny_model
    from trainhub_contract.bundle import verify_bundle

    model_dir = build_tiny_model(tmp_path / "tiny")
    # A few demo conversations are enough to go through every stage; this test is about the
    # handler, the executor's own tests cover training quality.
    data = b"".join(DEMO_DATASET_PATH.read_bytes().splitlines(keepends=True)[:8])
    dataset = tmp_path / "train.jsonl"
    dataset.write_bytes(data)
    job_input = spec_input(
        tmp_path,
        model=str(model_dir),
        dataset={
            "url": dataset.as_uri(),
            "sha256": hashlib.sha256(data).hexdigest(),
            "format": "messages",
        },
        adapter={"type": "lora", "r": 4, "alpha": 8},
        hyperparameters={"n_epochs": 1, "batch_size": 4, "max_seq_length": 128},
        max_runtime_seconds=600,
    )
    result = run_job(job_input, job_id="e2e")

    assert "error" not in result, result.get("error")
    out = result["output"]
    bundle = (tmp_path / "bundle.tar").read_bytes()
    assert out["sha256"] == hashlib.sha256(bundle).hexdigest()
    assert out["size"] == len(bundle)
    verified = verify_bundle([bundle])
    assert verified.sha256 == out["sha256"]
    names = {f["path"] for f in out["manifest"]["files"]}
    assert "adapter_model.safetensors" in names
    assert names == {f.path for f in verified.files}
    types_seen = {e["type"] for e in out["events"]}
    assert {"status", "metrics", "artifact"} <= types_seen
    assert progress and progress[-1][1]["events"] == out["events"]
