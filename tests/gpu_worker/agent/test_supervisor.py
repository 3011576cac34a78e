"""The GPU node's side without Django: its settings (its own broker user, the control URL), the
claim through NodeApi, and how the supervisor runs an attempt: ids from the broker checked
before they name a file, the spec from the claim, an executor that holds the attempt's report
token and none of the node's secrets, a cancel pulled from the heartbeat answer, and a death
reported over HTTP. Real child processes, a real loopback HTTP server (tests/gpu_worker/
_control.py) standing in for the control plane; tests/jobs/services/fleet/test_node_client.py checks that
the real endpoints answer as it does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import requests
import responses
from kombu.utils.url import url_to_parts

from gpu_worker.agent import node as node_settings
from gpu_worker.agent import supervisor
from gpu_worker.agent.node_api import NodeApi
from gpu_worker.sinks import HttpSink
from tests.gpu_worker._control import ControlPlane, control_fixture  # noqa: F401 - ``control``

NODE = "node-a"
CLAIM = f"/api/v1/nodes/{NODE}/claim/"
HEARTBEAT = f"/api/v1/nodes/{NODE}/heartbeat/"
EVENTS = f"/api/v1/nodes/{NODE}/attempts/ftjob-1/2/events/"
MESSAGE = {"job_id": "ftjob-1", "attempt": 2}
SPEC = {"version": 1, "job_id": "ftjob-1", "attempt": 2, "model": "acme/tiny"}
CLAIMED = (200, {"spec": SPEC, "report_token": "rt-secret"})
NO_CANCEL: tuple[int, dict[str, list]] = (200, {"cancel": []})
CANCEL = (200, {"cancel": [{"job_id": "ftjob-1", "attempt": 2}]})
SLEEPER = "import time; time.sleep(60)"
STUBBORN = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"


def _config(tmp_path: Path, **env: str) -> node_settings.NodeConfig:
    return node_settings.config_from(
        {
            "TRAINHUB_NODE_NAME": NODE,
            "TRAINHUB_NODE_TOKEN": "thn-x",
            "CELERY_BROKER_URL": "redis://127.0.0.1:6379/1",
            "TRAINHUB_CONTROL_URL": "http://control.test",
            "TRAINHUB_NODE_WORKDIR": str(tmp_path),
            # Cold starts: sys.executable is a fake executor here (tests/gpu_worker/test_warm.py).
            "TRAINHUB_NODE_WARM_EXECUTOR": "0",
            **env,
        }
    )


# --- settings -------------------------------------------------------------------------------


def test_settings_from_the_environment(tmp_path: Path) -> None:
    cfg = _config(
        tmp_path,
        TRAINHUB_NODE_NAME="gpu 01/a",
        TRAINHUB_NODE_LABELS="region=eu-west, tier = a100 ,",
        TRAINHUB_NODE_EPHEMERAL="true",
        TRAINHUB_CHECKPOINT_EVERY_STEPS="50",
        TRAINHUB_CONTROL_URL="https://plane.example/",
        TRAINHUB_NODE_CONTROL_POLL_SECONDS="0.5",
    )
    assert cfg.name == "gpu-01-a" and cfg.queue == "gpu.node.gpu-01-a"
    assert cfg.labels == {"region": "eu-west", "tier": "a100"}
    assert cfg.ephemeral and cfg.checkpoint_every_steps == 50
    assert cfg.checkpoint_every_seconds is None
    assert (cfg.control_url, cfg.control_poll_seconds) == ("https://plane.example", 0.5)
    assert "thn-x" not in repr(cfg) and "redis://" not in repr(cfg)
    assert cfg.cancel_file("ftjob-1", 2) == tmp_path / "cancel" / "ftjob-1-a2"


def test_the_node_logs_in_to_the_broker_as_its_own_user(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TRAINHUB_BROKER_USER_PREFIX", raising=False)  # the default name
    cfg = _config(tmp_path, TRAINHUB_NODE_TOKEN="thn-a/b:c@d%e")
    parts = url_to_parts(cfg.broker_url)  # as kombu reads it
    assert (parts.username, parts.password) == (f"trainhub-node-{NODE}", "thn-a/b:c@d%e")
    assert (parts.hostname, parts.port, parts.path) == ("127.0.0.1", 6379, "1")


def test_installations_sharing_a_redis_name_their_node_users_apart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRAINHUB_BROKER_USER_PREFIX", "lab2-node-")
    parts = url_to_parts(_config(tmp_path).broker_url)
    assert parts.username == f"lab2-node-{NODE}"


@pytest.mark.parametrize(
    "url",
    ["redis://ops:pw@127.0.0.1:6379/1", "redis+socket:///var/run/redis.sock", "memory://"],
    ids=["names-a-user", "unix-socket", "not-redis"],
)
def test_a_broker_url_naming_a_user_or_no_redis_host_is_kept(url: str) -> None:
    assert node_settings.with_node_credentials(url, NODE, "thn-x") == url


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"TRAINHUB_NODE_TOKEN": ""}, "TRAINHUB_NODE_TOKEN"),
        ({"CELERY_BROKER_URL": ""}, "CELERY_BROKER_URL"),
        ({"TRAINHUB_CONTROL_URL": ""}, "TRAINHUB_CONTROL_URL"),
        ({"TRAINHUB_CONTROL_URL": "plane.example"}, "TRAINHUB_CONTROL_URL"),
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


# --- waiting for the executor; a cancel pulled from the heartbeat ---------------------------


def _spawn(code: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    time.sleep(0.5)  # past the interpreter's start, so its signal dispositions are in place
    return proc


def _watch(control: ControlPlane, tmp_path: Path, period: float = 0.2) -> Any:
    api = NodeApi(_config(tmp_path, TRAINHUB_CONTROL_URL=control.url))
    return supervisor._CancelWatch(api, ("ftjob-1", 2), tmp_path / "cancel", period)


def test_without_a_cancel_the_supervisor_just_waits(control: ControlPlane, tmp_path: Path) -> None:
    control.answer(HEARTBEAT, NO_CANCEL)
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"], start_new_session=True)
    assert supervisor._wait(proc, _watch(control, tmp_path), grace=0.2) == (3, False)


def test_after_a_cancel_and_the_grace_an_executor_gets_sigterm(
    control: ControlPlane, tmp_path: Path
) -> None:
    control.answer(HEARTBEAT, NO_CANCEL)
    proc = _spawn(SLEEPER)
    (tmp_path / "cancel").touch()
    started = time.monotonic()
    assert supervisor._wait(proc, _watch(control, tmp_path), grace=0.5) == (-15, True)
    assert 0.5 <= time.monotonic() - started < 5


def test_an_executor_ignoring_sigterm_gets_sigkill(control: ControlPlane, tmp_path: Path) -> None:
    control.answer(HEARTBEAT, NO_CANCEL)
    proc = _spawn(STUBBORN)
    (tmp_path / "cancel").touch()
    assert supervisor._wait(proc, _watch(control, tmp_path), grace=0.5) == (-9, True)


def test_a_cancel_in_the_heartbeat_answer_writes_the_cancel_file_and_stops_the_executor(
    control: ControlPlane, tmp_path: Path
) -> None:
    control.answer(HEARTBEAT, NO_CANCEL, CANCEL)
    proc = _spawn(SLEEPER)

    assert supervisor._wait(proc, _watch(control, tmp_path), grace=0.3) == (-15, True)

    assert (tmp_path / "cancel").exists(), "the executor watches this file"
    asks = control.to(HEARTBEAT)
    assert len(asks) == 2, "asked until told; then the grace, then SIGTERM"
    assert asks[0].headers["Authorization"] == "Bearer thn-x"
    assert asks[0].body == {"stopping": False, "running": ["ftjob-1", 2]}


def test_a_failed_ask_or_a_cancel_of_something_else_does_not_stop_the_executor(
    control: ControlPlane, tmp_path: Path
) -> None:
    others = {"cancel": [{"job_id": "ftjob-9", "attempt": 2}, {"job_id": "ftjob-1", "attempt": 3},
                         {"job_id": "../ftjob-1", "attempt": 2}, "ftjob-1"]}  # fmt: skip
    control.answer(HEARTBEAT, (503, {}), (200, others), (200, {"not": "a list"}), NO_CANCEL)
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(2.5)"], start_new_session=True
    )

    assert supervisor._wait(proc, _watch(control, tmp_path), grace=0.2) == (0, False)

    assert not (tmp_path / "cancel").exists()
    assert len(control.to(HEARTBEAT)) >= 3, "a failed ask is asked again on the next tick"


# --- the claim ------------------------------------------------------------------------------

CLAIM_URL = f"http://control.test{CLAIM}"


@responses.activate
def test_a_claim_is_retried_2_then_4_seconds_apart_after_a_5xx_or_a_dropped_connection(
    tmp_path: Path,
) -> None:
    responses.post(CLAIM_URL, status=503)
    responses.post(CLAIM_URL, body=requests.ConnectionError("connection reset"))
    responses.post(CLAIM_URL, json=CLAIMED[1])
    sleeps: list[float] = []

    claim = NodeApi(_config(tmp_path)).claim("ftjob-1", 2, sleep=sleeps.append)

    assert claim is not None and (claim.spec, claim.report_token) == (SPEC, "rt-secret")
    assert "rt-secret" not in repr(claim)
    assert sleeps == [2.0, 4.0] and len(responses.calls) == 3
    request = responses.calls[0].request
    assert request.headers["Authorization"] == "Bearer thn-x"
    assert json.loads(request.body or b"") == {"job_id": "ftjob-1", "attempt": 2}


@pytest.mark.parametrize("status", [401, 403, 404, 409])
@responses.activate
def test_a_refused_claim_is_not_ours_and_is_not_asked_again(tmp_path: Path, status: int) -> None:
    responses.post(CLAIM_URL, status=status, json={"detail": "no"})
    sleeps: list[float] = []
    assert NodeApi(_config(tmp_path)).claim("ftjob-1", 2, sleep=sleeps.append) is None
    assert sleeps == [] and len(responses.calls) == 1


@responses.activate
def test_a_claim_that_keeps_failing_raises_after_three_tries(tmp_path: Path) -> None:
    responses.post(CLAIM_URL, status=502)  # repeated for every call
    sleeps: list[float] = []
    with pytest.raises(requests.HTTPError, match="502"):
        NodeApi(_config(tmp_path)).claim("ftjob-1", 2, sleep=sleeps.append)
    assert sleeps == [2.0, 4.0] and len(responses.calls) == 3


@responses.activate
def test_a_claim_answered_with_another_attempts_spec_is_not_run(tmp_path: Path) -> None:
    responses.post(CLAIM_URL, json={"spec": {**SPEC, "attempt": 1}, "report_token": "rt"})
    with pytest.raises(ValueError, match="another attempt's spec"):
        NodeApi(_config(tmp_path)).claim("ftjob-1", 2, sleep=lambda _: None)
    assert len(responses.calls) == 1


# --- one attempt, end to end on the node ------------------------------------------------------

# Stands in for ``python -m gpu_worker run``: records what it was given, then exits or sleeps.
FAKE_EXECUTOR = """\
import json, os, sys, time
spec = sys.argv[sys.argv.index("run") + 1]
with open(os.environ["FAKE_EXECUTOR_DUMP"], "w") as out:
    json.dump({"argv": sys.argv, "env": dict(os.environ), "spec": json.load(open(spec)),
               "spec_mode": oct(os.stat(spec).st_mode & 0o777)}, out)
time.sleep(float(os.environ.get("FAKE_EXECUTOR_SLEEP", "0")))
sys.exit(int(os.environ.get("FAKE_EXECUTOR_EXIT", "0")))
"""


@pytest.fixture
def executor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where the fake executor dumps what it saw. The supervisor runs ``sys.executable -m
    gpu_worker run ...``: sys.executable is a script that runs the fake with the real Python.
    The supervisor's own environment holds the node's secrets, as a node's worker does."""
    fake = tmp_path / "bin" / "python"
    fake.parent.mkdir()
    (tmp_path / "bin" / "fake_executor.py").write_text(FAKE_EXECUTOR)
    fake.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{fake.parent}/fake_executor.py" "$@"\n')
    fake.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(fake))  # the module supervisor reads it from
    dump = tmp_path / "dump.json"
    monkeypatch.setenv("FAKE_EXECUTOR_DUMP", str(dump))
    monkeypatch.setenv("TRAINHUB_NODE_TOKEN", "thn-x")
    monkeypatch.setenv("CELERY_BROKER_URL", "redis://trainhub-node-node-a:thn-x@127.0.0.1/1")
    monkeypatch.setenv("CELERY_RESULT_BACKEND", "redis://:backend-secret@127.0.0.1/2")
    return dump


def _node(control: ControlPlane, tmp_path: Path, **env: str) -> node_settings.NodeConfig:
    return _config(
        tmp_path / "node",
        TRAINHUB_CONTROL_URL=control.url,
        TRAINHUB_NODE_CONTROL_POLL_SECONDS="0.2",
        TRAINHUB_NODE_CANCEL_GRACE_SECONDS="0.3",
        **env,
    )


def test_the_executor_gets_the_claimed_spec_and_the_report_token_but_no_node_secret(
    control: ControlPlane, tmp_path: Path, executor: Path
) -> None:
    control.answer(CLAIM, CLAIMED)
    control.answer(HEARTBEAT, NO_CANCEL)
    cfg = _node(control, tmp_path)

    assert supervisor.run(dict(MESSAGE), cfg) == "exit 0"

    [claim] = control.to(CLAIM)
    assert claim.headers["Authorization"] == "Bearer thn-x"
    assert claim.body == {"job_id": "ftjob-1", "attempt": 2}
    seen = json.loads(executor.read_text())
    env = seen["env"]
    assert env["TRAINHUB_REPORT_URL"] == control.url + EVENTS
    assert env["TRAINHUB_REPORT_TOKEN"] == "rt-secret"
    assert {"TRAINHUB_NODE_TOKEN", "CELERY_BROKER_URL", "CELERY_RESULT_BACKEND"}.isdisjoint(env)
    assert not [k for k, v in env.items() if "thn-x" in v or "backend-secret" in v]
    assert seen["spec"] == SPEC and seen["spec_mode"] == "0o600"
    argv = seen["argv"]
    assert argv[argv.index("--cancel-file") + 1] == str(cfg.cancel_file("ftjob-1", 2))
    assert argv[argv.index("--workdir") + 1].startswith(str(cfg.workdir / "ftjob-1-a2"))
    assert not (cfg.workdir / "ftjob-1-a2").exists(), "the spec (signed URLs) is removed"
    assert control.to(EVENTS) == [], "the executor reported its own end"
    assert os.environ["TRAINHUB_NODE_TOKEN"] == "thn-x", "the node keeps its own environment"
    assert "TRAINHUB_REPORT_TOKEN" not in os.environ


def test_a_refused_claim_runs_nothing(
    control: ControlPlane, tmp_path: Path, executor: Path
) -> None:
    control.answer(CLAIM, (409, {"error": {"code": "attempt_not_claimable"}}))
    cfg = _node(control, tmp_path)

    assert supervisor.run(dict(MESSAGE), cfg) == "refused"

    assert not executor.exists()
    assert not (cfg.workdir / "ftjob-1-a2").exists()
    assert [r.path for r in control.requests] == [CLAIM]


def _tree(root: Path) -> dict[str, float]:
    return {str(p): p.stat().st_mtime for p in root.rglob("*")}


@pytest.mark.parametrize(
    "message",
    [
        {"job_id": "../../etc", "attempt": 1},
        {"job_id": "ftjob-1/../../../x", "attempt": 1},
        {"job_id": "ftjob-1", "attempt": "1/../../x"},
        {"job_id": "/etc/passwd", "attempt": 1},
        {"job_id": "ftjob-1", "attempt": 0},
        {"job_id": "ftjob-1", "attempt": True},
        {"job_id": "ftjob-" + "a" * 65, "attempt": 1},
        {"job_id": ["ftjob-1"], "attempt": 1},
        {},
        # The old message: a spec and a URL to claim at. The node follows no URL it is sent.
        {"spec": {"job_id": "ftjob-1", "attempt": 2}, "claim_url": "http://127.0.0.1:9/x"},
    ],
    ids=lambda m: json.dumps(m)[:40],
)
def test_a_message_that_names_no_attempt_is_refused_and_touches_nothing(
    control: ControlPlane, tmp_path: Path, executor: Path, message: dict
) -> None:
    control.answer(CLAIM, CLAIMED)
    cfg = _node(control, tmp_path)
    cfg.workdir.mkdir(parents=True)
    before = _tree(tmp_path)

    assert supervisor.run(message, cfg) == "refused"

    assert _tree(tmp_path) == before, "no file or folder created, in the workdir or outside it"
    assert control.requests == [], "not even claimed"
    assert not executor.exists()


@pytest.mark.parametrize(
    ("exit_code", "data"),
    [(139, {"status": "failed", "code": "worker_lost"}),
     (2, {"status": "failed", "code": "internal_error"})],
)  # fmt: skip
def test_an_executor_that_died_silently_is_reported_with_the_report_token(
    control: ControlPlane,
    tmp_path: Path,
    executor: Path,
    monkeypatch: pytest.MonkeyPatch,
    exit_code: int,
    data: dict,
) -> None:
    monkeypatch.setenv("FAKE_EXECUTOR_EXIT", str(exit_code))
    control.answer(CLAIM, CLAIMED)
    control.answer(HEARTBEAT, NO_CANCEL)
    control.answer(EVENTS, (200, {"stored": 1}))

    assert supervisor.run(dict(MESSAGE), _node(control, tmp_path)) == f"exit {exit_code}"

    [report] = control.to(EVENTS)
    assert report.headers["Authorization"] == "Bearer rt-secret", "not the node's token"
    [event] = report.body["events"]
    assert (event["type"], event["data"], event["seq"]) == (
        "status",
        data,
        supervisor.SUPERVISOR_SEQ,
    )


def test_a_cancel_pulled_while_the_executor_runs_stops_it_and_is_reported(
    control: ControlPlane, tmp_path: Path, executor: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_EXECUTOR_SLEEP", "60")  # ignores the cancel file: gets SIGTERM
    control.answer(CLAIM, CLAIMED)
    control.answer(HEARTBEAT, NO_CANCEL, CANCEL)
    control.answer(EVENTS, (200, {"stored": 1}))
    cfg = _node(control, tmp_path)
    started = time.monotonic()

    assert supervisor.run(dict(MESSAGE), cfg) == "exit -15"

    assert time.monotonic() - started < 10
    [report] = control.to(EVENTS)
    assert report.body["events"][0]["data"] == {"status": "cancelled"}
    assert not cfg.cancel_file("ftjob-1", 2).exists(), "cleaned up for a later attempt"


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
def test_a_silent_death_is_reported_as_its_cause(
    control: ControlPlane, code: int, signalled: bool, data: dict
) -> None:
    control.answer(EVENTS, (200, {"stored": 1}))
    supervisor._report_death(HttpSink(control.url + EVENTS, "rt-1"), "ftjob-1", 2, code, signalled)
    [report] = control.to(EVENTS)
    assert report.headers["Authorization"] == "Bearer rt-1"
    [event] = report.body["events"]
    assert event["data"] == data and event["seq"] == supervisor.SUPERVISOR_SEQ


def test_a_death_report_that_cannot_be_sent_is_logged_not_raised(
    control: ControlPlane, caplog: pytest.LogCaptureFixture
) -> None:
    control.answer(EVENTS, (503, {}))
    supervisor._report_death(HttpSink(control.url + EVENTS, "rt-1"), "ftjob-1", 2, 139, False)
    assert len(control.to(EVENTS)) == 1
    assert "could not report the executor's death" in caplog.text
