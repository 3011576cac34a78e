"""The operator's job page (summary, loss chart, buttons, events, log), the chart module it
draws with, and the jobs list (columns, bounded queries)."""

from __future__ import annotations

import itertools
import random
import re
from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from console.admin import charts
from jobs.models import JobEvent, TrainingJob
from tests.support.factories import (
    JobAttemptFactory,
    JobEventFactory,
    TrainingJobFactory,
    offer_dict,
)

pytestmark = pytest.mark.django_db

PAGE = "/admin/jobs/trainingjob/{}/change/"


def _get(client: Client, url: str) -> str:
    response = client.get(url)
    assert response.status_code == 200, (url, response.status_code)
    return response.content.decode()


def _metrics(job: TrainingJob, steps: range, *, attempt: int = 1, total: int = 400) -> None:
    for i, step in enumerate(steps):
        JobEventFactory(
            job=job, attempt=attempt, type="metrics", message=f"step {step}",
            data={"step": step, "total_steps": total, "loss": round(3 - step / 200, 4),
                  "lr": 0.0002 * (1 - step / total), "epoch": step / total},
            seq=10_000 * attempt + i,
        )  # fmt: skip


def _running(**fields) -> TrainingJob:
    now = timezone.now()
    defaults = {
        "status": "running",
        "target": "runpod-pod",
        "started_at": now - timedelta(minutes=30),
        "latest_metrics": {"step": 120, "total_steps": 400, "loss": 2.4},
    }
    return TrainingJobFactory(**{**defaults, **fields})


# --- the chart module ---------------------------------------------------------------------------


def _series(svg: str, name: str) -> tuple[int, list[str]]:
    """(data-points, hover titles) of one series in a chart."""
    group = re.search(rf'<g class="series" data-series="{re.escape(name)}" data-points="(\d+)"'
                      r"[^>]*>(.*?)</g>", svg, re.S)  # fmt: skip
    assert group, f"no series {name!r}"
    return int(group.group(1)), re.findall(r"<title>(.*?)</title>", group.group(2))


def test_a_chart_draws_every_point_with_its_step_and_value() -> None:
    points = [(step, 3.0 - step / 10) for step in range(1, 11)]
    svg = charts.line_chart([charts.Series("train loss", points, "#000")], title="Loss")
    assert svg.startswith("<svg") and svg.endswith("</svg>")
    count, titles = _series(svg, "train loss")
    assert count == 10
    assert titles == [f"step {s}: train loss {v:.4f}" for s, v in points]
    polyline = re.search(r'<polyline points="([^"]+)"', svg)
    assert polyline and len(polyline.group(1).split()) == 10
    # axes with tick labels on both
    ticks = re.findall(r'<text class="tick"[^>]*>([^<]+)</text>', svg)
    assert "0" in ticks and "10" in ticks and "2.00" in ticks and "2.25" in ticks


def test_downsampling_bounds_a_long_series_and_keeps_its_extremes() -> None:
    rng = random.Random(7)  # noqa: S311 - test data, not secrets
    points = [(float(s), 2.0 + rng.random() * 0.1) for s in range(1, 100_001)]
    points[54_321] = (54_322.0, 9.5)  # a spike
    points[77_777] = (77_778.0, -1.0)  # a dip
    kept = charts.downsample(points, 400)
    assert len(kept) <= 400
    assert kept[0] == points[0] and kept[-1] == points[-1]
    assert (54_322.0, 9.5) in kept and (77_778.0, -1.0) in kept
    assert [x for x, _ in kept] == sorted(x for x, _ in kept)
    svg = charts.line_chart([charts.Series("loss", points, "#000")], title="Loss", x_max=100_000)
    count, titles = _series(svg, "loss")
    assert count <= charts.MAX_POINTS and len(titles) == count
    assert len(svg) < 80_000
    assert ">100k<" in svg  # step ticks are compact


def test_everything_drawn_is_escaped_and_junk_values_are_dropped() -> None:
    evil = '<script>alert("x")</script>'
    svg = charts.line_chart(
        [charts.Series(evil, [(1, 1.0), (2, "<img>"), (3, float("nan")), (4, 2.0)], '"><x')],  # type: ignore[list-item]
        title=evil,
        y_label=evil,
        x_label=evil,
    )
    assert "<script>" not in svg and "<img>" not in svg and '"><x' not in svg
    assert "&lt;script&gt;" in svg
    count, _ = _series(svg, "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;")
    assert count == 2  # the text and the NaN are not points


def test_without_points_the_chart_says_so() -> None:
    svg = charts.training_charts(loss=[], eval_loss=[], lr=[], total_steps=None)
    assert "No training metrics yet." in svg
    assert "<polyline" not in svg and "th-lr" not in svg


@pytest.mark.parametrize(
    ("lo", "hi"), [(0, 100_000), (0.0, 0.0002), (1.23, 3.4), (5, 5), (-2.5, 7.1)]
)
def test_ticks_are_round_and_cover_the_range(lo: float, hi: float) -> None:
    ticks = charts.nice_ticks(lo, hi)
    assert ticks[0] <= lo and ticks[-1] >= hi and 2 <= len(ticks) <= 12
    steps = {round(b - a, 12) for a, b in itertools.pairwise(ticks)}
    assert len(steps) == 1


# --- the job page ---------------------------------------------------------------------------------


def test_the_summary_shows_progress_eta_place_cost_and_attempts(admin_client) -> None:
    job = _running(max_attempts=3, cost=Decimal("0.40"))
    JobAttemptFactory(job=job, number=1, target="runpod-pod", ended_at=timezone.now(),
                      cost=Decimal("0.40"), end_reason="preempted")  # fmt: skip
    JobAttemptFactory(
        job=job, number=2, target="runpod-pod", provider_instance_id="pod-abc123",
        launched_at=timezone.now() - timedelta(hours=2), billed_rate_per_hour=Decimal("1.50"),
        offer=offer_dict(target="runpod-pod", gpu_name="A100 80GB", region="EU-RO-1"),
    )  # fmt: skip
    page = _get(admin_client, PAGE.format(job.pk))
    assert "step 120 / 400 (30%)" in page
    assert 'style="width:30%;' in page
    assert "ETA " in page  # estimated_finish: 30 min for 120 steps, 280 to go
    assert "runpod-pod" in page and "pod-abc123" in page and "A100 80GB" in page
    assert "$3.40" in page  # 0.40 settled + 2 h x 1.50 so far
    assert "$1.50/h" in page
    assert re.search(r"attempts</span>\s*<div class=\"th-value\">2 / 3<", page)
    assert "waiting</span>" not in page
    assert '"latest_metrics"' not in page.split('id="trainingjob_form"')[0]  # raw fields below


@pytest.mark.parametrize(
    ("metrics", "shown"),
    [
        ({"useful_tokens_per_second": 612.4, "tokens_per_second": 2841.0, "padding_share": 0.145},
         "612 useful tokens/s of 2,841 tokens/s · 14.5% padding"),
        ({"tokens_per_second": 2841.0}, "2,841 tokens/s"),  # an executor before useful tokens
        ({"tokens_per_second": "fast", "padding_share": True}, None),  # junk is not shown
        ({}, None),
    ],
)  # fmt: skip
def test_the_summary_shows_the_latest_throughput(admin_client, metrics, shown) -> None:
    job = _running(latest_metrics={"step": 120, "total_steps": 400, **metrics})
    summary = _get(admin_client, PAGE.format(job.pk)).split('id="trainingjob_form"')[0]
    if shown is None:
        assert "tokens/s" not in summary and "padding" not in summary
    else:
        assert f'<div class="quiet">{shown}</div>' in summary


def test_the_waiting_reason_shows_only_while_queued(admin_client) -> None:
    reason = "Waiting for a node: every node that fits is busy (gpu-a busy, gpu-b busy)."
    queued = TrainingJobFactory(status="queued", waiting_reason=reason)
    page = _get(admin_client, PAGE.format(queued.pk))
    assert reason in page.split('id="trainingjob_form"')[0]
    running = _running(waiting_reason=reason)
    page = _get(admin_client, PAGE.format(running.pk))
    assert reason not in page.split('id="trainingjob_form"')[0]


def test_an_own_fleet_job_names_its_node(admin_client) -> None:
    job = _running(target="local")
    JobAttemptFactory(job=job, target="local", node_name="gpu-rack-7")
    page = _get(admin_client, PAGE.format(job.pk))
    assert "gpu-rack-7" in page and "/admin/jobs/gpunode/?q=gpu-rack-7" in page


def test_the_loss_chart_holds_the_jobs_metrics(admin_client) -> None:
    job = _running()
    _metrics(job, range(10, 130, 10))
    JobEventFactory(job=job, attempt=1, type="log", seq=99_999, message="Validation loss",
                    data={"step": 100, "eval_loss": 2.75})  # fmt: skip
    page = _get(admin_client, PAGE.format(job.pk))
    count, titles = _series(page, "train loss")
    assert count == 12
    assert titles[0] == "step 10: train loss 2.9500" and titles[-1] == "step 120: train loss 2.4000"
    assert _series(page, "validation loss")[1] == ["step 100: validation loss 2.7500"]
    assert _series(page, "learning rate")[0] == 12
    assert "12 metrics events" in page


def test_a_resumed_attempts_repeated_steps_keep_the_latest_value(admin_client) -> None:
    job = _running()
    _metrics(job, range(1, 6), attempt=1)
    JobEventFactory(job=job, attempt=2, type="metrics", seq=1, message="again",
                    data={"step": 5, "loss": 1.0})  # fmt: skip
    count, titles = _series(_get(admin_client, PAGE.format(job.pk)), "train loss")
    assert count == 5 and titles[-1] == "step 5: train loss 1.0000"


def test_a_job_without_metrics_shows_the_empty_chart(admin_client) -> None:
    job = TrainingJobFactory(status="queued")
    page = _get(admin_client, PAGE.format(job.pk))
    assert "No training metrics yet." in page and "no steps reported yet" in page


def _buttons(page: str) -> set[str]:
    return set(re.findall(r'action="/admin/jobs/trainingjob/\d+/do/(\w+)/"', page))


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        ("validating_files", {"cancel"}),
        ("queued", {"cancel"}),
        ("provisioning", {"pause", "cancel"}),
        ("running", {"pause", "cancel"}),
        ("paused", {"resume", "cancel"}),
        ("finalizing", {"cancel"}),
        ("cancelling", set()),
        ("succeeded", set()),
        ("failed", {"retry"}),
        ("cancelled", {"retry"}),
    ],
)
def test_only_the_buttons_the_status_allows(admin_client, status, expected) -> None:
    job = TrainingJobFactory(status=status)
    assert _buttons(_get(admin_client, PAGE.format(job.pk))) == expected


def test_cancel_asks_first_then_cancels_through_the_service(admin_client, make_job) -> None:
    job = make_job()
    url = f"/admin/jobs/trainingjob/{job.pk}/do/cancel/"
    asked = admin_client.post(url)
    assert asked.status_code == 200
    assert "Yes, cancel it" in asked.content.decode()
    job.refresh_from_db()
    assert job.status == "queued"

    done = admin_client.post(url, {"confirm": "yes"}, follow=True)
    assert done.redirect_chain == [(PAGE.format(job.pk), 302)]
    assert "Cancelled 1 job(s)." in done.content.decode()
    job.refresh_from_db()
    assert job.status == "cancelled"
    statuses = list(
        JobEvent.objects.filter(job=job, type="status")
        .order_by("number")  # unordered, PostgreSQL may return them in any order
        .values_list("data__status", flat=True)
    )
    assert statuses[-2:] == ["cancelling", "cancelled"]


def test_retry_requeues_a_cancelled_job(admin_client, make_job) -> None:
    from jobs.services.core.jobs import job_cancel

    job = make_job()
    job_cancel(job=job)
    done = admin_client.post(f"/admin/jobs/trainingjob/{job.pk}/do/retry/", follow=True)
    assert "Requeued 1 job(s)." in done.content.decode()
    job.refresh_from_db()
    assert job.status == "queued"


def test_an_action_the_status_refuses_says_why(admin_client, make_job) -> None:
    job = make_job()
    done = admin_client.post(f"/admin/jobs/trainingjob/{job.pk}/do/resume/", follow=True)
    assert f"Skipped {job.public_id}: Only paused jobs can be resumed" in done.content.decode()
    job.refresh_from_db()
    assert job.status == "queued"


def test_actions_need_a_post_with_the_csrf_token(make_user, make_job) -> None:
    job = make_job()
    client = Client(enforce_csrf_checks=True)
    client.force_login(make_user("ops", is_staff=True, is_superuser=True))
    url = f"/admin/jobs/trainingjob/{job.pk}/do/cancel/"
    assert client.post(url, {"confirm": "yes"}).status_code == 403
    assert client.get(url).status_code == 405
    job.refresh_from_db()
    assert job.status == "queued"
    # with the page's token it goes through
    page = client.get(PAGE.format(job.pk))
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.content.decode())
    assert token
    explode = f"/admin/jobs/trainingjob/{job.pk}/do/explode/"
    assert client.post(explode, {"csrfmiddlewaretoken": token.group(1)}).status_code == 404
    assert (
        client.post(url, {"confirm": "yes", "csrfmiddlewaretoken": token.group(1)}).status_code
        == 302
    )
    job.refresh_from_db()
    assert job.status == "cancelled"


def test_staff_without_change_permission_cannot_act(make_user, make_job) -> None:
    job = make_job()
    client = Client()
    client.force_login(make_user("viewer", is_staff=True))
    response = client.post(f"/admin/jobs/trainingjob/{job.pk}/do/cancel/", {"confirm": "yes"})
    assert response.status_code in (403, 404)
    job.refresh_from_db()
    assert job.status == "queued"


# --- events and log -------------------------------------------------------------------------------


def _event_rows(page: str) -> list[tuple[int, str, str, str]]:
    """(number, type, level, message) of the events table's rows."""
    table = page.split('class="th-event-table"')[1].split("</table>")[0]
    rows = re.findall(
        r"<tr class=\"th-level-\w+\">\s*<td>(\d+)</td><td>\d+</td><td>(\w+)</td><td>(\w+)</td>\s*"
        r'<td class="th-message">([^<]*)</td>',
        table,
    )
    return [(int(n), t, lvl, msg) for n, t, lvl, msg in rows]


@pytest.fixture
def busy_job() -> TrainingJob:
    """120 log lines (every 10th a warning; attempt 1 then 2), 120 metrics, 5 heartbeats."""
    job = _running()
    for i in range(120):
        JobEventFactory(job=job, number=2 * i + 1, seq=2 * i, attempt=1 if i < 60 else 2,
                        type="log", level="warning" if i % 10 == 0 else "info",
                        message=f"line-{i:03d}")  # fmt: skip
        JobEventFactory(job=job, number=2 * i + 2, seq=2 * i + 1, attempt=1 if i < 60 else 2,
                        type="metrics", message=f"metric-{i:03d}", data={"step": i, "loss": 1.0})  # fmt: skip
    for i in range(5):
        JobEventFactory(
            job=job, number=300 + i, seq=300 + i, attempt=2, type="heartbeat", message=""
        )
    return job


def test_events_hide_metrics_by_default_and_page_through_older_ones(admin_client, busy_job) -> None:
    url = PAGE.format(busy_job.pk)
    first = _get(admin_client, url)
    rows = _event_rows(first)
    assert [m for _, _, _, m in rows] == [f"line-{i:03d}" for i in range(119, 69, -1)]
    assert "metric-" not in first
    older = re.search(r'href="([^"]*ev_before=\d+[^"]*)">older', first)
    assert older
    second = _get(admin_client, older.group(1).replace("&amp;", "&"))
    assert [m for _, _, _, m in _event_rows(second)] == [f"line-{i:03d}" for i in range(69, 19, -1)]
    newer = re.search(r'href="([^"]*ev_after=\d+[^"]*)">\u2039 newer', second)
    assert newer
    back = _get(admin_client, newer.group(1).replace("&amp;", "&"))
    assert _event_rows(back) == rows
    third = re.search(r'href="([^"]*ev_before=\d+[^"]*)">older', second)
    assert third
    last = _get(admin_client, third.group(1).replace("&amp;", "&"))
    assert [m for _, _, _, m in _event_rows(last)] == [f"line-{i:03d}" for i in range(19, -1, -1)]
    assert ">older" not in last


def test_events_filter_by_type_level_and_attempt(admin_client, busy_job) -> None:
    url = PAGE.format(busy_job.pk)
    metrics = _event_rows(_get(admin_client, f"{url}?ev_type=metrics"))
    assert len(metrics) == 50 and {t for _, t, _, _ in metrics} == {"metrics"}
    warnings = _event_rows(_get(admin_client, f"{url}?ev_level=warning"))
    assert [m for _, _, _, m in warnings] == [f"line-{i:03d}" for i in range(110, -1, -10)]
    first_attempt = _event_rows(_get(admin_client, f"{url}?ev_attempt=1&ev_level=warning"))
    assert [m for _, _, _, m in first_attempt] == [f"line-{i:03d}" for i in range(50, -1, -10)]
    # junk in the query string is ignored, never an error
    assert len(_event_rows(_get(admin_client, f"{url}?ev_type=<x>&ev_level=9&ev_before=zz"))) == 50


def test_the_log_view_shows_the_latest_lines_per_attempt(admin_client, busy_job) -> None:
    page = _get(admin_client, PAGE.format(busy_job.pk))
    tail = page.split('class="th-logbox"')[1].split("</pre>")[0]
    assert re.findall(r"line-\d{3}", tail) == [f"line-{i:03d}" for i in range(90, 120)]
    log_url = f"/admin/jobs/trainingjob/{busy_job.pk}/log/"
    latest = _get(admin_client, log_url)  # the newest attempt that logged: 2
    assert re.findall(r"line-\d{3}", latest) == [f"line-{i:03d}" for i in range(60, 120)]
    first = _get(admin_client, f"{log_url}?attempt=1&lines=200")
    assert re.findall(r"line-\d{3}", first) == [f"line-{i:03d}" for i in range(60)]
    every = _get(admin_client, f"{log_url}?attempt=all&lines=200")
    assert len(re.findall(r"line-\d{3}", every)) == 120
    assert "metric-" not in every
    assert 'class="th-logbox th-logbox-full"' in every


def test_log_lines_are_escaped(admin_client) -> None:
    job = _running()
    JobEventFactory(job=job, attempt=1, type="log", message="<script>alert(1)</script>")
    for url in (PAGE.format(job.pk), f"/admin/jobs/trainingjob/{job.pk}/log/"):
        page = _get(admin_client, url)
        assert "<script>alert(1)</script>" not in page
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page


# --- the jobs list ----------------------------------------------------------------------------------


def _list_jobs(count: int) -> list[TrainingJob]:
    jobs = []
    for i in range(count):
        job = _running(
            latest_metrics={"step": 120, "total_steps": 400},
            cost=Decimal("0.25"),
            model="meta-llama/Llama-3.1-8B-Instruct-with-a-long-name",
        ) if i % 2 else TrainingJobFactory(
            status="queued", waiting_reason=f"No offer can take this job now: {'x' * 80} {i}"
        )  # fmt: skip
        if i % 2:
            JobAttemptFactory(job=job, number=1, target="runpod-pod", ended_at=timezone.now(),
                              cost=Decimal("0.25"))  # fmt: skip
            JobAttemptFactory(job=job, number=2, target="runpod-pod",
                              provider_instance_id=f"pod-{i}",
                              launched_at=timezone.now() - timedelta(hours=1),
                              billed_rate_per_hour=Decimal("2.00"))  # fmt: skip
        jobs.append(job)
    return jobs


def _list_queries(client: Client) -> tuple[int, str]:
    with CaptureQueriesContext(connection) as captured:
        page = _get(client, "/admin/jobs/trainingjob/")
    return len(captured), page


def test_the_jobs_list_shows_place_progress_cost_and_waiting(admin_client) -> None:
    _list_jobs(2)
    _, page = _list_queries(admin_client)
    assert "120/400 (30%)" in page
    assert "runpod-pod pod-1" in page
    assert "$2.25" in page  # 0.25 settled + 1 h x 2.00
    full = f"No offer can take this job now: {'x' * 80} 0"
    assert f'title="{full}"' in page  # the full reason on hover
    assert "…" in page


def test_the_jobs_list_costs_the_same_queries_for_5_or_50_jobs(admin_client) -> None:
    _list_jobs(5)
    few, _ = _list_queries(admin_client)
    _list_jobs(45)
    many, page = _list_queries(admin_client)
    assert page.count('class="field-job"') == 50
    assert many == few, f"{many} queries for 50 jobs, {few} for 5: a query per row"
    assert many <= 15


# --- priority and delete: through the services, recorded --------------------------------------


def test_a_priority_edit_goes_through_the_service_and_is_recorded(admin_client) -> None:
    from jobs.models import AuditEntry

    job = TrainingJobFactory()
    response = admin_client.post(PAGE.format(job.pk), {"priority": "7"})
    assert response.status_code == 302, response.content[:500]
    job.refresh_from_db()
    assert job.priority == 7
    entry = AuditEntry.objects.get(action="job.update", object_id=job.public_id)
    assert (entry.source, entry.actor) == ("admin", "root")
    assert entry.changes == {"priority": {"from": 0, "to": 7}}


def test_only_a_finished_job_can_be_deleted_and_it_goes_through_the_service(
    admin_client,
) -> None:
    from jobs.models import AuditEntry, StorageDeletion

    live, done = TrainingJobFactory(status="running"), TrainingJobFactory(status="succeeded")
    delete = "/admin/jobs/trainingjob/{}/delete/"
    assert admin_client.get(delete.format(live.pk)).status_code == 403
    assert "deletelink" not in _get(admin_client, PAGE.format(live.pk))

    assert "Are you sure" in _get(admin_client, delete.format(done.pk))  # asks first
    response = admin_client.post(delete.format(done.pk), {"post": "yes"})
    assert response.status_code == 302
    assert not TrainingJob.objects.filter(pk=done.pk).exists()
    entry = AuditEntry.objects.get(action="job.delete", object_id=done.public_id)
    assert (entry.source, entry.actor) == ("admin", "root")
    assert StorageDeletion.objects.filter(reason="job deleted").exists(), "its files are purged"


def test_delete_selected_asks_first_and_refuses_a_selection_holding_a_live_job(
    admin_client,
) -> None:
    from jobs.models import AuditEntry

    live, done = TrainingJobFactory(status="running"), TrainingJobFactory(status="failed")
    listing = "/admin/jobs/trainingjob/"
    both = {"action": "delete_selected", "_selected_action": [live.pk, done.pk]}
    asked = admin_client.post(listing, both)
    assert asked.status_code == 200 and "Cannot delete training jobs" in asked.content.decode()
    assert admin_client.post(listing, {**both, "post": "yes"}).status_code == 403
    assert TrainingJob.objects.count() == 2, "nothing deleted"

    only_done = {"action": "delete_selected", "_selected_action": [done.pk], "post": "yes"}
    assert admin_client.post(listing, only_done).status_code == 302
    assert list(TrainingJob.objects.values_list("pk", flat=True)) == [live.pk]
    assert AuditEntry.objects.filter(action="job.delete", object_id=done.public_id).count() == 1


def test_a_spot_job_shows_its_capacity_on_demand_cost_and_forgiven_preemptions(
    admin_client,
) -> None:
    job = _running(capacity="spot", cost=Decimal("1.20"), on_demand_cost=Decimal("3.60"),
                   preemptions=2, max_preemptions=5)  # fmt: skip
    page = _get(admin_client, PAGE.format(job.pk))
    assert "capacity: spot · on demand: $3.60" in page
    assert "+ 2 preemption(s) not counted (of 5)" in page
    assert "capacity:" not in _get(admin_client, PAGE.format(_running().pk)), "on demand: quiet"
