"""The admin index's dashboard: its numbers against rows made here, its links, and the app list
still below it."""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from console.admin import dashboard
from jobs.models import GpuNode
from tests.support.factories import (
    GpuNodeFactory,
    JobAttemptFactory,
    TrainingJobFactory,
    offer_dict,
)

pytestmark = pytest.mark.django_db


def _midnight() -> datetime:
    today = timezone.localdate()
    return timezone.make_aware(datetime(today.year, today.month, today.day))


@pytest.fixture
def rows() -> dict[str, object]:
    now = timezone.now()
    for status, count in {"queued": 3, "running": 2, "failed": 1, "succeeded": 4}.items():
        for _ in range(count):
            TrainingJobFactory(status=status)
    for status, count in {"idle": 2, "busy": 1, "offline": 3}.items():
        for _ in range(count):
            GpuNodeFactory(status=status)
    pod_job = TrainingJobFactory(status="running", target="runpod-pod")
    # ended today: counted in full; ended yesterday: not at all
    JobAttemptFactory(job=pod_job, number=1, target="runpod-pod", ended_at=now,
                      cost=Decimal("1.25"))  # fmt: skip
    JobAttemptFactory(job=pod_job, number=2, target="runpod-pod",
                      ended_at=_midnight() - timedelta(minutes=5), cost=Decimal("9.00"))  # fmt: skip
    # live since 2 h (or since yesterday: only today's part counts) at 1.50/h
    live = JobAttemptFactory(job=pod_job, number=3, target="runpod-pod",
                             provider_instance_id="pod-live-1", billed_rate_per_hour=Decimal("1.50"),
                             launched_at=max(now - timedelta(hours=2), _midnight()))  # fmt: skip
    vast_job = TrainingJobFactory(status="provisioning", target="vastai")
    launching = JobAttemptFactory(job=vast_job, target="vastai", provider_instance_id="vast-9",
                                  offer=offer_dict(target="vastai", price_per_hour=0.40))  # fmt: skip
    # not machines: an own-fleet attempt, an ended rented one
    JobAttemptFactory(job=TrainingJobFactory(status="running"), target="local", node_name="gpu-x")
    lambda_job = TrainingJobFactory(status="failed", target="lambda")
    JobAttemptFactory(job=lambda_job, target="lambda", provider_instance_id="i-gone",
                      ended_at=now - timedelta(minutes=1), cost=Decimal("0.75"))  # fmt: skip
    return {"live": live, "launching": launching, "pod_job": pod_job, "now": now}


def test_jobs_and_nodes_by_status_count_the_rows(rows) -> None:
    jobs = {t.label: t.count for t in dashboard.jobs_by_status()}
    assert jobs["queued"] == 3 and jobs["succeeded"] == 4 and jobs["failed"] == 2
    assert jobs["running"] == 2 + 2 and jobs["provisioning"] == 1 and jobs["cancelled"] == 0
    nodes = {t.label: t.count for t in dashboard.nodes_by_status()}
    assert nodes == {"idle": 2, "busy": 1, "draining": 0, "offline": 3}
    assert GpuNode.objects.count() == 6


def test_spend_today_per_target(rows) -> None:
    spend = {s.target: s for s in dashboard.spend_today(rows["now"])}
    assert set(spend) == {"runpod-pod", "lambda"}
    pod = spend["runpod-pod"]
    hours = Decimal((rows["now"] - rows["live"].launched_at).total_seconds()) / 3600
    assert pod.ended == Decimal("1.25")
    assert abs(pod.running - Decimal("1.50") * hours) < Decimal("0.001")
    assert spend["lambda"].total == Decimal("0.75")
    assert pod.url.endswith("?target__exact=runpod-pod")


def test_live_machines_are_the_rented_attempts_not_ended(rows) -> None:
    shown, total = dashboard.machines(rows["now"])
    assert total == 2
    assert {m.instance for m in shown} == {"pod-live-1", "vast-9"}
    vast = next(m for m in shown if m.instance == "vast-9")
    assert vast.rate == Decimal("0.4000") and vast.launched_at is None  # quoted, still launching


def test_the_index_shows_the_dashboard_above_the_app_list(admin_client, rows) -> None:
    response = admin_client.get("/admin/")
    assert response.status_code == 200
    page = response.content.decode()
    assert [t.name for t in response.templates][:2] == [
        "admin/jobs/dashboard_index.html",
        "admin/index.html",
    ]
    assert page.index('id="th-dashboard"') < page.index('class="app-jobs')  # app list below
    tile = re.search(r'href="/admin/jobs/trainingjob/\?status__exact=queued" data-status="queued">\s*'
                     r'<span class="th-count"[^>]*>(\d+)</span>', page)  # fmt: skip
    assert tile and tile.group(1) == "3"
    node = re.search(r'href="/admin/jobs/gpunode/\?status__exact=offline" data-status="offline">\s*'
                     r'<span class="th-count"[^>]*>(\d+)</span>', page)  # fmt: skip
    assert node and node.group(1) == "3"
    assert 'href="/admin/jobs/trainingjob/?target__exact=runpod-pod"' in page
    assert "Live cloud machines</a>: 2" in page and "pod-live-1" in page and "vast-9" in page
    assert f'href="/admin/jobs/trainingjob/{rows["pod_job"].pk}/change/"' in page
    assert "Recent actions" in page


def test_every_dashboard_link_opens_its_filtered_list(admin_client, rows) -> None:
    page = admin_client.get("/admin/").content.decode()
    links = set(re.findall(r'href="(/admin/jobs/(?:trainingjob|gpunode)/\?[^"]+)"', page))
    assert len(links) >= 10
    for link in links:
        assert admin_client.get(link.replace("&amp;", "&")).status_code == 200, link
    live = admin_client.get("/admin/jobs/trainingjob/?machine=live").content.decode()
    assert live.count('class="field-job"') == 2
    assert rows["pod_job"].public_id in live


def test_an_empty_installation_has_a_quiet_dashboard(admin_client) -> None:
    page = admin_client.get("/admin/").content.decode()
    assert "Nothing rented today." in page and "No rented machine is running." in page
