"""Warm starts on a GPU node (gpu_worker.warm): the next executor is started ahead with its
imports done, is handed exactly one attempt, and exits with it, so whatever the attempt held
(GPU memory) is freed with its process; a node without a warm executor to hand to starts cold.

Real processes: the warm executor is ``python -m gpu_worker warm`` and trains the tiny model;
the supervisor runs behind the stand-in control plane of tests/gpu_worker/_control.py."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpu_worker.agent import node as node_settings
from gpu_worker.agent import supervisor
from gpu_worker.warm import WarmExecutor, read_order
from tests.gpu_worker._control import ControlPlane, control_fixture  # noqa: F401 - ``control``
from tests.gpu_worker.conftest import spec_dict

ROOT = Path(__file__).resolve().parents[2]
NODE = "node-w"


def _env() -> dict[str, str]:
    """A node's executor environment: the repository importable, one torch thread."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINHUB_")}
    return {**env, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


def _spec(tiny_model_dir: Path, dataset: tuple[Path, str], out: Path, attempt: int = 1) -> dict:
    spec = spec_dict(tiny_model_dir, dataset, out, attempt=attempt)
    spec["report"] = {"sinks": [{"type": "jsonl", "path": str(out / "events.jsonl")}]}
    out.mkdir(parents=True)
    return spec


def _events(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]


@pytest.fixture
def no_warm_left() -> Iterator[None]:
    """The supervisor's warm executor is per process: none survives the test."""
    supervisor._warm = None
    yield
    if supervisor._warm is not None:
        supervisor._warm.discard()
    supervisor._warm = None


# --- the order ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "line",
    [
        b"not json",
        b'["run", "spec.json"]',
        b'{"argv": "run spec.json"}',
        b'{"argv": []}',
        b'{"argv": ["make-tiny-model", "/tmp/x"]}',
        b'{"argv": ["run", 7]}',
        b'{"argv": ["run", "spec.json"], "env": {"A": 1}}',
        b'{"argv": ["run", "spec.json"], "env": ["A=1"]}',
        b'{"argv": ["run", "' + b"x" * 70_000 + b'"]}',
    ],
)
def test_a_warm_executor_runs_one_attempt_and_nothing_else(line: bytes) -> None:
    with pytest.raises(ValueError):
        read_order(line)


def test_an_order_is_an_attempts_argv_and_its_environment() -> None:
    order = b'{"argv": ["run", "spec.json", "--workdir", "w"], "env": {"TRAINHUB_REPORT_URL": "u"}}'
    assert read_order(order) == (
        ["run", "spec.json", "--workdir", "w"],
        {"TRAINHUB_REPORT_URL": "u"},
    )


# --- the warm process -----------------------------------------------------------------------


def test_a_warm_process_is_imported_before_its_order_then_trains_and_exits(
    tiny_model_dir: Path, dataset_files: dict[str, Any], tmp_path: Path
) -> None:
    warm = WarmExecutor.spawn(_env())
    try:
        assert warm.ready(timeout=180), "the imports end with 'ready' on the pipe"
        maps = Path(f"/proc/{warm.proc.pid}/maps").read_text()
        assert "libtorch" in maps, "torch was imported before any attempt was handed over"
        out = tmp_path / "out"
        spec = tmp_path / "spec.json"
        spec.write_text(json.dumps(_spec(tiny_model_dir, dataset_files["messages"], out)))

        proc = warm.hand(
            ["run", str(spec), "--workdir", str(tmp_path / "w")], {"TRAINHUB_MARK": "given"}
        )

        assert proc is warm.proc, "the warm process itself runs the attempt"
        assert proc.wait(timeout=300) == 0
    finally:
        warm.discard()
    events = _events(out)
    assert events[-1]["data"]["status"] == "succeeded"
    assert (out / "adapter.tar").exists()


def test_a_warm_process_discarded_unused_goes_away() -> None:
    warm = WarmExecutor.spawn(_env())
    warm.discard()
    assert warm.proc.poll() is not None
    assert warm.hand(["run", "spec.json"], {}) is None, "a gone one takes nothing"


# --- the node -------------------------------------------------------------------------------


def _node(control: ControlPlane, tmp_path: Path, **env: str) -> node_settings.NodeConfig:
    return node_settings.config_from(
        {
            "TRAINHUB_NODE_NAME": NODE,
            "TRAINHUB_NODE_TOKEN": "thn-w",
            "CELERY_BROKER_URL": "redis://127.0.0.1:6379/1",
            "TRAINHUB_CONTROL_URL": control.url,
            "TRAINHUB_NODE_WORKDIR": str(tmp_path / "node"),
            "TRAINHUB_NODE_CONTROL_POLL_SECONDS": "0.5",
            **env,
        }
    )


def test_warm_starts_are_on_by_default_except_where_asked_and_on_an_ephemeral_node(
    control: ControlPlane, tmp_path: Path
) -> None:
    assert _node(control, tmp_path).warm_executor
    assert not _node(control, tmp_path, TRAINHUB_NODE_WARM_EXECUTOR="0").warm_executor
    assert not _node(control, tmp_path, TRAINHUB_NODE_EPHEMERAL="1").warm_executor


def test_each_attempt_runs_in_a_fresh_warm_process_that_exits_with_it(
    control: ControlPlane,
    tmp_path: Path,
    tiny_model_dir: Path,
    dataset_files: dict[str, Any],
    no_warm_left: None,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    for name, value in _env().items():
        monkeypatch.setenv(name, value)
    # The node's worker holds its secrets; an executor, warm or cold, never gets them.
    monkeypatch.setenv("TRAINHUB_NODE_TOKEN", "thn-node-secret")
    monkeypatch.setenv("CELERY_BROKER_URL", "redis://trainhub-node-node-w:thn-node-secret@h/1")
    node = _node(control, tmp_path)
    outs = [tmp_path / f"out{n}" for n in (1, 2)]
    specs = [_spec(tiny_model_dir, dataset_files["messages"], outs[n - 1], n) for n in (1, 2)]
    control.answer(
        f"/api/v1/nodes/{NODE}/claim/",
        *[(200, {"spec": s, "report_token": f"rt-{s['attempt']}"}) for s in specs],
    )
    control.answer(f"/api/v1/nodes/{NODE}/heartbeat/", (200, {"cancel": []}))
    caplog.set_level(logging.INFO, logger="gpu_worker.agent.supervisor")

    supervisor.prepare_warm(node)  # as the worker's pool process does when it starts
    assert supervisor._warm is not None
    first = supervisor._warm.proc
    assert b"thn-node-secret" not in Path(f"/proc/{first.pid}/environ").read_bytes()

    assert supervisor.run({"job_id": "ftjob-test", "attempt": 1}, node) == "exit 0"
    assert first.poll() == 0, "the first attempt's process has exited (its memory freed)"
    second = supervisor._warm.proc if supervisor._warm is not None else None
    assert second is not None and second.pid != first.pid and second.poll() is None

    assert supervisor.run({"job_id": "ftjob-test", "attempt": 2}, node) == "exit 0"
    assert second.poll() == 0
    assert supervisor._warm is not None and supervisor._warm.proc.pid not in (first.pid, second.pid)

    starts = [r.getMessage() for r in caplog.records if "starting attempt" in r.getMessage()]
    assert starts == [
        f"starting attempt 1 of ftjob-test (warm start, pid {first.pid})",
        f"starting attempt 2 of ftjob-test (warm start, pid {second.pid})",
    ]
    for out in outs:
        assert _events(out)[-1]["data"]["status"] == "succeeded"


def test_without_a_warm_process_to_take_it_an_attempt_starts_cold(
    control: ControlPlane, tmp_path: Path, no_warm_left: None, caplog: pytest.LogCaptureFixture
) -> None:
    """A warm process that died (killed, crashed in its imports) is not waited for."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"], stdin=subprocess.PIPE)
    dead.wait()
    read, write = os.pipe()
    os.close(write)
    supervisor._warm = WarmExecutor(dead, read)
    caplog.set_level(logging.INFO, logger="gpu_worker.agent.supervisor")

    proc, start = supervisor._start_executor(["--version-of-nothing"], {})

    assert start == "cold" and proc.pid != dead.pid
    assert proc.wait(timeout=60) == 2, "the cold executor got the arguments (and refused them)"
    assert supervisor._warm is None
    assert any("starting it cold" in r.getMessage() for r in caplog.records)
