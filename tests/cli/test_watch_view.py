"""The watch's view of a job, drawn as a person at a terminal sees it (live, on stderr)."""

from __future__ import annotations

import io

from rich.console import Console

from trainhub_cli import sse
from trainhub_cli.render import sparkline
from trainhub_cli.watch import View, event_seq, stream_kind


def test_the_live_view_shows_status_progress_eta_loss_and_the_last_logs() -> None:
    view = View("ftjob-v", status="running")
    for step, loss in enumerate([3.0, 2.5, 2.0, 1.8, 1.2], start=1):
        view.apply("metrics", {"data": {"step": step, "total_steps": 10, "loss": loss}})
    view.apply("metrics", {"data": {"useful_tokens_per_second": 1612.4, "padding_share": 0.145}})
    for n in range(8):
        view.apply("log", {"message": f"line {n}", "data": {}})
    view.rate = 1.0  # steps per second
    screen = io.StringIO()
    Console(file=screen, width=100, force_terminal=True, color_system=None).print(view.render())
    text = screen.getvalue()
    assert "ftjob-v" in text and "running" in text
    assert "step 5/10" in text and "loss 1.2000" in text and "ETA 5s" in text
    assert "1,612 useful tok/s" in text and "14% padding" in text
    assert sparkline([3.0, 2.5, 2.0, 1.8, 1.2]) in text
    assert "line 7" in text and "line 1" not in text  # the last few log lines only


def test_the_live_view_shows_the_validation_curve_beside_the_training_one() -> None:
    view = View("ftjob-v", status="running")
    for step, loss in enumerate([3.0, 2.0, 1.5, 1.0], start=1):
        view.apply("metrics", {"data": {"step": step, "total_steps": 4, "loss": loss,
                                        "mean_token_accuracy": 0.2 * step}})  # fmt: skip
        if step % 2 == 0:
            view.apply("log", {"message": "Validation loss", "data": {"step": step,
                                                                     "eval_loss": 4.0 - step}})  # fmt: skip
    screen = io.StringIO()
    Console(file=screen, width=100, force_terminal=True, color_system=None).print(view.render())
    text = screen.getvalue()
    assert "loss 1.0000" in text and "valid 0.0000" in text and "token accuracy 80%" in text
    assert sparkline([3.0, 2.0, 1.5, 1.0]) in text and sparkline([2.0, 0.0]) in text


def test_sparkline_and_stream_helpers() -> None:
    assert sparkline([1.0, 2.0, 3.0]) == "▁▄█"
    assert sparkline([2.0, 2.0]) == "▄▄" and sparkline([]) == ""
    assert event_seq("ftevent-abc-41") == 41
    # the events list's status events of an attempt are the stream's attempt_status
    assert (
        stream_kind({"type": "status", "attempt": 1, "data": {"status": "running"}})
        == "attempt_status"
    )
    assert (
        stream_kind({"type": "status", "attempt": None, "data": {"status": "failed"}}) == "status"
    )
    frames = [": stream of ftjob-x", "id: 3", "event: status", 'data: {"data": {"status": "queued"}}',
              "", ": keep-alive", "event: resync", 'data: {"seq":2}', ""]  # fmt: skip
    parsed = list(sse.parse(frames))
    assert parsed[0] is None and parsed[2] is None
    assert parsed[1] == sse.ServerEvent("status", "3", {"data": {"status": "queued"}})
    assert parsed[3] == sse.ServerEvent("resync", None, {"seq": 2})
