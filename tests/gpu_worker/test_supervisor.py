"""The GPU node's side without Django: its settings, the GPU probe override, and how the
supervisor stops an executor and reports one that died without a word (real child processes)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import requests
import responses

from gpu_worker import node as node_settings
from gpu_worker import supervisor

CLAIM_URL = "http://control.test/api/v1/nodes/claim/"
MESSAGE = {"claim_url": CLAIM_URL, "spec": {"job_id": "ftjob-1", "attempt": 2}}
SLEEPER = "import time; time.sleep(60)"
STUBBORN = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"


def _config(tmp_path: Path, **env: str) -> node_settings.NodeConfig:
    return node_settings.config_from(
        {
            "TRAINHUB_NODE_TOKEN": "thn-x",
            "CELERY_BROKER_URL": "redis://127.0.0.1:6379/1",
            "TRAINHUB_NODE_WORKDIR": str(tmp_path),
            **env,
        }
    )


def test_settings_from_the_environment(tmp_path: Path) -> None:
    cfg = _config(
        tmp_path,
        TRAINHUB_NODE_NAME="gpu 01/a",
        TRAINHUB_NODE_LABELS="region=eu-west, tier = a100 ,",
        TRAINHUB_NODE_EPHEMERAL="true",
        TRAINHUB_CHECKPOINT_EVERY_STEPS="50",
    )
    assert cfg.name == "gpu-01-a" and cfg.queue == "gpu.node.gpu-01-a"
    assert cfg.labels == {"region": "eu-west", "tier": "a100"}
    assert cfg.ephemeral and cfg.checkpoint_every_steps == 50
    assert cfg.checkpoint_every_seconds is None
    assert "thn-x" not in repr(cfg) and "redis://" not in repr(cfg)
    assert cfg.cancel_file("ftjob-1", 2) == tmp_path / "cancel" / "ftjob-1-a2"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"TRAINHUB_NODE_TOKEN": ""}, "TRAINHUB_NODE_TOKEN"),
        ({"CELERY_BROKER_URL": ""}, "CELERY_BROKER_URL"),
        ({"TRAINHUB_NODE_LABELS": "region"}, "bad label 'region'"),
    ],
)
def test_bad_settings_name_the_variable(tmp_path: Path, env: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _config(tmp_path, **env)


def test_the_gpu_override_replaces_the_probe(tmp_path: Path) -> None:
    caps = node_settings.probe(
        _config(tmp_path, TRAINHUB_NODE_GPUS="NVIDIA H100 80GB HBM3:81559,L4:23034")
    )
    assert caps["gpus"] == [
        {"name": "NVIDIA H100 80GB HBM3", "vram_mb": 81559},
        {"name": "L4", "vram_mb": 23034},
    ]
    assert caps["gpu_count"] == 2
    none = node_settings.probe(_config(tmp_path, TRAINHUB_NODE_GPUS=""))
    assert (none["gpu_count"], none["backend"]) == (0, "peft")


def _spawn(code: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    time.sleep(0.5)  # past the interpreter's start, so its signal dispositions are in place
    return proc


def test_without_a_cancel_the_supervisor_just_waits(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"], start_new_session=True)
    assert supervisor._wait(proc, tmp_path / "cancel", grace=0.2) == (3, False)


def test_after_a_cancel_and_the_grace_an_executor_gets_sigterm(tmp_path: Path) -> None:
    cancel = tmp_path / "cancel"
    proc = _spawn(SLEEPER)
    cancel.touch()
    started = time.monotonic()
    assert supervisor._wait(proc, cancel, grace=0.5) == (-15, True)
    assert 0.5 <= time.monotonic() - started < 5


def test_an_executor_ignoring_sigterm_gets_sigkill(tmp_path: Path) -> None:
    cancel = tmp_path / "cancel"
    proc = _spawn(STUBBORN)
    cancel.touch()
    assert supervisor._wait(proc, cancel, grace=0.5) == (-9, True)


class SinkRecorder:
    """Stands in for the CelerySink (tested on the real broker in test_report.py)."""

    sent: list[tuple[dict[str, Any], str, int, list[dict]]] = []

    def __init__(self, broker_url: str, **identity: Any) -> None:
        self.identity = {"broker_url": broker_url, **identity}

    def send(self, job_id: str, attempt: int, events: list[dict]) -> None:
        SinkRecorder.sent.append((self.identity, job_id, attempt, events))

    def close(self) -> None:
        pass


@pytest.mark.parametrize(
    ("code", "signalled", "data"),
    [
        (-15, True, {"status": "cancelled"}),  # SIGTERM before the executor's handler
        (-9, True, {"status": "cancelled"}),
        (-9, False, {"status": "failed", "code": "worker_lost"}),  # e.g. the kernel's OOM killer
        (139, False, {"status": "failed", "code": "worker_lost"}),
        (2, False, {"status": "failed", "code": "internal_error"}),  # a spec it refused
    ],
)
def test_a_silent_death_is_reported_with_the_nodes_identity(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int, signalled: bool, data: dict
) -> None:
    SinkRecorder.sent = []
    monkeypatch.setattr(supervisor, "CelerySink", SinkRecorder)
    cfg = _config(tmp_path, TRAINHUB_NODE_NAME="node-a")
    supervisor._report_death(cfg, "ftjob-1", 2, code, signalled)
    ((identity, job_id, attempt, events),) = SinkRecorder.sent
    assert identity == {"broker_url": cfg.broker_url, "node": "node-a", "token": "thn-x"}
    assert (job_id, attempt) == ("ftjob-1", 2)
    assert events[0]["data"] == data
    assert events[0]["seq"] == supervisor.SUPERVISOR_SEQ


# --- the claim ------------------------------------------------------------------------------


@responses.activate
def test_a_claim_is_retried_2_then_4_seconds_apart_after_a_5xx_or_a_dropped_connection(
    tmp_path: Path,
) -> None:
    node = _config(tmp_path)
    responses.post(CLAIM_URL, status=503)
    responses.post(CLAIM_URL, body=requests.ConnectionError("connection reset"))
    responses.post(CLAIM_URL, json={"ok": True})
    sleeps: list[float] = []
    assert supervisor.claim(MESSAGE, node, sleep=sleeps.append) is True
    assert sleeps == [2.0, 4.0] and len(responses.calls) == 3
    request = responses.calls[0].request
    assert request.headers["Authorization"] == "Bearer thn-x"
    assert json.loads(request.body or b"") == {"node": node.name, "job_id": "ftjob-1", "attempt": 2}


@pytest.mark.parametrize("status", [401, 404, 409])
@responses.activate
def test_a_refused_claim_is_not_ours_and_is_not_asked_again(tmp_path: Path, status: int) -> None:
    responses.post(CLAIM_URL, status=status, json={"detail": "no"})
    sleeps: list[float] = []
    assert supervisor.claim(MESSAGE, _config(tmp_path), sleep=sleeps.append) is False
    assert sleeps == [] and len(responses.calls) == 1


@responses.activate
def test_a_claim_that_keeps_failing_raises_after_three_tries(tmp_path: Path) -> None:
    responses.post(CLAIM_URL, status=502)  # repeated for every call
    sleeps: list[float] = []
    with pytest.raises(requests.HTTPError, match="502"):
        supervisor.claim(MESSAGE, _config(tmp_path), sleep=sleeps.append)
    assert sleeps == [2.0, 4.0] and len(responses.calls) == 3
