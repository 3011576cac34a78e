"""Failures end in a typed reason with a message a user can act on."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import pytest

from gpu_worker import errors, transfer
from tests.gpu_worker.conftest import spec_dict, write_jsonl
from trainhub_contract.outcomes import ExitCode, Outcome
from trainhub_contract.spec import parse_job_spec


def _failed(run: Any, reason: str) -> str:
    result = run.result
    assert (result.status, result.reason) == ("failed", reason), result.message
    status = run.final_status
    assert status["data"] == {"status": "failed", "code": reason}
    assert status["message"] == result.message
    assert not run.artifact.exists()
    assert not any(run.workdir.iterdir())
    return result.message


def test_reasons_are_the_control_planes_end_reasons() -> None:
    from jobs.states import EndReason

    assert {r.value for r in EndReason} >= errors.REASONS | {errors.CANCELLED}
    assert errors.exit_code(Outcome.SUCCEEDED) == 0
    assert errors.exit_code(Outcome.FAILED, errors.OOM) == 1
    assert errors.exit_code(Outcome.CANCELLED, errors.CANCELLED) == 3
    assert errors.exit_code(Outcome.FAILED, errors.TIMEOUT) == 4
    with pytest.raises(ValueError, match="unknown"):
        errors.ExecutorError("nope", "x")


def test_outcomes_and_exit_codes_keep_their_wire_values() -> None:
    """Status events carry the strings and wrappers read the ints: renaming a member is fine,
    changing a value breaks every executor already deployed."""
    assert {o.name: o.value for o in Outcome} == {
        "RUNNING": "running",
        "SUCCEEDED": "succeeded",
        "FAILED": "failed",
        "CANCELLED": "cancelled",
    }
    assert {c.name: int(c) for c in ExitCode} == {
        "SUCCEEDED": 0,
        "FAILED": 1,
        "USAGE": 2,
        "CANCELLED": 3,
        "TIMEOUT": 4,
        "PREEMPTED": 5,
    }
    assert ExitCode.reported() == set(ExitCode) - {ExitCode.USAGE}


def test_a_broken_dataset_line_is_invalid_dataset_naming_the_line(
    tiny_model_dir: Path, dataset_files: dict, run_executor: Any, tmp_path: Path
) -> None:
    lines = dataset_files["text"][0].read_text().splitlines()
    lines[2] = '{"text": "unterminated'
    data = write_jsonl(tmp_path / "broken.jsonl", lines)
    run = run_executor(spec_dict(tiny_model_dir, data, tmp_path / "out", fmt="text"))
    message = _failed(run, "invalid_dataset")
    assert "line 3" in message and "invalid JSON" in message


def test_a_dataset_in_another_format_than_declared_is_invalid_dataset(
    tiny_model_dir: Path, dataset_files: dict, run_executor: Any, tmp_path: Path
) -> None:
    run = run_executor(
        spec_dict(tiny_model_dir, dataset_files["messages"], tmp_path / "out", fmt="alpaca")
    )
    assert "messages format but the job says alpaca" in _failed(run, "invalid_dataset")


def test_examples_truncated_to_nothing_are_invalid_dataset(
    tiny_model_dir: Path, run_executor: Any, tmp_path: Path
) -> None:
    # Every prompt is longer than max_seq_length, so no completion token survives truncation.
    records = [{"prompt": "word " * 200, "completion": "yes"} for _ in range(4)]
    data = write_jsonl(tmp_path / "long.jsonl", records)
    run = run_executor(
        spec_dict(
            tiny_model_dir, data, tmp_path / "out", fmt="prompt_completion", max_seq_length=32
        )
    )
    assert "max_seq_length=32" in _failed(run, "invalid_dataset")


@pytest.mark.parametrize("kind", ["missing", "garbage"])
def test_an_unreadable_model_is_invalid_model_naming_it(
    kind: str, dataset_files: dict, run_executor: Any, tmp_path: Path
) -> None:
    model = tmp_path / "model"
    if kind == "garbage":
        model.mkdir()
        (model / "config.json").write_text("{not json")
    run = run_executor(spec_dict(model, dataset_files["text"], tmp_path / "out", fmt="text"))
    message = _failed(run, "invalid_model")
    assert repr(str(model)) in message


def test_a_dataset_sha256_mismatch_is_download_failed_with_both_hashes(
    tiny_model_dir: Path, dataset_files: dict, run_executor: Any, tmp_path: Path
) -> None:
    path, real = dataset_files["text"]
    wrong = "0" * 64
    run = run_executor(spec_dict(tiny_model_dir, (path, wrong), tmp_path / "out", fmt="text"))
    message = _failed(run, "download_failed")
    assert f"expected {wrong}" in message and f"got {real}" in message


def test_a_missing_dataset_file_is_download_failed(
    tiny_model_dir: Path, run_executor: Any, tmp_path: Path
) -> None:
    run = run_executor(
        spec_dict(tiny_model_dir, (tmp_path / "nope.jsonl", "0" * 64), tmp_path / "out")
    )
    assert "nope.jsonl" in _failed(run, "download_failed")


def test_an_unreachable_artifact_url_is_upload_failed(
    tiny_model_dir: Path, dataset_files: dict, run_executor: Any, tmp_path: Path, monkeypatch: Any
) -> None:
    monkeypatch.setattr(transfer, "BACKOFF_SECONDS", 0.0)
    spec = spec_dict(tiny_model_dir, dataset_files["text"], tmp_path / "out", fmt="text")
    # Port 9 (discard) on loopback: nothing listens, the connection is refused at once.
    spec["outputs"]["artifact_url"] = "http://127.0.0.1:9/bundle.tar?X-Amz-Signature=secret"
    run = run_executor(spec)
    message = _failed(run, "upload_failed")
    assert "127.0.0.1:9/bundle.tar" in message and "secret" not in message
    assert "5 attempts" in message


def test_a_tiny_max_runtime_is_timeout(
    tiny_model_dir: Path, dataset_files: dict, run_executor: Any, tmp_path: Path
) -> None:
    spec = parse_job_spec(
        spec_dict(tiny_model_dir, dataset_files["text"], tmp_path / "out", fmt="text")
    )
    run = run_executor(dataclasses.replace(spec, max_runtime_seconds=0))
    assert "max_runtime_seconds=0" in _failed(run, "timeout")
    assert run.result.exit_code == ExitCode.TIMEOUT


def test_max_runtime_running_out_mid_training_stops_within_a_step(
    tiny_model_dir: Path, dataset_files: dict, run_executor: Any, tmp_path: Path, monkeypatch: Any
) -> None:
    from gpu_worker import trainer

    skew = {"seconds": 0.0}

    class Clock:  # the executor's clock, jumped forward by a day after step 3
        def __getattr__(self, name: str) -> Any:
            return getattr(time, name)

        def monotonic(self) -> float:
            return time.monotonic() + skew["seconds"]

    class JumpAfterStep3:
        def __getattr__(self, name: str) -> Any:
            if name.startswith("on_"):
                return lambda *a, **k: None
            raise AttributeError(name)

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if state.global_step == 3:
                skew["seconds"] = 86400.0

    monkeypatch.setattr(trainer, "time", Clock())
    spec = spec_dict(tiny_model_dir, dataset_files["text"], tmp_path / "out", fmt="text")
    run = run_executor(spec, callbacks=[JumpAfterStep3()])
    message = _failed(run, "timeout")
    assert "ran out at step 4" in message
    assert run.of_type("metrics")[-1]["data"]["step"] == 4


def test_out_of_memory_is_oom_with_the_batch_size_and_length(
    tiny_model_dir: Path, dataset_files: dict, run_executor: Any, tmp_path: Path, monkeypatch: Any
) -> None:
    import torch
    from transformers import Trainer

    def boom(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(Trainer, "training_step", boom)
    spec = spec_dict(
        tiny_model_dir,
        dataset_files["text"],
        tmp_path / "out",
        fmt="text",
        batch_size=8,
        max_seq_length=96,
    )
    message = _failed(run_executor(spec), "oom")
    assert "batch_size=8" in message and "max_seq_length=96" in message
    assert "gradient_accumulation_steps" in message  # the hint
    assert "turn gradient_checkpointing on" not in message  # it already is (the default)

    spec["hyperparameters"]["gradient_checkpointing"] = False
    message = _failed(run_executor(spec), "oom")
    assert "gradient_checkpointing=false" in message
    assert "turn gradient_checkpointing on" in message


def test_an_unexpected_crash_is_internal_error_with_the_traceback_logged(
    tiny_model_dir: Path, dataset_files: dict, run_executor: Any, tmp_path: Path, monkeypatch: Any
) -> None:
    from gpu_worker import train

    def crash(*args: Any, **kwargs: Any) -> Any:
        raise KeyError("surprise")

    monkeypatch.setattr(train, "package_adapter", crash)
    run = run_executor(
        spec_dict(tiny_model_dir, dataset_files["text"], tmp_path / "out", fmt="text")
    )
    assert "surprise" in _failed(run, "internal_error")
    assert any(e["level"] == "error" and "Traceback" in e["message"] for e in run.of_type("log"))


def test_cli_rejects_an_invalid_spec_with_the_usage_exit_code(tmp_path: Path, capsys: Any) -> None:
    from gpu_worker.__main__ import main

    path = tmp_path / "spec.json"
    path.write_text(json.dumps({"version": 1}))
    assert main(["run", str(path)]) == ExitCode.USAGE
    assert "job_id is required" in capsys.readouterr().err


def test_cli_cancel_file_and_signals_feed_should_stop(tmp_path: Path) -> None:
    import signal

    from gpu_worker.__main__ import _StopFlag

    flag = _StopFlag(tmp_path / "cancel")
    assert not flag()
    (tmp_path / "cancel").touch()
    assert flag()
    second = _StopFlag(None)
    second.handle(signal.SIGTERM, None)
    assert second()
    with pytest.raises(errors.Cancelled):  # a second signal stops at once
        second.handle(signal.SIGTERM, None)
