"""The executor's reporter: numbering, throttling, batching, per-sink retry, and the three sinks
against what they talk to (a real HTTP server on loopback for the node's http sink, a real file,
the RunPod SDK's own function)."""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import requests

from gpu_worker.report import (
    BATCH_SIZE,
    HttpSink,
    JsonlSink,
    MemorySink,
    Reporter,
    RunpodSink,
)
from gpu_worker.sinks import HTTP_BATCH
from tests.gpu_worker._control import ControlPlane, control_fixture  # noqa: F401 - ``control``
from trainhub_contract.outcomes import Outcome
from trainhub_contract.spec import parse_job_spec

EVENTS = "/api/v1/nodes/node-a/attempts/ftjob-test/2/events/"
EVENT_KEYS = {"seq", "type", "level", "message", "data", "ts"}


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class FlakySink(MemorySink):
    """Raises on its first ``failures`` sends, then delivers."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures
        self.attempts: list[list[dict[str, Any]]] = []

    def send(self, job_id: str, attempt: int, events: list[dict[str, Any]]) -> None:
        self.attempts.append(list(events))
        if self.failures > 0:
            self.failures -= 1
            raise ConnectionError("sink down")
        super().send(job_id, attempt, events)


class HangingSink:
    def __init__(self) -> None:
        self.release = threading.Event()

    def send(self, job_id: str, attempt: int, events: list[dict[str, Any]]) -> None:
        self.release.wait(60)


def make_reporter(*sinks: Any, **kwargs: Any) -> Reporter:
    kwargs.setdefault("close_timeout", 2.0)
    return Reporter(job_id="ftjob-test", attempt=2, sinks=list(sinks), **kwargs)


def spec_with(report: dict[str, Any]) -> Any:
    return parse_job_spec(
        {
            "version": 1,
            "job_id": "ftjob-rep",
            "attempt": 3,
            "model": "acme/tiny",
            "dataset": {"url": "file:///d.jsonl", "sha256": "0" * 64, "format": "messages"},
            "outputs": {"artifact_url": "file:///a.tar", "checkpoint_url": "file:///c.tar"},
            "report": report,
        }
    )


# --- numbering and batching -----------------------------------------------------------------


def test_every_event_has_a_monotonic_seq_and_the_documented_shape() -> None:
    sink = MemorySink()
    rep = make_reporter(sink, metrics_interval=0)
    rep.status(Outcome.RUNNING, "Training started.")
    rep.log("loading model", level="debug", path="/m")
    rep.metrics(step=1, total_steps=10, loss=2.5)
    rep.checkpoint(5, url_kind="slot")
    rep.artifact({"files": [{"name": "a", "size": 1}]}, "f" * 64, 1234)
    rep.error("oom", "Out of memory at batch size 8.", batch_size=8)
    rep.close()

    assert [e["seq"] for e in sink.events] == list(range(6))
    assert all(set(e) == EVENT_KEYS for e in sink.events)
    assert [e["type"] for e in sink.events] == [
        "status", "log", "metrics", "checkpoint", "artifact", "error",
    ]  # fmt: skip
    assert sink.events[0]["data"] == {"status": "running"}
    assert sink.events[1]["level"] == "debug" and sink.events[1]["data"] == {"path": "/m"}
    assert sink.events[2]["data"] == {"step": 1, "total_steps": 10, "loss": 2.5}
    assert sink.events[2]["message"] == "step 1/10 loss=2.5"
    assert sink.events[3]["data"] == {"step": 5, "url_kind": "slot"}
    assert sink.events[4]["data"]["sha256"] == "f" * 64 and sink.events[4]["data"]["size"] == 1234
    assert sink.events[5]["data"] == {"code": "oom", "batch_size": 8}
    assert sink.events[5]["level"] == "error"
    assert all(isinstance(e["ts"], float) and e["ts"] > 1.7e9 for e in sink.events)
    assert {c[:2] for c in sink.calls} == {("ftjob-test", 2)}


def test_a_resent_batch_is_identical_to_the_failed_one() -> None:
    sink = FlakySink(failures=1)
    rep = make_reporter(sink)
    rep.log("one")
    rep.log("two")
    rep.flush()  # fails
    rep.flush()  # re-sends
    assert sink.attempts[0] == sink.attempts[1]
    assert [e["seq"] for e in sink.events] == [0, 1]
    rep.close()


def test_status_is_sent_at_once_logs_wait_for_a_batch_or_a_flush() -> None:
    sink = MemorySink()
    rep = make_reporter(sink)
    rep.log("a")
    rep.log("b")
    assert sink.events == []
    rep.status(Outcome.RUNNING)
    assert [e["message"] for e in sink.events] == ["a", "b", ""]

    for i in range(BATCH_SIZE - 1):
        rep.log(f"line {i}")
    assert len(sink.events) == 3
    rep.log("the 50th")
    assert len(sink.events) == 3 + BATCH_SIZE
    rep.log("tail")
    rep.close()
    assert sink.events[-1]["message"] == "tail"
    assert [e["seq"] for e in sink.events] == list(range(len(sink.events)))


def test_logs_from_many_threads_are_each_delivered_once_in_seq_order() -> None:
    sink = MemorySink()
    rep = make_reporter(sink, metrics_interval=0)

    def work(n: int) -> None:
        for i in range(200):
            rep.log(f"t{n}-{i}")
            if i % 20 == 0:
                rep.metrics(step=i, thread=n)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rep.close()
    seqs = [e["seq"] for e in sink.events]
    assert seqs == list(range(len(seqs)))
    assert len([e for e in sink.events if e["type"] == "log"]) == 800


def test_unknown_log_level_is_refused_and_aliases_are_mapped() -> None:
    sink = MemorySink()
    rep = make_reporter(sink)
    rep.log("w", level="WARN")
    with pytest.raises(ValueError, match="trace"):
        rep.log("x", level="trace")
    rep.close()
    assert [e["level"] for e in sink.events] == ["warning"]


def test_values_are_made_json_safe() -> None:
    class Scalar:  # stands in for a numpy / torch scalar
        def item(self) -> float:
            return 0.5

    sink = MemorySink()
    rep = make_reporter(sink, metrics_interval=0)
    rep.metrics(step=1, loss=float("nan"), grad_norm=float("inf"), lr=Scalar(), path=Path("/x"))
    rep.close()
    data = sink.events[0]["data"]
    assert data == {"step": 1, "loss": None, "grad_norm": None, "lr": 0.5, "path": "/x"}
    json.dumps(sink.events, allow_nan=False)


# --- metrics throttling ---------------------------------------------------------------------


def test_metrics_are_throttled_and_merged_with_latest_values_winning() -> None:
    clock = FakeClock()
    sink = MemorySink()
    rep = make_reporter(sink, metrics_interval=1.0, clock=clock)

    rep.metrics(step=1, loss=3.0)  # first one goes out
    clock.now += 0.3
    rep.metrics(step=2, loss=2.9)
    clock.now += 0.3
    rep.metrics(step=3, loss=2.8, eval_loss=3.1)
    clock.now += 0.3
    rep.metrics(step=4, loss=2.7)
    rep.log("between")
    clock.now += 0.2  # 1.1 s after the first: the next call emits, merged
    rep.metrics(step=5, loss=2.6)
    clock.now += 0.1
    rep.metrics(step=6, loss=2.5)  # pending until the flush
    rep.flush()

    metrics = [e for e in sink.events if e["type"] == "metrics"]
    assert [m["data"] for m in metrics] == [
        {"step": 1, "loss": 3.0},
        {"step": 5, "loss": 2.6, "eval_loss": 3.1},
        {"step": 6, "loss": 2.5},
    ]
    assert [e["seq"] for e in sink.events] == list(range(len(sink.events)))
    rep.close()


def test_batch_sends_do_not_break_the_metrics_throttle() -> None:
    clock = FakeClock()
    sink = MemorySink()
    rep = make_reporter(sink, clock=clock)
    rep.metrics(step=1)
    for i in range(3 * BATCH_SIZE):  # three batch sends within the same second
        rep.metrics(step=i + 2)
        rep.log(f"line {i}")
    assert len(sink.events) == 3 * BATCH_SIZE
    assert [e["data"] for e in sink.events if e["type"] == "metrics"] == [{"step": 1}]
    clock.now += 1.0
    rep.close()
    assert [e["data"] for e in sink.events if e["type"] == "metrics"][-1] == {
        "step": 3 * BATCH_SIZE + 1
    }


def test_pending_metrics_are_delivered_by_close() -> None:
    clock = FakeClock()
    sink = MemorySink()
    rep = make_reporter(sink, clock=clock)
    rep.metrics(step=1)
    rep.metrics(step=2)  # throttled
    rep.close()
    assert [e["data"]["step"] for e in sink.events] == [1, 2]


# --- background thread ----------------------------------------------------------------------


def wait_for(predicate: Any, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return False


def test_heartbeat_thread_emits_and_flushes_until_closed() -> None:
    sink = MemorySink()
    rep = make_reporter(sink, heartbeat_interval=0.05)
    with rep:
        rep.log("before the first beat")
        assert wait_for(lambda: sum(e["type"] == "heartbeat" for e in sink.events) >= 3)
    beats = [e for e in sink.events if e["type"] == "heartbeat"]
    assert sink.events[0]["message"] == "before the first beat"  # flushed with the beat
    assert all(b["level"] == "debug" for b in beats)
    count = len(sink.events)
    time.sleep(0.2)
    assert len(sink.events) == count  # stopped on close
    assert rep._thread is not None and not rep._thread.is_alive()


def test_periodic_flush_sends_pending_logs_between_heartbeats() -> None:
    sink = MemorySink()
    with make_reporter(sink, heartbeat_interval=60, flush_interval=0.05) as rep:
        rep.log("soon")
        assert wait_for(lambda: len(sink.events) == 1)
    assert [e["type"] for e in sink.events] == ["log"]


# --- per-sink retry -------------------------------------------------------------------------


def test_a_failing_sink_gets_every_event_once_in_order_and_does_not_block_the_other() -> None:
    flaky, healthy = FlakySink(failures=2), MemorySink()
    rep = make_reporter(flaky, healthy)
    rep.log("a")
    rep.flush()  # flaky fails (1)
    assert [e["message"] for e in healthy.events] == ["a"]
    rep.log("b")
    rep.status(Outcome.RUNNING)  # flaky fails (2); healthy gets it at once
    assert [e["message"] for e in healthy.events] == ["a", "b", ""]
    assert flaky.events == []
    rep.log("c")
    rep.flush()  # flaky succeeds with its whole backlog
    rep.close()
    assert [e["seq"] for e in flaky.events] == [0, 1, 2, 3]
    assert flaky.events == healthy.events
    assert len(flaky.attempts) == 3


def test_a_failing_sink_is_not_retried_by_batch_sends_during_its_backoff() -> None:
    clock = FakeClock()
    flaky, healthy = FlakySink(failures=1), MemorySink()
    rep = make_reporter(flaky, healthy, clock=clock)
    rep.flush()
    rep.log("x")
    rep.flush()  # fails: backoff 1 s
    for i in range(BATCH_SIZE):
        rep.log(f"batch {i}")  # the full batch goes to healthy only
    assert len(flaky.attempts) == 1
    assert len(healthy.events) == 1 + BATCH_SIZE
    clock.now += 1.5
    rep.flush()
    assert [e["seq"] for e in flaky.events] == list(range(1 + BATCH_SIZE))
    rep.close()


def test_close_gives_up_on_a_hanging_sink_within_its_timeout(caplog: Any) -> None:
    hanging, healthy = HangingSink(), MemorySink()
    rep = make_reporter(healthy, hanging, close_timeout=0.5)
    rep.log("x")
    caplog.set_level(logging.WARNING, logger="gpu_worker.report")
    started = time.monotonic()
    rep.close()
    assert time.monotonic() - started < 2.0
    assert [e["message"] for e in healthy.events] == ["x"]
    assert "gave up delivering events" in caplog.text
    hanging.release.set()


def test_close_retries_a_briefly_failing_sink_before_giving_up() -> None:
    flaky = FlakySink(failures=2)
    rep = make_reporter(flaky, close_timeout=3.0)
    rep.status(Outcome.SUCCEEDED, sha256="0" * 64)  # fails (1)
    rep.close()  # fails (2), then delivers
    assert [e["type"] for e in flaky.events] == ["status"]


# --- sinks ----------------------------------------------------------------------------------


def test_jsonl_sink_appends_parseable_lines_with_seq_and_attempt(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "events.jsonl"
    rep = make_reporter(JsonlSink(path), metrics_interval=0)
    rep.status(Outcome.RUNNING)
    rep.metrics(step=1, loss=1.5)
    rep.log("hello\nworld")
    rep.close()
    path.write_bytes(path.read_bytes() + b'{"seq": 99, "torn')  # a crash mid-line
    rep2 = make_reporter(JsonlSink(path))
    rep2.log("after the crash")
    rep2.close()

    lines = path.read_text().splitlines()
    assert len(lines) == 5
    parsed = [json.loads(line) for line in lines[:3] + lines[4:]]
    assert [p["seq"] for p in parsed] == [0, 1, 2, 0]
    assert all(p["job_id"] == "ftjob-test" and p["attempt"] == 2 for p in parsed)
    assert parsed[2]["message"] == "hello\nworld"
    assert parsed[3]["message"] == "after the crash"


def test_runpod_sink_sends_a_rolling_window(monkeypatch: pytest.MonkeyPatch) -> None:
    import runpod.serverless

    updates: list[tuple[dict[str, Any], dict[str, Any]]] = []
    monkeypatch.setattr(
        runpod.serverless, "progress_update", lambda job, p: updates.append((job, p))
    )
    sink = RunpodSink({"id": "rp-1", "input": {}}, window=5)
    rep = make_reporter(sink)
    for i in range(3):
        rep.log(f"l{i}")
    rep.flush()
    for i in range(4):
        rep.log(f"m{i}")
    rep.close()
    assert updates[0][0]["id"] == "rp-1"
    assert [e["seq"] for e in updates[0][1]["events"]] == [0, 1, 2]
    assert [e["seq"] for e in updates[-1][1]["events"]] == [2, 3, 4, 5, 6]
    assert updates[-1][1]["attempt"] == 2
    assert [e["seq"] for e in sink.window()] == [2, 3, 4, 5, 6]


# --- the http sink (GPU nodes) ----------------------------------------------------------------


def test_http_sink_posts_each_batch_with_the_report_token(control: ControlPlane) -> None:
    control.answer(EVENTS, (200, {"stored": 1}))
    sink = HttpSink(control.url + EVENTS, "rt-secret")
    rep = make_reporter(sink, metrics_interval=0)
    rep.status(Outcome.RUNNING, "Training started.")
    rep.metrics(step=1, loss=2.0)
    rep.close()

    first, second = control.to(EVENTS)
    assert first.headers["Authorization"] == "Bearer rt-secret"
    assert first.headers["Content-Type"] == "application/json"
    assert set(first.body) == {"events"}
    assert [(e["seq"], e["type"]) for e in first.body["events"]] == [(0, "status")]
    assert [e["seq"] for e in second.body["events"]] == [1]  # close sent the metrics event
    assert second.body["events"][0]["data"] == {"step": 1, "loss": 2.0}
    assert "rt-secret" not in repr(sink)


def test_http_sink_sends_a_backlog_in_parts_the_control_plane_stores_whole(
    control: ControlPlane,
) -> None:
    control.answer(EVENTS, (200, {"stored": 1}))
    events = [{"seq": i, "type": "log", "message": f"l{i}"} for i in range(2 * HTTP_BATCH + 1)]

    HttpSink(control.url + EVENTS, "rt").send("ftjob-test", 2, events)

    sizes = [len(r.body["events"]) for r in control.to(EVENTS)]
    assert sizes == [HTTP_BATCH, HTTP_BATCH, 1]
    assert [e["seq"] for r in control.to(EVENTS) for e in r.body["events"]] == list(
        range(2 * HTTP_BATCH + 1)
    )


def test_http_sink_takes_its_url_and_token_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, control: ControlPlane
) -> None:
    monkeypatch.delenv("TRAINHUB_REPORT_URL", raising=False)
    monkeypatch.delenv("TRAINHUB_REPORT_TOKEN", raising=False)
    with pytest.raises(ValueError, match="TRAINHUB_REPORT_URL and TRAINHUB_REPORT_TOKEN"):
        HttpSink()
    monkeypatch.setenv("TRAINHUB_REPORT_URL", control.url + EVENTS)
    with pytest.raises(ValueError, match="TRAINHUB_REPORT_TOKEN"):
        HttpSink()
    monkeypatch.setenv("TRAINHUB_REPORT_TOKEN", "rt-from-env")
    control.answer(EVENTS, (200, {"stored": 1}))

    HttpSink().send("ftjob-test", 2, [{"seq": 0, "type": "log"}])

    [request] = control.to(EVENTS)
    assert request.headers["Authorization"] == "Bearer rt-from-env"


@pytest.mark.parametrize("status", [403, 500, 503])
def test_a_refused_or_failed_post_raises_and_the_batch_is_sent_again(
    control: ControlPlane, status: int
) -> None:
    control.answer(EVENTS, (status, {}))
    with pytest.raises(requests.HTTPError, match=str(status)):
        HttpSink(control.url + EVENTS, "rt").send("ftjob-test", 2, [{"seq": 9}])
    control.requests.clear()
    control.answer(EVENTS, (status, {}), (200, {"stored": 1}))
    rep = make_reporter(HttpSink(control.url + EVENTS, "rt"), close_timeout=5)

    rep.status(Outcome.RUNNING)  # sent at once: refused

    assert [e["seq"] for e in rep._channels[0].backlog] == [0], "kept for the next send"
    rep.close()  # retries within its timeout: the second answer is a 200
    assert len(rep._channels[0].backlog) == 0
    first, second = control.to(EVENTS)
    assert first.body == second.body, "the same batch again"


def test_a_dead_control_plane_raises_fast_and_the_events_stay_queued() -> None:
    dead = HttpSink("http://127.0.0.1:1/api/v1/nodes/n/attempts/ftjob-test/2/events/", "rt")
    started = time.monotonic()
    with pytest.raises(requests.ConnectionError):
        dead.send("ftjob-test", 2, [{"seq": 0}])
    assert time.monotonic() - started < 5

    healthy = MemorySink()
    rep = make_reporter(dead, healthy, close_timeout=0.5)
    rep.status(Outcome.RUNNING)
    rep.log("x")
    started = time.monotonic()
    rep.flush()
    assert time.monotonic() - started < 5
    assert len(rep._channels[0].backlog) == 2  # kept for the next flush
    assert [e["seq"] for e in healthy.events] == [0, 1]
    rep.close()


# --- the control plane's contract -----------------------------------------------------------


def test_every_event_kind_is_accepted_by_the_control_plane() -> None:
    from jobs.services.core.events import clean_executor_event

    sink = MemorySink()
    rep = make_reporter(sink, metrics_interval=0)
    rep.status(Outcome.RUNNING, "Training started.")
    rep.status(Outcome.SUCCEEDED, "done", sha256="0" * 64)
    rep.log("text", level="warning", extra={"nested": [1, 2]})
    rep.metrics(step=1, total_steps=2, epoch=0.5, loss=1.0, lr=1e-4, tokens_per_second=10.0)
    rep.checkpoint(1)
    rep.artifact({"files": []}, "0" * 64, 10)
    rep.error("invalid_dataset", "line 3 is not JSON", line=3)
    rep.heartbeat()
    rep.close()

    assert {e["type"] for e in sink.events} == {
        "status", "log", "metrics", "checkpoint", "artifact", "error", "heartbeat",
    }  # fmt: skip
    for event in json.loads(json.dumps(sink.events)):  # as the control plane receives them
        cleaned = clean_executor_event(event)
        assert cleaned is not None, event
        assert {k: event[k] for k in cleaned} == cleaned


# --- from_spec ------------------------------------------------------------------------------


def test_from_spec_builds_the_configured_sinks(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("TRAINHUB_REPORT_URL", "http://control.test/events/")
    monkeypatch.setenv("TRAINHUB_REPORT_TOKEN", "rt")
    rep = Reporter.from_spec(
        spec_with(
            {
                "sinks": [{"type": "http"}, {"type": "jsonl", "path": str(tmp_path / "e.jsonl")}],
                "heartbeat_seconds": 10,
                "metrics_interval_seconds": 0.5,
            }
        )
    )
    assert [type(s) for s in rep.sinks] == [HttpSink, JsonlSink]
    assert isinstance(rep.sinks[0], HttpSink) and rep.sinks[0].url == "http://control.test/events/"
    assert (rep.job_id, rep.attempt) == ("ftjob-rep", 3)
    assert (rep.heartbeat_interval, rep.metrics_interval) == (10.0, 0.5)


def test_from_spec_defaults(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    rep = Reporter.from_spec(spec_with({}))
    assert len(rep.sinks) == 1 and isinstance(rep.sinks[0], JsonlSink)
    assert rep.sinks[0].path == Path("events.jsonl")
    assert (rep.heartbeat_interval, rep.metrics_interval) == (30.0, 1.0)

    job = {"id": "rp", "input": {}}
    only_runpod = Reporter.from_spec(spec_with({}), runpod_job=job)
    assert [type(s) for s in only_runpod.sinks] == [RunpodSink]
    forced = Reporter.from_spec(
        spec_with({"sinks": [{"type": "jsonl", "path": "x.jsonl"}]}), runpod_job=job
    )
    assert [type(s) for s in forced.sinks] == [JsonlSink, RunpodSink]


@pytest.mark.parametrize(
    ("report", "match"),
    [
        ({"sinks": [{"type": "kafka"}]}, "'kafka' is not a known sink type"),
        # Where to report, and with what, comes from the environment: the spec is not secret.
        ({"sinks": [{"type": "http", "url": "http://evil/"}]}, "takes no settings"),
        ({"sinks": [{"type": "http", "token": "rt"}]}, "TRAINHUB_REPORT_TOKEN"),
        ({"sinks": [{"type": "celery"}]}, "'celery' is not a known sink type"),
        ({"sinks": [{"type": "runpod"}]}, "only inside the RunPod handler"),
        ({"sinks": ["jsonl"]}, r"report.sinks\[0\] must be an object"),
        ({"sinks": {"type": "jsonl"}}, "must be a list"),
        ({"heartbeat_seconds": 0}, "heartbeat_seconds must be > 0"),
        ({"metrics_interval_seconds": "fast"}, "metrics_interval_seconds must be a number"),
    ],
)
def test_from_spec_rejects_bad_settings(report: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Reporter.from_spec(spec_with(report))
