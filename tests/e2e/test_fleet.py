"""The own GPU fleet end to end, with real processes: the API (this process and the live
server), the control plane's worker on Redis, and GPU node workers that run the real executor
on the tiny model. Nothing is mocked."""

from __future__ import annotations

import io
import os
import re
import tarfile
import time
from pathlib import Path
from typing import Any

import pytest

from jobs.models import GpuNode, JobAttempt, JobEvent, NodeEvent, TrainingJob
from jobs.services.core.attempts import attempts_end_stalled, attempts_expire_leases
from jobs.services.fleet.nodes import node_create
from tests.e2e.conftest import LEASE_TTL_SECONDS, Process, submit_tiny_job, wait_for
from tests.gpu_worker._hub_cache import SINGLE, hub_repo
from tests.support.api import download
from trainhub_contract import celery_conf as cc
from trainhub_contract.bundle import verify_bundle

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

TRAIN_TIMEOUT = 180
HANG_ONCE = Path(__file__).resolve().parent.parent / "support" / "hang_once"


def _node(name: str) -> str:
    _, token = node_create(name=name, actor="test")
    return token


def _node_status(name: str) -> str | None:
    return GpuNode.objects.filter(name=name).values_list("status", flat=True).first()


def _wait_idle(name: str, *procs: Process) -> None:
    wait_for(f"node {name} to register", lambda: _node_status(name) == "idle", 60, *procs)


def _job(job_id: str) -> TrainingJob:
    return TrainingJob.objects.get(public_id=job_id)


def _status_is(job_id: str, *statuses: str) -> bool:
    return _job(job_id).status in statuses


def _events(job_id: str, type_: str | None = None) -> list[JobEvent]:
    rows = JobEvent.objects.filter(job__public_id=job_id).order_by("number")
    return list(rows.filter(type=type_) if type_ else rows)


def test_a_job_runs_on_an_idle_node_and_its_adapter_is_verified(
    plane, start_node, api, demo_dataset, tiny_model_dir, tmp_path
) -> None:
    # The node's model caches: a hub cache holding one complete and one partial download, and
    # the tiny model's folder as a local model directory.
    hub = tmp_path / "hf-hub"
    hub_repo(hub, "acme/cached-model", SINGLE)
    hub_repo(hub, "acme/half-downloaded", SINGLE, incomplete=True)
    node = start_node(
        "node-a",
        _node("node-a"),
        HF_HUB_CACHE=str(hub),
        TRAINHUB_NODE_MODEL_DIRS=str(tiny_model_dir),
    )
    _wait_idle("node-a", node, plane)
    registered = GpuNode.objects.get(name="node-a")
    assert registered.capabilities["backend"] == "peft"
    assert registered.capabilities["gpu_count"] == 0
    assert registered.celery_hostname.startswith("node-a@")
    assert registered.cached_models == sorted([str(tiny_model_dir), "acme/cached-model"])
    assert registered.models_reported_at is not None

    job_id = submit_tiny_job(api, tiny_model_dir, demo_dataset)
    assert_trains_to_a_verified_adapter(
        api, job_id, "node-a", tiny_model_dir, tmp_path, node, plane
    )
    [cache_note] = [e for e in _events(job_id, "log") if "model_cached" in e.data]
    assert cache_note.data["model_cached"] is True


def assert_trains_to_a_verified_adapter(
    api: Any, job_id: str, node_name: str, model: Path, tmp_path: Path, *procs: Process
) -> None:
    """The job succeeds on ``node_name``; its stored adapter downloads (following a redirect to
    S3 if storage is there), re-verifies and reloads; the node is idle again."""
    wait_for(
        "the job to succeed",
        lambda: _status_is(job_id, "succeeded", "failed", "cancelled"),
        TRAIN_TIMEOUT,
        *procs,
    )
    job = _job(job_id)
    assert job.status == "succeeded", (job.error_code, job.error_message)
    attempt = JobAttempt.objects.get(job=job)
    assert (attempt.node_name, attempt.end_reason) == (node_name, "succeeded")
    assert attempt.claimed_at is not None and attempt.started_at is not None
    statuses = [
        e.data["status"] for e in _events(job_id, "status") if e.attempt == 0 and "status" in e.data
    ]
    assert statuses == [
        "validating_files", "queued", "provisioning", "running", "finalizing", "succeeded"
    ]  # fmt: skip
    assert any(e.type == "metrics" for e in _events(job_id))
    # The job's metrics count both kinds of token, and the padding's share.
    metrics = api.get(f"/api/v1/jobs/{job_id}").json()["metrics"]
    assert 0 < metrics["useful_tokens_per_second"] < metrics["tokens_per_second"]
    assert metrics["useful_tokens"] > 0 and 0 <= metrics["padding_share"] < 1

    # The stored adapter is the executor's bundle, verified; it downloads and reloads.
    listed = api.get(f"/api/v1/jobs/{job_id}/artifacts/").json()["data"]
    assert len(listed) == 1 and listed[0]["sha256"]
    got = download(api, listed[0]["id"])
    assert got.status == 200
    assert got.sha256_header == listed[0]["sha256"]
    assert verify_bundle([got.body]).sha256 == listed[0]["sha256"]
    with tarfile.open(fileobj=io.BytesIO(got.body)) as tar:
        tar.extractall(tmp_path / "adapter", filter="data")
    _assert_reloads(model, tmp_path / "adapter")

    # The node is free again and said nothing it was not asked.
    wait_for(f"{node_name} to be idle", lambda: _node_status(node_name) == "idle", 20, *procs)
    assert GpuNode.objects.get(name=node_name).current_attempt is None


def _assert_reloads(base: Path, adapter_dir: Path) -> None:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), adapter_dir)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([[1, 2, 3]])).logits
    assert torch.isfinite(logits).all()
    assert any("lora_A" in name for name, _ in model.named_parameters())


def test_cancel_while_running_stops_the_executor_and_frees_the_node(
    plane, start_node, api, demo_dataset, tiny_model_dir
) -> None:
    node = start_node("node-c", _node("node-c"))
    _wait_idle("node-c", node, plane)
    job_id = submit_tiny_job(
        api, tiny_model_dir, demo_dataset, hyperparameters={"n_epochs": 50, "batch_size": 2}
    )
    wait_for(
        "training to start",
        lambda: any(e.type == "metrics" for e in _events(job_id)),
        TRAIN_TIMEOUT,
        node,
        plane,
    )
    cancelled = api.post(f"/api/v1/jobs/{job_id}/cancel/")
    assert cancelled.status_code == 200, cancelled.content
    assert cancelled.json()["status"] == "cancelling"
    wait_for("the job to be cancelled", lambda: _status_is(job_id, "cancelled"), 60, node, plane)
    attempt = JobAttempt.objects.get(job__public_id=job_id)
    assert attempt.end_reason == "cancelled"
    # The executor stopped by itself (cancel file), not by a signal: it reported it.
    assert any(
        e.attempt == 1 and e.type == "status" and e.data.get("status") == "cancelled"
        for e in _events(job_id)
    )
    wait_for("node-c to be idle", lambda: _node_status("node-c") == "idle", 20, node)
    assert node.alive()


def test_a_node_killed_mid_training_loses_the_attempt_and_the_job_resumes_elsewhere(
    plane, start_node, api, demo_dataset, tiny_model_dir
) -> None:
    token = _node("node-k")
    node = start_node("node-k", token)
    _wait_idle("node-k", node, plane)
    job_id = submit_tiny_job(api, tiny_model_dir, demo_dataset, hyperparameters={"n_epochs": 4})
    wait_for(
        "a checkpoint",
        lambda: any(e.type == "checkpoint" for e in _events(job_id)),
        TRAIN_TIMEOUT,
        node,
        plane,
    )
    assert _executors_of(job_id, node), "the executor should be running now"
    node.kill_group()  # the worker and its pool child; the executor dies with its supervisor
    wait_for("the orphaned executor to die", lambda: not _executors_of(job_id, node), 10)

    # The attempt's lease runs out (no heartbeats), so beat's expire_leases finds it lost.
    wait_for(
        "the lost attempt to end and the job to be requeued",
        lambda: attempts_expire_leases() or _status_is(job_id, "queued"),
        LEASE_TTL_SECONDS * 4,
        plane,
    )
    first = JobAttempt.objects.get(job__public_id=job_id, number=1)
    assert first.end_reason == "lease_expired"
    # Requeued when attempt 1 ended: its next status is queued. By now the control worker may
    # have dispatched it again (node-k is not offline yet): provisioning, its message waiting.
    statuses = [
        e.data["status"] for e in _events(job_id, "status") if e.attempt == 0 and "status" in e.data
    ]
    assert statuses[statuses.index("running") :][:2] == ["running", "queued"], statuses
    assert _job(job_id).status in ("queued", "provisioning")

    restarted = start_node("node-k", token)
    wait_for(
        "the job to succeed on the restarted node",
        lambda: _status_is(job_id, "succeeded", "failed"),
        TRAIN_TIMEOUT,
        restarted,
        plane,
    )
    job = _job(job_id)
    assert job.status == "succeeded", (job.error_code, job.error_message)
    second = JobAttempt.objects.get(job=job, number=2)
    assert second.node_name == "node-k" and second.end_reason == "succeeded"
    resumed = [e for e in _events(job_id) if e.attempt == 2 and "Resuming from" in e.message]
    assert resumed, "the second attempt started from zero"
    step = resumed[0].data["step"]
    assert step >= 5 and step % 5 == 0
    final = [e for e in _events(job_id) if e.attempt == 2 and e.type == "metrics"][-1].data
    assert final["step"] == final["total_steps"] == 60  # 60 examples / 4 per step x 4 epochs


def test_a_run_that_hangs_while_its_heartbeats_go_on_is_stopped_and_retried(
    plane, start_node, api, demo_dataset, tiny_model_dir, tmp_path, settings
) -> None:
    """The stall watchdog with a real hang: the node's first executor blocks in loading the
    model for good (tests/support/hang_once) while its heartbeat thread keeps the lease. The
    attempt ends ``stalled``, the node kills that executor, and the retry succeeds there."""
    settings.TRAINHUB_STALL_SECONDS = 8
    hang_used = tmp_path / "hang-used"
    path = os.pathsep.join(filter(None, [str(HANG_ONCE), os.environ.get("PYTHONPATH")]))
    node = start_node("node-h", _node("node-h"), PYTHONPATH=path,
                      TRAINHUB_TEST_HANG_ONCE=str(hang_used))  # fmt: skip
    _wait_idle("node-h", node, plane)
    job_id = submit_tiny_job(api, tiny_model_dir, demo_dataset)
    wait_for("the executor to hang", hang_used.exists, TRAIN_TIMEOUT, node, plane)
    (hung,) = _executors_of(job_id, node)

    wait_for(
        "the hung attempt to end stalled",
        lambda: attempts_end_stalled() or JobAttempt.objects.filter(end_reason="stalled").exists(),
        60,
        node,
        plane,
    )
    first = JobAttempt.objects.get(job__public_id=job_id, number=1)
    assert first.end_reason == "stalled" and first.progress_step is None
    wait_for("the node to kill the hung executor", lambda: not _alive(hung), 60, node)
    wait_for(
        "the retried job to end",
        lambda: _status_is(job_id, "succeeded", "failed"),
        TRAIN_TIMEOUT,
        node,
        plane,
    )
    job = _job(job_id)
    assert job.status == "succeeded", (job.error_code, job.error_message)
    second = JobAttempt.objects.get(job=job, number=2)
    assert second.node_name == "node-h" and second.end_reason == "succeeded"
    said = [e.message for e in _events(job_id, "status") if e.data.get("end_reason") == "stalled"]
    assert said and "before the first training step (loading)" in said[0], said


def test_an_attempt_whose_message_vanished_is_sent_again(
    plane, start_node, api, demo_dataset, tiny_model_dir, settings
) -> None:
    """What a Redis restart does to a queued message, done by hand: the node dies unseen, the
    job is dispatched to it, its queue is emptied; the restarted node gets the attempt again."""
    from jobs.services.runners.node import attempts_resend_unclaimed
    from trainhub.celery import app

    token = _node("node-v")
    node = start_node("node-v", token)
    _wait_idle("node-v", node, plane)
    first_seen = GpuNode.objects.get(name="node-v").registered_at
    node.kill_group()  # no goodbye: the control plane still sees it idle
    job_id = submit_tiny_job(api, tiny_model_dir, demo_dataset)
    wait_for("the dispatch", lambda: _status_is(job_id, "provisioning"), 30, plane)
    with app.connection_for_write() as conn:
        assert conn.default_channel.queue_purge(cc.node_queue("node-v")) == 1

    restarted = start_node("node-v", token)
    wait_for(
        "the node to register again",
        lambda: GpuNode.objects.get(name="node-v").registered_at != first_seen,
        30,
        restarted,
        plane,
    )
    assert JobAttempt.objects.get(job__public_id=job_id).claimed_at is None
    settings.TRAINHUB_DISPATCH_RESEND_SECONDS = 0
    assert attempts_resend_unclaimed() == 1  # what beat's fleet tick does
    wait_for(
        "the job to succeed", lambda: _status_is(job_id, "succeeded"), TRAIN_TIMEOUT, restarted
    )
    assert JobAttempt.objects.filter(job__public_id=job_id).count() == 1


def _executors_of(job_id: str, node: Process) -> list[int]:
    """Pids of the job's live executor processes, as the node's log names them ("starting
    attempt N of <job> (warm start, pid P)": a warm executor's command line names no job)."""
    started = re.findall(
        rf"starting attempt \d+ of {job_id} \(\w+ start, pid (\d+)\)", node.tail(10**6)
    )
    return [int(pid) for pid in started if _alive(int(pid))]


def _alive(pid: int) -> bool:
    """Running, not a zombie waiting for a parent that was killed."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


def test_jobs_go_only_to_a_node_whose_labels_fit_and_others_wait_saying_why(
    plane, start_node, api, demo_dataset, tiny_model_dir
) -> None:
    us = start_node("node-us", _node("node-us"), TRAINHUB_NODE_LABELS="region=us-east,tier=spot")
    eu = start_node("node-eu", _node("node-eu"), TRAINHUB_NODE_LABELS="region=eu-west")
    _wait_idle("node-us", us, plane)
    _wait_idle("node-eu", eu, plane)
    assert GpuNode.objects.get(name="node-eu").labels == {"region": "eu-west"}

    fits = submit_tiny_job(api, tiny_model_dir, demo_dataset, node_selector={"region": "eu-*"})
    nothing = submit_tiny_job(
        api, tiny_model_dir, demo_dataset, gpu={"count": 1, "min_vram_gb": 40}
    )
    wait_for(
        "the eu job to succeed", lambda: _status_is(fits, "succeeded"), TRAIN_TIMEOUT, eu, plane
    )
    assert JobAttempt.objects.get(job__public_id=fits).node_name == "node-eu"

    # The GPU job fits neither CPU node: it stays queued, and says why, once.
    job = api.get(f"/api/v1/jobs/{nothing}/").json()
    assert job["status"] == "queued"
    assert "No online node fits" in job["waiting_reason"]
    assert "node-us" not in job["waiting_reason"], "node names are the operator's"
    assert (
        "node-us has 0 GPU(s), the job needs 1"
        in TrainingJob.objects.get(public_id=nothing).waiting_reason
    ), "stored for operators (admin)"
    notes = [e for e in _events(nothing) if "No online node fits" in e.message]
    assert len(notes) == 1
    assert not JobAttempt.objects.filter(job__public_id=nothing).exists()


def test_drain_finishes_the_current_job_and_takes_no_new_one(
    plane, start_node, api, demo_dataset, tiny_model_dir, make_user, make_client
) -> None:
    admin = make_client(make_user("root", is_staff=True, is_superuser=True))
    node = start_node("node-d", _node("node-d"))
    _wait_idle("node-d", node, plane)
    first = submit_tiny_job(api, tiny_model_dir, demo_dataset)
    wait_for("the job to start", lambda: _status_is(first, "running"), TRAIN_TIMEOUT, node, plane)

    drained = admin.post("/api/v1/nodes/node-d/drain/")
    assert drained.status_code == 200, drained.content
    assert drained.json()["status"] == "draining"
    second = submit_tiny_job(api, tiny_model_dir, demo_dataset)
    wait_for(
        "the first job to succeed", lambda: _status_is(first, "succeeded"), TRAIN_TIMEOUT, node
    )
    assert _node_status("node-d") == "draining"
    assert _job(second).status == "queued"
    assert "node-d (draining)" in _job(second).waiting_reason

    admin.post("/api/v1/nodes/node-d/undrain/")
    wait_for(
        "the second job to succeed", lambda: _status_is(second, "succeeded"), TRAIN_TIMEOUT, node
    )
    kinds = list(
        NodeEvent.objects.filter(node_name="node-d").order_by("id").values_list("kind", flat=True)
    )
    assert kinds[:3] == ["created", "registered", "drain"] and "undrain" in kinds


def test_an_ephemeral_node_exits_after_one_job(
    plane, start_node, api, demo_dataset, tiny_model_dir
) -> None:
    node = start_node("node-e", _node("node-e"), TRAINHUB_NODE_EPHEMERAL="1")
    _wait_idle("node-e", node, plane)
    assert GpuNode.objects.get(name="node-e").ephemeral
    job_id = submit_tiny_job(api, tiny_model_dir, demo_dataset)
    wait_for("the job to succeed", lambda: _status_is(job_id, "succeeded"), TRAIN_TIMEOUT, node)
    wait_for("the node to exit", lambda: not node.alive(), 30, node)
    wait_for("the node to be offline", lambda: _node_status("node-e") == "offline", 10, plane)


def test_a_rotated_token_is_refused_at_once(plane, start_node, make_user, make_client) -> None:
    admin = make_client(make_user("root", is_staff=True, is_superuser=True))
    created = admin.post("/api/v1/nodes/", {"name": "node-r"}, format="json")
    assert created.status_code == 201, created.content
    old = created.json()["token"]
    node = start_node("node-r", old)
    _wait_idle("node-r", node, plane)

    rotated = admin.post("/api/v1/nodes/node-r/rotate-token/")
    assert rotated.status_code == 200
    new = rotated.json()["token"]
    assert new != old and "token" not in admin.get("/api/v1/nodes/node-r/").json()
    # The running node still speaks with the old token: its heartbeats are refused (401) from
    # now on, and its broker connection is closed and cannot log in again; restarted with the
    # new token it is back.
    wait_for("a heartbeat to be refused", lambda: "401" in node.tail(20000), 20, node)
    refused = "invalid username-password pair"  # redis-py's words for Redis' WRONGPASS
    wait_for("the broker to refuse it", lambda: refused in node.tail(50000), 30, node)
    seen = GpuNode.objects.get(name="node-r").last_heartbeat_at
    time.sleep(2.5)  # two more heartbeats
    assert GpuNode.objects.get(name="node-r").last_heartbeat_at == seen
    node.stop()
    fresh = start_node("node-r", new)
    wait_for(
        "a heartbeat with the new token",
        lambda: GpuNode.objects.get(name="node-r").last_heartbeat_at != seen,
        30,
        fresh,
        plane,
    )
    kinds = set(NodeEvent.objects.filter(node_name="node-r").values_list("kind", flat=True))
    assert {"created", "registered", "token_rotated"} <= kinds
