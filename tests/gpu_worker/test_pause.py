"""Pause on the executor's side: the cancel file's mode, a run that uploads a checkpoint of its
last finished step before it stops (and the next attempt resumes there), and the node's
supervisor writing the mode it pulls from the heartbeat into the cancel file."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gpu_worker import checkpoints
from gpu_worker.__main__ import _StopFlag
from gpu_worker.agent import supervisor
from tests.gpu_worker._control import ControlPlane, control_fixture  # noqa: F401 - ``control``
from tests.gpu_worker.agent.test_supervisor import HEARTBEAT, NO_CANCEL, SLEEPER, _spawn, _watch
from tests.gpu_worker.conftest import spec_dict
from trainhub_contract.outcomes import ExitCode, StopMode

PAUSE = (200, {"cancel": [{"job_id": "ftjob-1", "attempt": 2, "mode": "pause"}]})
CANCEL = (200, {"cancel": [{"job_id": "ftjob-1", "attempt": 2, "mode": "cancel"}]})


# --- the cancel file ------------------------------------------------------------------------


def test_the_cancel_file_says_pause_or_cancel(tmp_path: Path) -> None:
    path = tmp_path / "cancel"
    assert StopMode.of_file(path) is None
    StopMode.PAUSE.write_file(path)
    assert (path.read_text(), StopMode.of_file(path)) == ("pause", StopMode.PAUSE)
    StopMode.CANCEL.write_file(path)
    assert (path.read_text(), StopMode.of_file(path)) == ("", StopMode.CANCEL)
    path.write_text("something else")
    assert StopMode.of_file(path) is StopMode.CANCEL, "anything but pause stops at once"
    assert [p.name for p in tmp_path.iterdir()] == ["cancel"], "no temporary file left"


def test_the_cli_stop_flag_reports_the_files_mode(tmp_path: Path) -> None:
    import signal

    flag = _StopFlag(tmp_path / "cancel")
    assert flag() is None
    StopMode.PAUSE.write_file(tmp_path / "cancel")
    assert flag() is StopMode.PAUSE
    (tmp_path / "cancel").unlink()
    assert flag() is StopMode.PAUSE, "sticky: the run is already stopping"
    signalled = _StopFlag(None)
    signalled.handle(signal.SIGTERM, None)
    assert signalled() is StopMode.CANCEL


# --- a paused run ---------------------------------------------------------------------------


class PauseAt:
    """A TrainerCallback that writes "pause" into the cancel file once step ``at`` ended."""

    def __init__(self, cancel_file: Path, at: int) -> None:
        self.cancel_file, self.at = cancel_file, at
        self.steps: list[int] = []

    def __getattr__(self, name: str) -> Any:
        if name.startswith("on_"):
            return lambda *a, **k: None
        raise AttributeError(name)

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self.steps.append(state.global_step)
        if state.global_step == self.at:
            StopMode.PAUSE.write_file(self.cancel_file)


@pytest.mark.parametrize("accumulation", [1, 2], ids=["step-end", "mid-accumulation"])
def test_a_pause_uploads_a_checkpoint_of_the_last_step_and_the_next_attempt_resumes_there(
    tiny_model_dir: Path, dataset_files: dict, run_executor: Any, tmp_path: Path, accumulation: int
) -> None:
    """Asked after step 4: the executor sees it at the next check (step 5's end; with
    accumulation, step 5's first micro-batch, whose partial step is dropped) and checkpoints
    the last finished step, though no periodic checkpoint was due."""
    data = dataset_files["messages"]
    cancel_file = tmp_path / "cancel"
    watch = PauseAt(cancel_file, at=4)
    hyper = {"n_epochs": 2, "gradient_accumulation_steps": accumulation}
    first = run_executor(
        spec_dict(tiny_model_dir, data, tmp_path / "a", **hyper),
        callbacks=[watch],
        should_stop=_StopFlag(cancel_file),
    )

    assert (first.result.status, first.result.exit_code) == ("cancelled", ExitCode.CANCELLED)
    stopped = watch.steps[-1]
    assert stopped == (5 if accumulation == 1 else 4), watch.steps
    assert first.result.message == f"Paused during training after step {stopped}."
    assert [e["data"]["step"] for e in first.of_type("checkpoint")] == [stopped], "saved once"
    assert checkpoints.unpack(first.checkpoint, tmp_path / "ckpt") == stopped
    assert not first.artifact.exists()
    assert not any(first.workdir.iterdir()), "the working files go, the checkpoint stays"

    second = run_executor(
        spec_dict(tiny_model_dir, data, tmp_path / "b", attempt=2, resume=first.checkpoint, **hyper)
    )
    assert second.result.status == "succeeded", second.result.message
    assert second.result.metrics["resumed_from_step"] == stopped


def test_a_cancel_still_stops_without_a_checkpoint(
    tiny_model_dir: Path, dataset_files: dict, run_executor: Any, tmp_path: Path
) -> None:
    cancel_file = tmp_path / "cancel"

    class CancelAt(PauseAt):
        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if state.global_step == self.at:
                StopMode.CANCEL.write_file(self.cancel_file)

    run = run_executor(
        spec_dict(tiny_model_dir, dataset_files["messages"], tmp_path / "a", n_epochs=2),
        callbacks=[CancelAt(cancel_file, at=3)],
        should_stop=_StopFlag(cancel_file),
    )
    assert run.result.status == "cancelled"
    assert run.result.message == "Cancelled during training."
    assert run.of_type("checkpoint") == [] and not run.checkpoint.exists()


# --- the node's supervisor ------------------------------------------------------------------


def test_a_pause_in_the_heartbeat_answer_writes_pause_and_waits_the_pause_grace(
    control: ControlPlane, tmp_path: Path
) -> None:
    control.answer(HEARTBEAT, NO_CANCEL, PAUSE)
    proc = _spawn(SLEEPER)
    started = time.monotonic()

    code = supervisor._wait(proc, _watch(control, tmp_path), grace=0.2, pause_grace=1.5)

    assert code == (-15, True)
    assert time.monotonic() - started >= 1.5, "a pause waits its own, longer grace"
    assert (tmp_path / "cancel").read_text() == "pause", "the executor reads the mode here"
    assert len(control.to(HEARTBEAT)) >= 3, "asked on while pausing (a cancel may follow)"


def test_a_cancel_after_a_pause_overrides_it_and_cuts_the_wait(
    control: ControlPlane, tmp_path: Path
) -> None:
    control.answer(HEARTBEAT, PAUSE, CANCEL)
    proc = _spawn(SLEEPER)
    started = time.monotonic()

    code = supervisor._wait(proc, _watch(control, tmp_path), grace=0.3, pause_grace=60)

    assert code == (-15, True)
    assert time.monotonic() - started < 10
    assert (tmp_path / "cancel").read_text() == "", "a cancel: stop now"
    asked = len(control.to(HEARTBEAT))
    time.sleep(0.5)
    assert asked == 2 == len(control.to(HEARTBEAT)), "no asking after the cancel"


def test_an_executor_that_stops_by_itself_after_a_pause_is_not_signalled(
    control: ControlPlane, tmp_path: Path
) -> None:
    """What a real executor does: it reads "pause", saves, and exits with the cancel code."""
    control.answer(HEARTBEAT, PAUSE)
    cancel = tmp_path / "cancel"
    code = (
        "import pathlib, sys, time\n"
        f"p = pathlib.Path({str(cancel)!r})\n"
        "while not p.exists(): time.sleep(0.05)\n"
        "sys.exit(3 if p.read_text() == 'pause' else 1)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    assert supervisor._wait(proc, _watch(control, tmp_path), grace=0.2, pause_grace=30) == (
        ExitCode.CANCELLED,
        False,
    )
