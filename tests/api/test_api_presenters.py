"""api.presenters.tenant_waiting_reason: why a job waits, as its project reads it (the
job's waiting_reason and its waiting events). The dispatcher's waits on the own fleet name the
operator's nodes; a tenant reads them by kind only, every other reason as written, and a
wording nobody taught the presenter generically (vaguer, never leaking). The attack through
the API is tests/security/test_operations.py."""

from __future__ import annotations

import pytest

from api import presenters as p
from jobs.models import JobEvent
from jobs.services.fleet import nodes
from jobs.states import WaitCode
from tests.support.db import fresh

pytestmark = pytest.mark.django_db


def _waiting_event(job) -> JobEvent:
    return JobEvent.objects.filter(job=job, data__has_key="waiting").latest("number")


def test_waits_that_name_no_node_are_shown_as_the_dispatcher_wrote_them(
    make_job, dispatch_now, api
) -> None:
    job = make_job()
    dispatch_now()  # no node at all
    assert fresh(job).waiting_reason == "Waiting for a node: no GPU node is registered."
    shown = api.get(f"/api/v1/jobs/{job.public_id}/").json()["waiting_reason"]
    assert shown == "Waiting for a node: no GPU node is registered."

    nodes.node_create(name="gpu-offline-1")
    dispatch_now()
    stored = fresh(job).waiting_reason
    assert stored == "Waiting for a node: every GPU node is offline."
    assert p.tenant_waiting_reason(stored) == stored
    event = _waiting_event(job)
    assert p.event_json(event, job.public_id)["message"] == stored


@pytest.mark.parametrize(
    ("stored", "code", "shown"),
    [
        (
            "Waiting for a node: every node that fits is busy: lab-1 (busy), lab-2 (draining).",
            None,
            p.TENANT_WAITING[WaitCode.NODES_BUSY],
        ),
        (
            "No online node fits this job: lab-1 has 0 GPU(s), the job needs 1.",
            None,
            p.TENANT_WAITING[WaitCode.NO_NODE_FITS],
        ),
        ("Anything at all, lab-1", "nodes_busy", p.TENANT_WAITING[WaitCode.NODES_BUSY]),
        (
            "No offer can take this job now: 2 offer(s) no capacity now.",
            "no_offer",
            "No offer can take this job now: 2 offer(s) no capacity now.",
        ),
        (
            "No idle GPU node fits and no cloud offer can take this job now: x.",
            None,
            "No idle GPU node fits and no cloud offer can take this job now: x.",
        ),
        ("A new wording naming lab-1.", None, p.WAITING_GENERIC),
        ("A new wording naming lab-1.", "a_new_code", p.WAITING_GENERIC),
        ("", None, ""),
    ],
)
def test_a_tenant_reads_waits_by_kind(stored: str, code: str | None, shown: str) -> None:
    assert p.tenant_waiting_reason(stored, code) == shown
    assert "lab-" not in p.tenant_waiting_reason(stored, code)


def test_only_waiting_events_are_retold(make_job) -> None:
    job = make_job()
    plain = JobEvent(job=job, number=1, type="log", message="lab-1 said hello", data={})
    assert p.event_json(plain, job.public_id)["message"] == "lab-1 said hello"
    odd = JobEvent(job=job, number=2, type="log", message="lab-1", data=["not", "a", "dict"])
    assert p.event_json(odd, job.public_id)["message"] == "lab-1"
