"""Preemption on the executor's side: the AWS spot interruption notice read from a fake IMDSv2
on loopback (token PUT with its TTL header, then reads with the token), quiet when there is no
metadata service, and a real run of the tiny model that gets the notice mid-training: it
uploads a checkpoint at once, ends ``preempted`` (exit 5), and a new run resumes from it."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from gpu_worker import checkpoints, errors, preemption
from gpu_worker.preemption import (
    INSTANCE_ACTION_PATH,
    TOKEN_HEADER,
    TOKEN_PATH,
    TOKEN_TTL_HEADER,
    ImdsClient,
    PreemptionWatcher,
    Unreachable,
    parse_instance_action,
    parse_rebalance,
)
from gpu_worker.report import MemorySink, Reporter
from gpu_worker.trainer import StopGuard
from tests.gpu_worker.conftest import spec_dict
from tests.support.fakes.imds import FakeImds, serve_imds
from trainhub_contract.outcomes import ExitCode, Outcome, StopMode
from trainhub_contract.spec import SpecError, parse_job_spec

NOTICE = {"action": "terminate", "time": "2026-11-25T17:02:00Z"}


@pytest.fixture
def imds() -> Iterator[FakeImds]:
    with serve_imds() as fake:
        yield fake


@pytest.fixture
def nothing_there() -> str:
    """A loopback URL where nothing listens (connections are refused at once)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def _reporter() -> tuple[Reporter, MemorySink]:
    sink = MemorySink()
    return Reporter(job_id="ftjob-test", attempt=1, sinks=[sink]), sink


def _wait(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


# --- what the service says ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "action", "when"),
    [
        (json.dumps(NOTICE), "terminate", "2026-11-25T17:02:00Z"),
        (b'{"action": "stop", "time": "2026-11-25T17:02:00Z"}', "stop", "2026-11-25T17:02:00Z"),
        (b'{"action": "hibernate"}', "hibernate", ""),
        (b'{"action": "terminate", "time": "soon"}', "terminate", "soon"),
        (b"", None, None),
        (b"not json", None, None),
        (b'["terminate"]', None, None),
        (b'{"time": "2026-11-25T17:02:00Z"}', None, None),
        (b"\xff\xfe", None, None),
    ],
)
def test_the_instance_action_is_read_from_its_json(
    body: str | bytes, action: str | None, when: str | None
) -> None:
    notice = parse_instance_action(body.encode() if isinstance(body, str) else body)
    if action is None:
        assert notice is None
        return
    assert notice is not None and (notice.action, notice.time) == (action, when)
    if when == NOTICE["time"]:
        from datetime import UTC, datetime

        assert notice.at == datetime(2026, 11, 25, 17, 2, tzinfo=UTC)
        assert notice.seconds_left(datetime(2026, 11, 25, 17, 0, tzinfo=UTC)) == 120
        assert f"{action} this spot machine at 2026-11-25T17:02:00Z" in notice.describe()
    else:
        assert notice.at is None and notice.seconds_left() is None


def test_the_rebalance_recommendation_is_read_from_its_json() -> None:
    assert parse_rebalance(b'{"noticeTime": "2026-11-25T16:50:00Z"}') == "2026-11-25T16:50:00Z"
    assert parse_rebalance(b"{}") == ""
    assert parse_rebalance(b"garbage") is None


# --- the client -----------------------------------------------------------------------------


def test_the_client_takes_a_token_then_reads_404_until_a_notice(
    imds: FakeImds, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A proxy in the environment must not see link-local traffic.
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")
    client = ImdsClient(imds.url)

    assert client.instance_action() is None
    assert client.rebalance() is None
    imds.notice = NOTICE
    notice = client.instance_action()
    assert notice is not None and (notice.action, notice.time) == ("terminate", NOTICE["time"])

    puts = imds.of(TOKEN_PATH)
    assert len(puts) == 1, "one token for every read while it is valid"
    assert puts[0][0] == "PUT" and puts[0][2][TOKEN_TTL_HEADER.lower()] == "21600"
    reads = [r for r in imds.requests if r[1] != TOKEN_PATH]
    assert {r[2].get(TOKEN_HEADER.lower()) for r in reads} == {"token-0"}


def test_a_token_the_service_no_longer_knows_is_replaced_once(imds: FakeImds) -> None:
    client = ImdsClient(imds.url)
    assert client.instance_action() is None
    imds.tokens.clear()  # expired, or the service restarted
    imds.notice = NOTICE
    assert client.instance_action() is not None
    assert len(imds.of(TOKEN_PATH)) == 2


def test_no_metadata_service_is_unreachable_within_the_timeout(nothing_there: str) -> None:
    client = ImdsClient(nothing_there, timeout=0.5)
    started = time.monotonic()
    with pytest.raises(Unreachable):
        client.instance_action()
    assert time.monotonic() - started < 2
    with pytest.raises(ValueError, match="http://"):
        ImdsClient("file:///etc/passwd")


# --- the watcher ----------------------------------------------------------------------------


def test_the_watcher_turns_a_notice_into_a_preemption_stop(imds: FakeImds) -> None:
    reporter, sink = _reporter()
    watcher = PreemptionWatcher(ImdsClient(imds.url), reporter, interval=0.02)
    with reporter, watcher:
        _wait(lambda: watcher.available is True)
        assert watcher() is None
        imds.notice = NOTICE
        _wait(lambda: watcher() is StopMode.PREEMPT)
        checks = len(imds.of(INSTANCE_ACTION_PATH))
        time.sleep(0.1)
        assert len(imds.of(INSTANCE_ACTION_PATH)) == checks, "nothing more to learn: it stops"
    logs = [e for e in sink.events if e["type"] == "log"]
    assert [e["level"] for e in logs] == ["info", "warning"]
    assert logs[0]["message"].startswith("Watching for AWS spot interruption notices")
    warning = logs[1]
    assert warning["message"].startswith(
        "Spot interruption notice: AWS will terminate this spot machine at 2026-11-25T17:02:00Z"
    )
    data = warning["data"]
    assert (data["notice"], data["provider"], data["action"], data["time"]) == (
        "spot_interruption",
        "aws",
        "terminate",
        "2026-11-25T17:02:00Z",
    )
    assert data["seconds_left"] is not None and data["seconds_left"] >= 0


def test_a_rebalance_recommendation_asks_for_one_checkpoint_and_trains_on(imds: FakeImds) -> None:
    reporter, sink = _reporter()
    watcher = PreemptionWatcher(ImdsClient(imds.url), reporter, interval=0.02)
    with reporter, watcher:
        imds.rebalance = {"noticeTime": "2026-11-25T16:50:00Z"}
        _wait(lambda: watcher.rebalance is not None)
        time.sleep(0.1)
    assert watcher() is None, "a recommendation is no stop"
    assert watcher.checkpoint_asked() is True
    assert watcher.checkpoint_asked() is False, "once per recommendation"
    warnings = [e for e in sink.events if e["level"] == "warning"]
    assert len(warnings) == 1 and warnings[0]["data"]["notice"] == "rebalance_recommendation"

    ckpt = checkpoints.Checkpointer(
        url="file:///nowhere",
        scratch=Path("/nonexistent"),
        reporter=reporter,
        every_steps=100,
        every_seconds=None,
        start_step=3,
        asked=iter([True, False]).__next__,
    )
    assert ckpt.due(3, 10) is False, "nothing new since the last checkpoint: not consumed"
    assert ckpt.due(4, 10) is True
    assert ckpt.due(5, 10) is False


def test_no_metadata_service_means_no_watcher_and_one_quiet_line(nothing_there: str) -> None:
    reporter, sink = _reporter()
    watcher = PreemptionWatcher(ImdsClient(nothing_there, timeout=0.2), reporter, interval=0.01)
    with reporter, watcher:
        _wait(lambda: watcher.available is False)
        assert watcher() is None
    assert [(e["type"], e["level"]) for e in sink.events if e["type"] != "heartbeat"] == [
        ("log", "info")
    ]
    assert "spot interruption notices are not watched" in sink.events[-1]["message"]


def test_a_service_silent_at_first_is_still_watched_once_it_answers(nothing_there: str) -> None:
    """A spot machine busy loading its model may leave the metadata service's first answers
    past the timeout: the watcher says it is not watching, checks on seldom, and a notice that
    comes once the service answers still stops training."""
    reporter, sink = _reporter()
    watcher = PreemptionWatcher(ImdsClient(nothing_there, timeout=0.2), reporter, interval=0.01,
                                quiet_interval=0.05)  # fmt: skip
    with reporter, watcher:
        _wait(lambda: watcher.available is False)
        with serve_imds(port=urlsplit(nothing_there).port or 0) as late:  # it answers now
            late.notice = NOTICE
            _wait(lambda: watcher() is StopMode.PREEMPT)
    assert watcher.available is True
    logs = [e["message"] for e in sink.events if e["type"] == "log"]
    assert "not watched on this machine unless it answers later" in logs[0]
    assert logs[-1].startswith("Spot interruption notice: AWS will terminate this spot machine")


def test_the_spec_or_the_environment_turns_the_watcher_on(
    tiny_spec: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    reporter, _ = _reporter()
    monkeypatch.delenv(preemption.ENV_NOTICE, raising=False)
    plain = parse_job_spec(tiny_spec)
    assert plain.preemption_notice is None and "preemption_notice" not in plain.to_dict()
    assert preemption.watcher_for(plain, reporter) is None

    spot = parse_job_spec({**tiny_spec, "preemption_notice": "aws"})
    assert spot.to_dict()["preemption_notice"] == "aws"
    assert parse_job_spec(spot.to_dict()) == spot
    watcher = preemption.watcher_for(spot, reporter, base_url="http://127.0.0.1:1")
    assert watcher is not None and watcher.client.base_url == "http://127.0.0.1:1"
    assert parse_job_spec({**tiny_spec, "preemption_notice": None}).preemption_notice is None

    with pytest.raises(SpecError) as refused:
        parse_job_spec({**tiny_spec, "preemption_notice": "gcp"})
    assert refused.value.param == "preemption_notice"
    assert '"aws"' in refused.value.message

    monkeypatch.setenv(preemption.ENV_NOTICE, "aws")
    monkeypatch.setenv(preemption.ENV_IMDS_URL, "http://127.0.0.1:2")
    watcher = preemption.watcher_for(plain, reporter)
    assert watcher is not None and watcher.client.base_url == "http://127.0.0.1:2"
    assert watcher.interval == preemption.POLL_SECONDS
    for text, interval in [("0.2", 0.2), ("abc", 5.0), ("0", 5.0), ("600", 5.0)]:
        monkeypatch.setenv(preemption.ENV_POLL_SECONDS, text)
        watcher = preemption.watcher_for(plain, reporter)
        assert watcher is not None and watcher.interval == interval, text
    monkeypatch.setenv(preemption.ENV_NOTICE, "azure")
    assert preemption.watcher_for(plain, reporter) is None


@pytest.fixture
def tiny_spec(tmp_path: Path) -> dict[str, Any]:
    data = tmp_path / "d.jsonl"
    data.write_text("{}\n")
    return spec_dict("/models/tiny", (data, "0" * 64), tmp_path / "out")


def test_preempted_is_a_retried_end_reason_with_its_own_exit_code(tmp_path: Path) -> None:
    from jobs.states import EndReason

    assert EndReason(errors.PREEMPTED).retryable
    assert errors.exit_code(Outcome.FAILED, errors.PREEMPTED) == ExitCode.PREEMPTED == 5
    assert ExitCode.PREEMPTED in ExitCode.reported()
    StopMode.PREEMPT.write_file(tmp_path / "cancel")
    assert StopMode.of_file(tmp_path / "cancel") is StopMode.PREEMPT

    guard = StopGuard(lambda: StopMode.PREEMPT, 3600)
    assert (guard.check(), guard.saves_checkpoint, guard.pausing) == ("preempted", True, False)
    with pytest.raises(errors.Preempted, match="Preempted during training after step 7"):
        guard.raise_if_stopped("during training", step=7)


# --- a real run -----------------------------------------------------------------------------


class NoticeAt:
    """A TrainerCallback that puts the notice up once step ``at`` ended, then waits until the
    watcher reported it, so the run stops at the next step boundary: step ``at + 1``."""

    def __init__(self, imds: FakeImds, sink: MemorySink, at: int) -> None:
        self.imds, self.sink, self.at = imds, sink, at
        self.steps: list[int] = []

    def __getattr__(self, name: str) -> Any:
        if name.startswith("on_"):
            return lambda *a, **k: None
        raise AttributeError(name)

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self.steps.append(state.global_step)
        if state.global_step == self.at:
            self.imds.notice = NOTICE
            _wait(lambda: any(e["data"].get("notice") for e in self.sink.events))


def _run(spec: dict[str, Any], workdir: Path, **kwargs: Any) -> tuple[Any, list[dict[str, Any]]]:
    from gpu_worker import train

    parsed = parse_job_spec(spec)
    sink = kwargs.pop("sink", None) or MemorySink()
    workdir.mkdir()
    with Reporter(job_id=parsed.job_id, attempt=parsed.attempt, sinks=[sink]) as reporter:
        result = train.run(parsed, reporter=reporter, workdir=workdir, **kwargs)
    return result, sink.events


def test_a_notice_mid_training_uploads_a_checkpoint_at_once_and_the_next_attempt_resumes_there(
    tiny_model_dir: Path, dataset_files: dict[str, Any], imds: FakeImds, tmp_path: Path
) -> None:
    data = dataset_files["messages"]
    sink = MemorySink()
    watch = NoticeAt(imds, sink, at=3)
    spec = {
        **spec_dict(tiny_model_dir, data, tmp_path / "a", n_epochs=2),
        "preemption_notice": "aws",
    }

    result, events = _run(
        spec,
        tmp_path / "w1",
        sink=sink,
        callbacks=[watch],
        imds_url=imds.url,
        preemption_poll_seconds=0.05,
        checkpoint_every_steps=1000,  # no periodic checkpoint: the one saved is the notice's
    )

    assert (result.status, result.reason, result.exit_code) == (
        Outcome.FAILED,
        "preempted",
        ExitCode.PREEMPTED,
    )
    stopped = watch.steps[-1]
    assert stopped == 4, watch.steps
    assert result.message == (
        "Preempted during training after step 4: AWS will terminate this spot machine at "
        "2026-11-25T17:02:00Z. The job is retried from its newest checkpoint."
    )
    kinds = [(e["type"], e["data"].get("notice") or e["data"].get("status")) for e in events]
    notice_at = kinds.index(("log", "spot_interruption"))
    checkpoint_at = next(i for i, e in enumerate(events) if e["type"] == "checkpoint")
    assert notice_at < checkpoint_at < len(events) - 1
    assert [e["data"]["step"] for e in events if e["type"] == "checkpoint"] == [stopped]
    final = events[-1]
    assert (final["type"], final["data"]) == ("status", {"status": "failed", "code": "preempted"})
    assert final["message"] == result.message
    out = tmp_path / "a"
    assert checkpoints.unpack(out / "checkpoint.tar", tmp_path / "ckpt") == stopped
    assert not (out / "adapter.tar").exists()

    # The next attempt (not on a spot machine) resumes at the preempted step.
    again = spec_dict(
        tiny_model_dir, data, tmp_path / "b", attempt=2, resume=out / "checkpoint.tar", n_epochs=2
    )
    second, _ = _run(again, tmp_path / "w2")
    assert second.status == Outcome.SUCCEEDED, second.message
    assert second.metrics["resumed_from_step"] == stopped
    assert (tmp_path / "b" / "adapter.tar").exists()


def test_the_cli_watches_when_its_launcher_says_so_and_exits_5(
    tiny_model_dir: Path, dataset_files: dict[str, Any], imds: FakeImds, tmp_path: Path
) -> None:
    """``python -m gpu_worker run`` on a machine whose notice is already up (the launcher set
    TRAINHUB_PREEMPTION_NOTICE, the spec says nothing): it stops before training, with nothing
    to checkpoint, and exits 5 with the reason in its summary line."""
    import os
    import subprocess
    import sys

    imds.notice = NOTICE
    events = tmp_path / "events.jsonl"
    spec = spec_dict(tiny_model_dir, dataset_files["messages"], tmp_path / "out")
    spec["report"] = {"sinks": [{"type": "jsonl", "path": str(events)}]}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINHUB_")}
    env.update(
        PYTHONPATH=str(Path(__file__).resolve().parents[2]),
        OMP_NUM_THREADS="1",
        TRAINHUB_PREEMPTION_NOTICE="aws",
        TRAINHUB_IMDS_URL=imds.url,
    )
    proc = subprocess.run(
        [sys.executable, "-m", "gpu_worker", "run", str(tmp_path / "spec.json")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )

    assert proc.returncode == ExitCode.PREEMPTED, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["status"] == "failed" and summary["reason"] == "preempted"
    assert summary["message"].startswith("Preempted while "), summary
    lines = [json.loads(line) for line in events.read_text().splitlines()]
    assert any(e["data"].get("notice") == "spot_interruption" for e in lines)
    assert lines[-1]["data"] == {"status": "failed", "code": "preempted"}
    assert not (tmp_path / "out" / "checkpoint.tar").exists(), "no training step to save"
