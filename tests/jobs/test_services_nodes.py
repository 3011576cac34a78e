"""jobs.services.nodes on the real database: a node's identity (its token, kept only as a hash,
rotated), its status (heartbeats, drain, silence, stopping), its registration report, its token
on its executor's events, and what a cancel or an attempt's end does to it (node_cancel,
node_release). Celery messages are recorded (``sent``, ``broadcasts``), never sent; the fleet
fixtures are in conftest.py, the helpers in _fleet.py."""

from __future__ import annotations

import hashlib
from datetime import timedelta

import pytest
from django.utils import timezone

from gpu_worker import celery_conf as cc
from jobs.models import GpuNode, NodeEvent
from jobs.services import nodes
from jobs.services.attempts import (
    attempt_end,
    attempt_record_events,
    attempts_expire_leases,
)
from jobs.services.jobs import job_cancel
from jobs.states import EndReason, JobStatus
from tests.jobs._db import fresh
from tests.jobs._fleet import (
    H100,
    attempt_of,
    expire_lease,
    node_report,
    node_status,
    online_node,
)

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
    node, token = nodes.node_create(name="gpu-a")

    with django_capture_on_commit_callbacks(execute=True):
        assert nodes.node_heartbeat(name="gpu-a", token=token) == node

    assert node_status(node) == N.IDLE
    assert sent.calls == [(cc.DISPATCH, [])]


def test_a_heartbeat_with_a_wrong_token_changes_nothing(
    django_capture_on_commit_callbacks, sent
) -> None:
    node, _ = nodes.node_create(name="gpu-a")

    with django_capture_on_commit_callbacks(execute=True):
        assert nodes.node_heartbeat(name="gpu-a", token="thn-guess") is None

    node.refresh_from_db()
    assert (node.status, node.last_heartbeat_at) == (N.OFFLINE, None)
    assert sent.calls == []


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
    nodes.node_heartbeat(name="gpu-a", token=placed.token)
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


def test_a_node_that_says_it_is_stopping_is_offline_at_once() -> None:
    node, token = online_node("gpu-a")
    nodes.node_stopping(name="gpu-a", token="thn-wrong")
    assert node_status(node) == N.IDLE
    nodes.node_stopping(name="gpu-a", token=token)
    assert node_status(node) == N.OFFLINE


# --- registration -----------------------------------------------------------------------------


def test_register_stores_the_report_with_types_enforced() -> None:
    node, token = nodes.node_create(name="gpu-a")
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

    assert nodes.node_register(name="gpu-a", token=token, report=report) == node

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
    node, token = nodes.node_create(name="gpu-a")
    nodes.node_register(
        name="gpu-a", token=token, report={"capabilities": "8x H100", "labels": ["a", "b"]}
    )
    node.refresh_from_db()
    assert node.capabilities == {"gpu_count": 0, "gpus": []}
    assert node.labels == {}
    assert node.status == N.IDLE


@pytest.mark.parametrize("gpus", [{"name": "H100"}, 8], ids=["object", "number"])
def test_register_with_a_gpu_list_that_is_not_a_list_does_not_crash(gpus) -> None:
    node, token = nodes.node_create(name="gpu-a")
    nodes.node_register(name="gpu-a", token=token, report={"capabilities": {"gpus": gpus}})
    node.refresh_from_db()
    assert node.capabilities["gpus"] == [] and node.status == N.IDLE


@pytest.mark.parametrize("vram", ["80GB", [81559]], ids=["text", "list"])
def test_register_with_a_malformed_vram_does_not_crash(vram) -> None:
    node, token = nodes.node_create(name="gpu-a")
    report = {"capabilities": {"gpus": [{"name": "H100", "vram_mb": vram}]}}
    nodes.node_register(name="gpu-a", token=token, report=report)
    node.refresh_from_db()
    assert node.capabilities["gpus"] == [{"name": "H100", "vram_mb": 0}]


def test_register_with_a_wrong_token_stores_nothing() -> None:
    node, _ = nodes.node_create(name="gpu-a")
    assert nodes.node_register(name="gpu-a", token="thn-x", report=node_report((H100,))) is None
    node.refresh_from_db()
    assert (node.capabilities, node.status, node.registered_at) == ({}, N.OFFLINE, None)


def test_a_retired_ephemeral_node_comes_back_only_as_a_new_process(make_job, dispatch_now) -> None:
    """Its last heartbeats and re-registrations, sent while it shuts down, must not make it
    idle again; a restarted node (another worker process) is welcome."""
    _, token = nodes.node_create(name="gpu-r")
    report = node_report(ephemeral=True, process="host:10:1")
    nodes.node_register(name="gpu-r", token=token, report=report)
    job = make_job()
    assert dispatch_now() == 1
    attempt_end(attempt=attempt_of(job), reason=EndReason.SUCCEEDED)
    node = GpuNode.objects.get(name="gpu-r")
    assert (node.retired, node.status) == (True, N.OFFLINE)

    nodes.node_heartbeat(name="gpu-r", token=token)
    nodes.node_register(name="gpu-r", token=token, report=report)
    assert node_status(node) == N.OFFLINE
    nodes.node_register(name="gpu-r", token=token, report={**report, "process": "host:11:2"})
    assert (fresh(node).retired, node.status) == (False, N.IDLE)


# --- executor events of a node attempt --------------------------------------------------------


def _log(seq: int) -> dict:
    return {"seq": seq, "type": "log", "message": f"line {seq}"}


@pytest.mark.parametrize("sender", ["no-token", "wrong-token", "other-node", "other-nodes-token"])
def test_events_of_a_node_attempt_without_its_nodes_token_are_dropped(placed, sender) -> None:
    _, other_token = online_node("gpu-b")
    node, token = {
        "no-token": ("gpu-a", None),
        "wrong-token": ("gpu-a", "thn-guess"),
        "other-node": ("gpu-b", other_token),
        "other-nodes-token": ("gpu-a", other_token),
    }[sender]
    before = fresh(placed.job).event_counter

    stored = attempt_record_events(
        job_id=placed.job.public_id,
        attempt_number=1,
        events=[_log(1), {"seq": 2, "type": "status", "data": {"status": "running"}}],
        node=node,
        token=token,
    )

    assert stored == 0
    job = fresh(placed.job)
    assert (job.status, job.event_counter) == (S.PROVISIONING, before)


def test_events_with_the_nodes_token_are_stored(placed) -> None:
    stored = attempt_record_events(
        job_id=placed.job.public_id,
        attempt_number=1,
        events=[_log(1), {"seq": 2, "type": "status", "data": {"status": "running"}}],
        node="gpu-a",
        token=placed.token,
    )
    assert stored == 2
    assert fresh(placed.job).status == S.RUNNING


def test_after_rotation_events_with_the_old_token_are_dropped(placed) -> None:
    new = nodes.node_rotate_token(node=placed.node)
    job_id = placed.job.public_id

    assert (
        attempt_record_events(
            job_id=job_id, attempt_number=1, events=[_log(1)], node="gpu-a", token=placed.token
        )
        == 0
    )
    assert (
        attempt_record_events(
            job_id=job_id, attempt_number=1, events=[_log(1)], node="gpu-a", token=new
        )
        == 1
    )


# --- cancel: node_cancel, node_release --------------------------------------------------------


def test_cancel_before_the_node_claimed_ends_the_attempt_and_frees_the_node(
    placed, broadcasts, django_capture_on_commit_callbacks, sent
) -> None:
    sent.clear()
    with django_capture_on_commit_callbacks(execute=True):
        job_cancel(job=placed.job)

    assert fresh(placed.job).status == S.CANCELLED
    attempt = fresh(placed.attempt)
    assert attempt.ended_at is not None and attempt.end_reason == "cancelled"
    node = fresh(placed.node)
    assert (node.status, node.current_attempt_id) == (N.IDLE, None)
    assert broadcasts.calls == [], "nothing runs yet: nothing to stop"
    assert sent.named(cc.DISPATCH), "the freed node looks for the next job"


def test_cancel_of_a_claimed_attempt_broadcasts_a_stop_to_its_node(
    claimed, broadcasts, django_capture_on_commit_callbacks
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        job_cancel(job=claimed.job)

    assert fresh(claimed.job).status == S.CANCELLING
    assert fresh(claimed.attempt).ended_at is None
    assert node_status(claimed.node) == N.BUSY
    assert broadcasts.calls == [
        {
            "command": cc.CANCEL_ATTEMPT_COMMAND,
            "arguments": {"job_id": claimed.job.public_id, "attempt": 1},
            "destination": ["node@gpu-a"],
        }
    ]


def test_the_node_confirming_the_cancel_frees_it(claimed, broadcasts) -> None:
    job_cancel(job=claimed.job)
    attempt_record_events(
        job_id=claimed.job.public_id,
        attempt_number=1,
        events=[
            {"seq": 1, "type": "status", "message": "stopped", "data": {"status": "cancelled"}}
        ],
        node="gpu-a",
        token=claimed.token,
    )
    assert fresh(claimed.job).status == S.CANCELLED
    node = fresh(claimed.node)
    assert (node.status, node.current_attempt_id) == (N.IDLE, None)


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
        node="gpu-a",
        token=claimed.token,
    )
    job = fresh(claimed.job)
    assert (job.status, job.error_code) == (S.FAILED, "oom")
    node = fresh(claimed.node)
    assert (node.status, node.current_attempt_id) == (N.IDLE, None)
