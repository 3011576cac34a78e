"""jobs.services.fleet.nodes on the real database: a node's identity (its token, kept only as a hash,
rotated), its status (heartbeats, drain, silence, stopping), its registration report, the
cancels it pulls with its heartbeat (node_stop_requests), and what a cancel or an attempt's end
does to it (node_release). The services take the node the API authenticated (test_api_nodes
covers the tokens on the wire). Celery messages are recorded (``sent``), never sent; the fleet
fixtures are in conftest.py, the helpers in _fleet.py."""

from __future__ import annotations

import hashlib
from datetime import timedelta

import pytest
from django.utils import timezone

from jobs.errors import InvalidRequest
from jobs.models import GpuNode, NodeEvent
from jobs.services.core.attempts import (
    attempt_end,
    attempt_record_events,
    attempts_expire_leases,
)
from jobs.services.core.jobs import job_cancel
from jobs.services.fleet import nodes
from jobs.states import EndReason, JobStatus
from tests.support.db import fresh
from tests.support.fleet import (
    attempt_of,
    expire_lease,
    node_report,
    node_status,
    online_node,
)
from trainhub_contract import celery_conf as cc

pytestmark = pytest.mark.django_db
S = JobStatus
N = GpuNode.Status


# --- node tokens ------------------------------------------------------------------------------


def test_node_token_is_stored_only_as_its_sha256() -> None:
    node, token = nodes.node_create(name="gpu-a", actor="ops")

    assert token.startswith("thn-") and len(token) >= 40
    row = GpuNode.objects.get(pk=node.pk)
    assert row.token_sha256 == hashlib.sha256(token.encode()).hexdigest()
    stored = [getattr(row, f.attname) for f in GpuNode._meta.concrete_fields]
    assert token not in repr(stored)
    assert token[4:] not in repr(stored)
    audit = list(NodeEvent.objects.filter(node_name="gpu-a").values_list("message", flat=True))
    assert audit and all(token[4:] not in m for m in audit)


def test_each_node_gets_its_own_token() -> None:
    _, first = nodes.node_create(name="gpu-a")
    _, second = nodes.node_create(name="gpu-b")
    assert first != second


def test_authenticate_accepts_only_the_nodes_current_token() -> None:
    node, token = nodes.node_create(name="gpu-a")
    _, other = nodes.node_create(name="gpu-b")

    assert nodes.node_authenticate(name="gpu-a", token=token) == node
    assert nodes.node_authenticate(name="gpu-a", token=token + "x") is None
    assert nodes.node_authenticate(name="gpu-a", token=other) is None
    assert nodes.node_authenticate(name="gpu-a", token=None) is None
    assert nodes.node_authenticate(name="no-such-node", token=token) is None
    assert nodes.node_authenticate(name=["gpu-a"], token=token) is None


def test_rotation_refuses_the_old_token_at_once() -> None:
    node, old = nodes.node_create(name="gpu-a")

    new = nodes.node_rotate_token(node=node, actor="ops")

    assert new != old
    assert nodes.node_authenticate(name="gpu-a", token=old) is None
    assert nodes.node_authenticate(name="gpu-a", token=new) == node
    rotated = NodeEvent.objects.get(node_name="gpu-a", kind="token_rotated")
    assert rotated.actor == "ops" and new[4:] not in rotated.message


# --- node status ------------------------------------------------------------------------------


def test_a_node_never_heartbeaten_is_offline() -> None:
    node, _ = nodes.node_create(name="gpu-a")
    assert node.status == N.OFFLINE
    assert nodes.node_settle(node_pk=node.pk) == N.OFFLINE


def test_a_heartbeat_brings_a_node_idle_and_sends_a_dispatch(
    django_capture_on_commit_callbacks, sent
) -> None:
    node, _ = nodes.node_create(name="gpu-a")

    with django_capture_on_commit_callbacks(execute=True):
        nodes.node_heartbeat(node=node)

    assert node_status(node) == N.IDLE
    assert fresh(node).last_heartbeat_at is not None
    assert sent.calls == [(cc.DISPATCH, [])]


def test_draining_an_idle_node_makes_it_draining_and_undraining_idle_again(
    django_capture_on_commit_callbacks, sent
) -> None:
    node, _ = online_node("gpu-a")

    assert nodes.node_set_draining(node=node, draining=True, actor="ops").status == N.DRAINING
    with django_capture_on_commit_callbacks(execute=True):
        assert nodes.node_set_draining(node=node, draining=False, actor="ops").status == N.IDLE
    assert sent.named(cc.DISPATCH) == [[]], "an idle node looks for work"
    kinds = NodeEvent.objects.filter(node_name="gpu-a").order_by("id").values_list("kind", "actor")
    assert list(kinds)[-2:] == [("drain", "ops"), ("undrain", "ops")]


def test_an_offline_node_stays_offline_when_drained() -> None:
    node, _ = nodes.node_create(name="gpu-a")
    node = nodes.node_set_draining(node=node, draining=True)
    assert (node.status, node.draining) == (N.OFFLINE, True)


def test_a_node_holding_an_attempt_is_busy_and_stays_busy_on_heartbeat(placed) -> None:
    assert node_status(placed.node) == N.BUSY
    assert placed.node.current_attempt_id == placed.attempt.pk
    nodes.node_heartbeat(node=placed.node)
    assert node_status(placed.node) == N.BUSY


def test_a_node_silent_for_the_offline_timeout_is_marked_offline(settings) -> None:
    settings.TRAINHUB_NODE_OFFLINE_SECONDS = 60
    silent, _ = online_node("gpu-a")
    recent, _ = online_node("gpu-b")
    now = timezone.now()
    GpuNode.objects.filter(pk=silent.pk).update(last_heartbeat_at=now - timedelta(seconds=61))
    GpuNode.objects.filter(pk=recent.pk).update(last_heartbeat_at=now - timedelta(seconds=50))

    assert nodes.nodes_mark_offline() == 1

    assert (node_status(silent), node_status(recent)) == (N.OFFLINE, N.IDLE)
    assert NodeEvent.objects.filter(node_name="gpu-a", kind="offline").count() == 1
    assert nodes.nodes_mark_offline() == 0, "an offline node is not marked again"


def test_a_node_that_says_it_is_stopping_is_offline_at_once_keeping_when_it_was_last_seen() -> None:
    node, _ = online_node("gpu-a")
    other, _ = online_node("gpu-b")
    last_seen = fresh(node).last_heartbeat_at
    nodes.node_stopping(node=node)
    assert (node_status(node), node_status(other)) == (N.OFFLINE, N.IDLE)
    assert fresh(node).last_heartbeat_at == last_seen is not None
    offline = NodeEvent.objects.get(node_name="gpu-a", kind="offline")
    assert offline.message == "Node stopped; offline until it starts again."

    nodes.node_heartbeat(node=fresh(node))  # a late heartbeat of the stopping process
    assert node_status(node) == N.OFFLINE

    nodes.node_register(node=fresh(node), report={"process": "gpu-a:4242:restarted"})
    assert node_status(node) == N.IDLE, "a new process brings it back"


# --- registration -----------------------------------------------------------------------------


def test_register_stores_the_report_with_types_enforced() -> None:
    node, _ = nodes.node_create(name="gpu-a")
    report = {
        "capabilities": {
            "gpu_count": 99,  # counted from the list instead
            "gpus": [
                {"name": "x" * 500, "vram_mb": "81559"},
                {"name": 7, "vram_mb": None},
                "not a gpu",
                None,
            ],
            "backend": "unsloth",
            "cuda_version": 12.4,
            "not_kept": "y",
        },
        "labels": {"region": "eu-west", "rack": 3},
        "ephemeral": "yes",
        "celery_hostname": "node@host-1",
        "not_kept": "z",
    }

    assert nodes.node_register(node=node, report=report) == node

    node.refresh_from_db()
    assert node.capabilities == {
        "gpu_count": 2,
        "gpus": [{"name": "x" * 100, "vram_mb": 81559}, {"name": "7", "vram_mb": 0}],
        "backend": "unsloth",
        "cuda_version": "12.4",
    }
    assert node.labels == {"region": "eu-west", "rack": "3"}
    assert node.ephemeral is True and node.celery_hostname == "node@host-1"
    assert node.status == N.IDLE and node.registered_at is not None
    assert NodeEvent.objects.filter(node_name="gpu-a", kind="registered").count() == 1


def test_register_with_non_object_capabilities_and_labels_stores_empty_ones() -> None:
    node, _ = nodes.node_create(name="gpu-a")
    nodes.node_register(node=node, report={"capabilities": "8x H100", "labels": ["a", "b"]})
    node.refresh_from_db()
    assert node.capabilities == {"gpu_count": 0, "gpus": []}
    assert node.labels == {}
    assert node.status == N.IDLE


@pytest.mark.parametrize("gpus", [{"name": "H100"}, 8], ids=["object", "number"])
def test_register_with_a_gpu_list_that_is_not_a_list_does_not_crash(gpus) -> None:
    node, _ = nodes.node_create(name="gpu-a")
    nodes.node_register(node=node, report={"capabilities": {"gpus": gpus}})
    node.refresh_from_db()
    assert node.capabilities["gpus"] == [] and node.status == N.IDLE


@pytest.mark.parametrize("vram", ["80GB", [81559]], ids=["text", "list"])
def test_register_with_a_malformed_vram_does_not_crash(vram) -> None:
    node, _ = nodes.node_create(name="gpu-a")
    report = {"capabilities": {"gpus": [{"name": "H100", "vram_mb": vram}]}}
    nodes.node_register(node=node, report=report)
    node.refresh_from_db()
    assert node.capabilities["gpus"] == [{"name": "H100", "vram_mb": 0}]


def test_a_retired_ephemeral_node_comes_back_only_as_a_new_process(make_job, dispatch_now) -> None:
    """Its last heartbeats and re-registrations, sent while it shuts down, must not make it
    idle again; a restarted node (another worker process) is welcome."""
    node, _ = nodes.node_create(name="gpu-r")
    report = node_report(ephemeral=True, process="host:10:1")
    nodes.node_register(node=node, report=report)
    job = make_job()
    assert dispatch_now() == 1
    attempt_end(attempt=attempt_of(job), reason=EndReason.SUCCEEDED)
    node = GpuNode.objects.get(name="gpu-r")
    assert (node.retired, node.status) == (True, N.OFFLINE)

    # Each call gets the node as the API reads it for that request.
    nodes.node_heartbeat(node=fresh(node))
    nodes.node_register(node=fresh(node), report=report)
    assert node_status(node) == N.OFFLINE
    nodes.node_register(node=fresh(node), report={**report, "process": "host:11:2"})
    assert (fresh(node).retired, node_status(node)) == (False, N.IDLE)


# --- cancels the node pulls: node_stop_requests -----------------------------------------------


def _stop(job_id: str, attempt: int = 1, mode: str = "cancel") -> dict:
    return {"job_id": job_id, "attempt": attempt, "mode": mode}


def test_a_node_with_nothing_cancelled_has_nothing_to_stop(claimed) -> None:
    assert nodes.node_stop_requests(node=claimed.node) == []
    running = (claimed.job.public_id, 1)
    assert nodes.node_stop_requests(node=claimed.node, running=running) == [], (
        "the live attempt of a running job, claimed by this node, goes on"
    )


def test_a_cancel_of_a_claimed_attempt_is_pulled_by_its_node_only(
    claimed, django_capture_on_commit_callbacks, sent
) -> None:
    other, _ = online_node("gpu-b")
    sent.clear()
    with django_capture_on_commit_callbacks(execute=True):
        job_cancel(job=claimed.job)

    assert fresh(claimed.job).status == S.CANCELLING
    assert fresh(claimed.attempt).ended_at is None, "ends when the node confirms the stop"
    assert node_status(claimed.node) == N.BUSY
    assert [q for q in sent.queues if q and q.startswith(cc.NODE_QUEUE_PREFIX)] == [], (
        "nothing is pushed to a node: it pulls the cancel with its heartbeat"
    )
    job_id = claimed.job.public_id
    assert nodes.node_stop_requests(node=claimed.node) == [_stop(job_id)]
    assert nodes.node_stop_requests(node=claimed.node, running=(job_id, 1)) == [_stop(job_id)]
    assert nodes.node_stop_requests(node=other) == []


def test_a_cancel_is_pulled_on_every_heartbeat_until_the_job_is_cancelled(claimed) -> None:
    """Nothing is re-sent: a lost answer is repeated by the next one, until the attempt ends
    (the node's confirmation, or here its lease)."""
    job_cancel(job=claimed.job)
    job_id = claimed.job.public_id
    for _ in range(3):
        nodes.node_heartbeat(node=claimed.node)
        assert nodes.node_stop_requests(node=claimed.node) == [_stop(job_id)]

    expire_lease(claimed.attempt)
    attempts_expire_leases()

    assert fresh(claimed.job).status == S.CANCELLED
    assert nodes.node_stop_requests(node=claimed.node) == []


def test_an_attempt_the_node_runs_after_it_ended_is_to_stop(claimed) -> None:
    """A lease that expired while the node was cut off: the job moved on without it, so what
    it still runs must stop (it is not cancelling: only the node's own report says so)."""
    expire_lease(claimed.attempt)
    assert attempts_expire_leases() == 1
    job_id = claimed.job.public_id

    assert nodes.node_stop_requests(node=claimed.node) == []
    assert nodes.node_stop_requests(node=claimed.node, running=(job_id, 1)) == [_stop(job_id)]


@pytest.mark.parametrize("what", ["unclaimed", "unknown-job", "other-attempt", "other-nodes"])
def test_an_attempt_a_node_runs_without_having_claimed_it_is_to_stop(
    placed, make_job, dispatch_now, what
) -> None:
    online_node("gpu-b")
    others = make_job()
    assert dispatch_now() == 1  # others' attempt 1 goes to gpu-b
    running = {
        "unclaimed": (placed.job.public_id, 1),
        "unknown-job": ("ftjob-nosuchjob", 1),
        "other-attempt": (placed.job.public_id, 2),
        "other-nodes": (others.public_id, 1),
    }[what]

    assert nodes.node_stop_requests(node=placed.node, running=running) == [_stop(*running)]
    assert attempt_of(others).ended_at is None, "only a request to gpu-a, nothing ended"


@pytest.mark.parametrize("running", [(1, 1), ("ftjob-x", "1"), (None, None), ("ftjob-x", True)])
def test_a_malformed_running_attempt_is_refused_naming_it(placed, running) -> None:
    with pytest.raises(InvalidRequest) as refused:
        nodes.node_stop_requests(node=placed.node, running=running)
    assert refused.value.param == "running"


# --- cancel, and the node's report of how its attempt ended -------------------------------------


def test_cancel_before_the_node_claimed_ends_the_attempt_and_frees_the_node(
    placed, django_capture_on_commit_callbacks, sent
) -> None:
    sent.clear()
    with django_capture_on_commit_callbacks(execute=True):
        job_cancel(job=placed.job)

    assert fresh(placed.job).status == S.CANCELLED
    attempt = fresh(placed.attempt)
    assert attempt.ended_at is not None and attempt.end_reason == "cancelled"
    node = fresh(placed.node)
    assert (node.status, node.current_attempt_id) == (N.IDLE, None)
    assert nodes.node_stop_requests(node=node) == [], "nothing runs yet: nothing to stop"
    assert sent.named(cc.DISPATCH), "the freed node looks for the next job"


def test_the_node_confirming_the_cancel_frees_it(claimed) -> None:
    job_cancel(job=claimed.job)
    attempt_record_events(
        job_id=claimed.job.public_id,
        attempt_number=1,
        events=[
            {"seq": 1, "type": "status", "message": "stopped", "data": {"status": "cancelled"}}
        ],
    )
    assert fresh(claimed.job).status == S.CANCELLED
    node = fresh(claimed.node)
    assert (node.status, node.current_attempt_id) == (N.IDLE, None)
    assert nodes.node_stop_requests(node=node) == [], "the cancel is not pulled again"


# --- attempt end and the node: node_release ---------------------------------------------------


def test_a_lost_attempt_frees_the_node_and_sends_a_dispatch(
    placed, django_capture_on_commit_callbacks, sent
) -> None:
    sent.clear()
    expire_lease(placed.attempt)
    with django_capture_on_commit_callbacks(execute=True):
        assert attempts_expire_leases() == 1

    node = fresh(placed.node)
    assert (node.status, node.current_attempt_id) == (N.IDLE, None)
    assert fresh(placed.job).status == S.QUEUED
    assert sent.named(cc.DISPATCH), "the requeued job and the free node meet again"


def test_a_failure_reported_by_the_node_frees_it(claimed) -> None:
    attempt_record_events(
        job_id=claimed.job.public_id,
        attempt_number=1,
        events=[{"seq": 1, "type": "error", "message": "CUDA OOM", "data": {"code": "oom"}}],
    )
    job = fresh(claimed.job)
    assert (job.status, job.error_code) == (S.FAILED, "oom")
    node = fresh(claimed.node)
    assert (node.status, node.current_attempt_id) == (N.IDLE, None)
