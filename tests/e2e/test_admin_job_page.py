"""The admin job page of a real finished job: a tiny model trained end to end on a GPU node
worker (CPU here), then its page read as an operator reads it. The loss chart holds one point
per metrics event's loss (the bounded downsample, were there more than the chart draws)."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from console.admin import charts
from jobs.models import GpuNode, JobEvent, TrainingJob
from jobs.services.fleet.nodes import node_create
from tests.e2e.conftest import submit_tiny_job, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

TRAIN_TIMEOUT = 180


def _status(job_id: str) -> str:
    return TrainingJob.objects.values_list("status", flat=True).get(public_id=job_id)


def _series(page: str, name: str) -> tuple[int, list[str]]:
    group = re.search(rf'<g class="series" data-series="{re.escape(name)}" data-points="(\d+)"'
                      r"[^>]*>(.*?)</g>", page, re.S)  # fmt: skip
    assert group, f"no {name!r} series on the page"
    return int(group.group(1)), re.findall(r"<title>(.*?)</title>", group.group(2))


def test_the_loss_chart_holds_the_points_of_a_finished_tiny_job(
    plane, start_node, api, demo_dataset, tiny_model_dir, make_user
) -> None:
    _, token = node_create(name="node-chart", actor="test")
    node = start_node("node-chart", token)
    wait_for(
        "node-chart to register",
        lambda: GpuNode.objects.filter(name="node-chart", status="idle").exists(),
        60,
        node,
        plane,
    )
    job_id = submit_tiny_job(api, tiny_model_dir, demo_dataset)
    wait_for(
        "the job to finish",
        lambda: _status(job_id) in ("succeeded", "failed", "cancelled"),
        TRAIN_TIMEOUT,
        node,
        plane,
    )
    job = TrainingJob.objects.get(public_id=job_id)
    assert job.status == "succeeded", (job.error_code, job.error_message)

    # What the executor reported: one loss per metrics event (the latest per step).
    reported: dict[float, float] = {}
    losses = 0
    for event in JobEvent.objects.filter(job=job, type="metrics").order_by("number"):
        if isinstance(event.data.get("loss"), int | float):
            losses += 1
            reported[float(event.data["step"])] = float(event.data["loss"])
    assert reported, "the tiny job reported no loss"
    assert len(reported) == losses  # one attempt: every step reported once
    expected = sorted(reported.items())

    operator = Client()
    operator.force_login(make_user("ops", is_staff=True, is_superuser=True))
    response = operator.get(f"/admin/jobs/trainingjob/{job.pk}/change/")
    assert response.status_code == 200
    page = response.content.decode()

    count, titles = _series(page, "train loss")
    drawn = charts.downsample(expected)
    assert count == len(drawn) <= charts.MAX_POINTS
    assert titles == [
        f"step {int(step)}: train loss {charts.point_value(loss)}" for step, loss in drawn
    ]
    if len(expected) <= charts.MAX_POINTS:
        assert count == len(expected)  # every reported loss is a point
    assert _series(page, "learning rate")[0] == count
    total = job.latest_metrics["total_steps"]
    assert f"step {total} / {total} (100%)" in page
    assert "node-chart" in page
