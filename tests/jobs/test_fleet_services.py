"""The own GPU fleet's services: placement, node identity and status, dispatch, claim, cancel,
node-authenticated executor events, re-sends and what an attempt's end does to its node.

Real database; Celery messages are recorded (``sent``, ``broadcasts``), never sent.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, NamedTuple
from urllib.parse import parse_qs, urlsplit

import pytest
from django.core import signing
from django.utils import timezone

from gpu_worker import celery_conf as cc
from gpu_worker.spec import parse_job_spec
from jobs import storage
from jobs.errors import InvalidRequest
from jobs.gpu_needs import misfit, parse_gpu
from jobs.models import GpuNode, JobAttempt, JobEvent, NodeEvent, TrainingJob
from jobs.services import dispatch, nodes, specs
from jobs.services.attempts import (
    attempt_end,
    attempt_record_events,
    attempt_start,
    attempts_expire_leases,
)
from jobs.services.jobs import job_cancel
from jobs.states import EndReason, JobStatus
from jobs.storage import transfer
from tests.factories import GpuNodeFactory

pytestmark = pytest.mark.django_db
S = JobStatus
N = GpuNode.Status

# As nvidia-smi reports them (memory.total in MiB).
H100 = {"name": "NVIDIA H100 80GB HBM3", "vram_mb": 81559}
A100_40 = {"name": "NVIDIA A100-SXM4-40GB", "vram_mb": 40960}
RTX_24 = {"name": "NVIDIA GeForce RTX 3090", "vram_mb": 24576}
T4 = {"name": "Tesla T4", "vram_mb": 15360}


# --- helpers ----------------------------------------------------------------------------------


@dataclass
class Broadcasts:
    """What ``app.control.broadcast`` was asked to send (nothing reaches Redis)."""

    calls: list[dict[str, Any]] = field(default_factory=list)

    def __call__(self, command: str, arguments: Any = None, destination: Any = None, **_: Any):
        self.calls.append({"command": command, "arguments": arguments, "destination": destination})


@pytest.fixture
def broadcasts(monkeypatch) -> Broadcasts:
    from trainhub.celery import app

    recorder = Broadcasts()
    monkeypatch.setattr(app.control, "broadcast", recorder)
    return recorder


def _machine(*gpus: dict, **labels: str) -> GpuNode:
    """An unsaved node as misfit sees it."""
    return GpuNodeFactory.build(
        name="m", capabilities={"gpu_count": len(gpus), "gpus": list(gpus)}, labels=labels
    )


def _report(gpus: tuple[dict, ...] = (), labels: dict | None = None, **extra: Any) -> dict:
    return {
        "capabilities": {
            "gpus": [dict(g) for g in gpus],
            "gpu_count": len(gpus),
            "backend": "peft",
        },
        "labels": labels or {},
        **extra,
    }


def _online(name: str, *gpus: dict, **labels: str) -> tuple[GpuNode, str]:
    """A node created, registered and idle; returns it with its token."""
    node, token = nodes.node_create(name=name, actor="ops")
    nodes.node_register(
        name=name, token=token, report=_report(gpus, labels, celery_hostname=f"node@{name}")
    )
    node.refresh_from_db()
    assert node.status == N.IDLE
    return node, token


def _fresh(obj):
    obj.refresh_from_db()
    return obj


def _node_status(node: GpuNode) -> str:
    return GpuNode.objects.values_list("status", flat=True).get(pk=node.pk)


def _attempt_of(job: TrainingJob, number: int = 1) -> JobAttempt:
    return JobAttempt.objects.get(job=job, number=number)


def _run_messages(sent) -> list[tuple[str | None, dict[str, Any]]]:
    """(queue, message) of every run_attempt sent."""
    return [
        (queue, args[0])
        for (name, args), queue in zip(sent.calls, sent.queues, strict=True)
        if name == cc.RUN_ATTEMPT
    ]


def _grant(url: str) -> dict[str, Any]:
    """What a signed transfer URL allows (key, method, expiry, size cap)."""
    token = parse_qs(urlsplit(url).query)["t"][0]
    return signing.loads(token, salt=transfer.SALT)


def _waiting_notes(job: TrainingJob, text: str) -> int:
    return JobEvent.objects.filter(job=job, type="log", message__contains=text).count()


def _backdate(attempt: JobAttempt, seconds: int) -> None:
    JobAttempt.objects.filter(pk=attempt.pk).update(
        created_at=timezone.now() - timedelta(seconds=seconds)
    )


def _expire(attempt: JobAttempt) -> None:
    JobAttempt.objects.filter(pk=attempt.pk).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1)
    )


def _log(seq: int) -> dict:
    return {"seq": seq, "type": "log", "message": f"line {seq}"}


@pytest.fixture
def dispatch_now(django_capture_on_commit_callbacks, sent):
    """One dispatcher pass, with its on-commit sends run (and recorded by ``sent``)."""

    def run() -> int:
        with django_capture_on_commit_callbacks(execute=True):
            return dispatch.dispatch_queued()

    return run


class Placed(NamedTuple):
    job: TrainingJob
    attempt: JobAttempt
    node: GpuNode
    token: str


@pytest.fixture
def placed(make_job, dispatch_now) -> Placed:
    """A queued job placed on idle node gpu-a (attempt 1 sent, not claimed yet)."""
    node, token = _online("gpu-a", H100)
    job = make_job()
    assert dispatch_now() == 1
    return Placed(_fresh(job), _attempt_of(job), _fresh(node), token)


@pytest.fixture
def claimed(placed) -> Placed:
    assert dispatch.attempt_claim(node=placed.node, job_id=placed.job.public_id, attempt_number=1)
    return placed


# --- placement: misfit, parse_gpu ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("gpu", "selector", "node", "why"),
    [
        pytest.param({}, {}, _machine(), None, id="no-needs-fit-a-cpu-node"),
        pytest.param({"count": 1}, {}, _machine(), "has 0 GPU(s), the job needs 1", id="cpu-node"),
        pytest.param({"count": 2}, {}, _machine(H100), "has 1 GPU(s), the job needs 2", id="count"),
        pytest.param({"count": 2}, {}, _machine(H100, H100), None, id="count-met"),
        # vram_mb is MiB, min_vram_gb is GB: 24576 MiB and 40960 MiB meet 24 and 40.
        pytest.param({"count": 1, "min_vram_gb": 24}, {}, _machine(RTX_24), None, id="vram-24"),
        pytest.param({"count": 1, "min_vram_gb": 40}, {}, _machine(A100_40), None, id="vram-40"),
        pytest.param(
            {"count": 1, "min_vram_gb": 24}, {}, _machine(T4), "the job needs 24 GB", id="vram-low"
        ),
        # Per GPU, never summed: two 40 GB GPUs are not one 80 GB GPU.
        pytest.param(
            {"count": 1, "min_vram_gb": 80},
            {},
            _machine(A100_40, A100_40),
            "the job needs 80 GB",
            id="vram-per-gpu",
        ),
        pytest.param(
            {"count": 2, "min_vram_gb": 40}, {}, _machine(A100_40, A100_40), None, id="vram-each"
        ),
        pytest.param({"count": 1, "name": "*H100*"}, {}, _machine(H100), None, id="name-glob"),
        pytest.param(
            {"count": 1, "name": "*H100*"},
            {},
            _machine(T4),
            "has Tesla T4, the job needs *H100*",
            id="name-glob-miss",
        ),
        pytest.param({}, {"region": "eu-*"}, _machine(), "has no label region", id="label-missing"),
        pytest.param(
            {},
            {"region": "eu-*"},
            _machine(region="us-east"),
            "label region=us-east does not match eu-*",
            id="label-mismatch",
        ),
        pytest.param({}, {"region": "eu-*"}, _machine(region="eu-west"), None, id="label-glob"),
        pytest.param(
            {},
            {"region": "eu-*", "tier": "spot"},
            _machine(region="eu-west"),
            "has no label tier",
            id="every-label-needed",
        ),
    ],
)
def test_misfit_says_why_a_node_cannot_run_a_job(gpu, selector, node, why) -> None:
    found = misfit(gpu, selector, node)
    if why is None:
        assert found is None
    else:
        assert found is not None and why in found, found


def test_an_80gb_h100_satisfies_min_vram_gb_80() -> None:
    assert misfit({"count": 1, "min_vram_gb": 80}, {}, _machine(H100)) is None


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (None, {}),
        ({}, {}),
        ({"count": 0}, {"count": 0}),
        ({"name": "*H100*"}, {"name": "*H100*", "count": 1}),
        ({"min_vram_gb": 24}, {"min_vram_gb": 24, "count": 1}),
        ({"min_vram_gb": 40.5, "count": 2}, {"min_vram_gb": 40.5, "count": 2}),
    ],
)
def test_parse_gpu_normalises_a_name_or_vram_without_count_to_one_gpu(given, expected) -> None:
    assert parse_gpu(given) == expected


@pytest.mark.parametrize(
    ("given", "param"),
    [
        ("H100", "gpu"),
        ([1], "gpu"),
        ({"gpus": 1}, "gpu"),
        ({"count": "2"}, "gpu.count"),
        ({"count": True}, "gpu.count"),
        ({"count": 1.5}, "gpu.count"),
        ({"count": -1}, "gpu.count"),
        ({"count": 65}, "gpu.count"),
        ({"min_vram_gb": 0}, "gpu.min_vram_gb"),
        ({"min_vram_gb": "24"}, "gpu.min_vram_gb"),
        ({"min_vram_gb": False}, "gpu.min_vram_gb"),
        ({"min_vram_gb": float("inf")}, "gpu.min_vram_gb"),
        ({"min_vram_gb": float("nan")}, "gpu.min_vram_gb"),
        ({"name": ""}, "gpu.name"),
        ({"name": 5}, "gpu.name"),
        ({"name": "H100\n"}, "gpu.name"),
    ],
)
def test_parse_gpu_names_the_bad_field(given, param) -> None:
    with pytest.raises(InvalidRequest) as raised:
        parse_gpu(given)
    assert raised.value.param == param


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

    assert _node_status(node) == N.IDLE
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
    node, _ = _online("gpu-a")

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
    assert _node_status(placed.node) == N.BUSY
    assert placed.node.current_attempt_id == placed.attempt.pk
    nodes.node_heartbeat(name="gpu-a", token=placed.token)
    assert _node_status(placed.node) == N.BUSY


def test_a_node_silent_for_the_offline_timeout_is_marked_offline(settings) -> None:
    settings.TRAINHUB_NODE_OFFLINE_SECONDS = 60
    silent, _ = _online("gpu-a")
    recent, _ = _online("gpu-b")
    now = timezone.now()
    GpuNode.objects.filter(pk=silent.pk).update(last_heartbeat_at=now - timedelta(seconds=61))
    GpuNode.objects.filter(pk=recent.pk).update(last_heartbeat_at=now - timedelta(seconds=50))

    assert nodes.nodes_mark_offline() == 1

    assert (_node_status(silent), _node_status(recent)) == (N.OFFLINE, N.IDLE)
    assert NodeEvent.objects.filter(node_name="gpu-a", kind="offline").count() == 1
    assert nodes.nodes_mark_offline() == 0, "an offline node is not marked again"


def test_a_node_that_says_it_is_stopping_is_offline_at_once() -> None:
    node, token = _online("gpu-a")
    nodes.node_stopping(name="gpu-a", token="thn-wrong")
    assert _node_status(node) == N.IDLE
    nodes.node_stopping(name="gpu-a", token=token)
    assert _node_status(node) == N.OFFLINE


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
    assert nodes.node_register(name="gpu-a", token="thn-x", report=_report((H100,))) is None
    node.refresh_from_db()
    assert (node.capabilities, node.status, node.registered_at) == ({}, N.OFFLINE, None)


# --- dispatch ---------------------------------------------------------------------------------


def test_a_local_job_entering_queued_sends_a_dispatch(
    make_job, django_capture_on_commit_callbacks, sent
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        job = make_job()
    assert job.status == S.QUEUED
    assert sent.named(cc.DISPATCH) == [[]]


def test_dispatch_places_the_highest_priority_then_the_oldest_job_first(
    make_job, dispatch_now
) -> None:
    _online("gpu-a")
    _online("gpu-b")
    low_old = make_job()
    high_old = make_job()
    high_new = make_job()
    TrainingJob.objects.filter(pk__in=[high_old.pk, high_new.pk]).update(priority=5)

    assert dispatch_now() == 2

    assert _attempt_of(high_old).node_name == "gpu-a"
    assert _attempt_of(high_new).node_name == "gpu-b"
    assert _fresh(low_old).status == S.QUEUED
    assert "every node that fits is busy" in low_old.waiting_reason


def test_dispatch_uses_only_an_idle_node_that_fits(make_job, dispatch_now) -> None:
    _online("a-cpu")
    _online("b-t4", T4)
    _online("c-h100", H100)
    job = make_job(gpu={"min_vram_gb": 40})

    assert dispatch_now() == 1

    assert _attempt_of(job).node_name == "c-h100"
    assert _fresh(job).status == S.PROVISIONING
    node = GpuNode.objects.get(name="c-h100")
    assert (node.status, node.current_attempt_id) == (N.BUSY, _attempt_of(job).pk)
    assert set(GpuNode.objects.filter(status=N.IDLE).values_list("name", flat=True)) == {
        "a-cpu",
        "b-t4",
    }


def test_dispatch_places_by_label_selector(make_job, dispatch_now) -> None:
    _online("a-us", region="us-east")
    _online("b-eu", region="eu-west")
    job = make_job(node_selector={"region": "eu-*"})
    assert dispatch_now() == 1
    assert _attempt_of(job).node_name == "b-eu"


def test_of_two_jobs_for_one_node_the_second_waits_naming_the_busy_node(
    make_job, dispatch_now
) -> None:
    _online("gpu-a")
    first, second = make_job(), make_job()

    assert dispatch_now() == 1

    assert _fresh(first).status == S.PROVISIONING and first.waiting_reason == ""
    second.refresh_from_db()
    assert second.status == S.QUEUED
    assert (
        second.waiting_reason == "Waiting for a node: every node that fits is busy: gpu-a (busy)."
    )
    assert _waiting_notes(second, "gpu-a (busy)") == 1
    assert not JobAttempt.objects.filter(job=second).exists()


def test_without_nodes_a_job_waits_saying_no_node_is_registered(make_job, dispatch_now) -> None:
    job = make_job()
    assert dispatch_now() == 0
    assert "no GPU node is registered" in _fresh(job).waiting_reason


def test_a_job_that_fits_no_online_node_says_why_per_node(make_job, dispatch_now) -> None:
    _online("a-cpu")
    _, token = _online("b-h100", H100)
    nodes.node_stopping(name="b-h100", token=token)
    job = make_job(gpu={"count": 1})

    assert dispatch_now() == 0

    assert _fresh(job).waiting_reason == (
        "No online node fits this job: a-cpu has 0 GPU(s), the job needs 1. "
        "Fitting but offline: b-h100."
    )


def test_the_waiting_reason_is_noted_once_not_on_every_pass(make_job, dispatch_now) -> None:
    job = make_job()
    for _ in range(3):
        dispatch_now()
    assert _waiting_notes(job, "no GPU node is registered") == 1

    _online("gpu-cpu")
    jumps_the_queue = make_job()
    TrainingJob.objects.filter(pk=jumps_the_queue.pk).update(priority=1)
    for _ in range(2):
        dispatch_now()
    assert _waiting_notes(job, "gpu-cpu (busy)") == 1
    assert _waiting_notes(job, "no GPU node is registered") == 1


def test_a_waiting_job_is_placed_when_a_node_turns_idle_and_its_reason_cleared(
    make_job, dispatch_now, django_capture_on_commit_callbacks, sent
) -> None:
    _, token = nodes.node_create(name="gpu-a")
    job = make_job()
    dispatch_now()
    assert "every GPU node is offline" in _fresh(job).waiting_reason

    with django_capture_on_commit_callbacks(execute=True):
        nodes.node_heartbeat(name="gpu-a", token=token)
    assert sent.named(cc.DISPATCH) == [[]]
    assert dispatch_now() == 1

    job.refresh_from_db()
    assert (job.status, job.waiting_reason) == (S.PROVISIONING, "")
    assert _attempt_of(job).node_name == "gpu-a"


def test_run_attempt_goes_to_the_nodes_queue_with_a_valid_spec(
    make_job, make_file, dispatch_now, sent, settings
) -> None:
    settings.TRAINHUB_CONTROL_URL = "https://plane.example/"
    _online("gpu-a", H100)
    job = make_job(validation_file=make_file().public_id, max_runtime_seconds=3600)

    dispatch_now()

    [(queue, message)] = _run_messages(sent)
    assert queue == "gpu.node.gpu-a"
    assert set(message) == {"spec", "claim_url"}
    assert message["claim_url"] == "https://plane.example/api/v1/node-claims/"
    spec = parse_job_spec(message["spec"])
    assert (spec.job_id, spec.attempt, spec.model) == (job.public_id, 1, "acme/tiny-llama")
    assert spec.max_runtime_seconds == 3600
    assert spec.dataset.sha256 == job.training_file.sha256
    assert spec.validation_dataset is not None
    assert spec.validation_dataset.sha256 == job.validation_file.sha256

    assert all(
        u.startswith("https://plane.example/transfer/?")
        for u in (spec.dataset.url, spec.outputs.artifact_url, spec.outputs.checkpoint_url)
    )
    dataset = _grant(spec.dataset.url)
    assert (dataset["key"], dataset["method"]) == (job.training_file.storage_key, "GET")
    artifact = _grant(spec.outputs.artifact_url)
    assert (artifact["key"], artifact["method"]) == (
        storage.bundle_key(job.project_id, job.public_id, 1),
        "PUT",
    )
    assert artifact["max_bytes"] > 0
    checkpoint = _grant(spec.outputs.checkpoint_url)
    assert (checkpoint["key"], checkpoint["method"]) == (
        storage.checkpoint_key(job.project_id, job.public_id),
        "PUT",
    )
    assert dataset["exp"] > timezone.now().timestamp() + 3600, "URLs outlive max_runtime"
    assert spec.outputs.resume_url is None, "no checkpoint yet"


def test_the_spec_resumes_from_the_jobs_checkpoint_once_it_exists(placed) -> None:
    job = placed.job
    key = storage.checkpoint_key(job.project_id, job.public_id)
    storage.save_stream(key, [b"a checkpoint bundle"])

    spec = parse_job_spec(specs.attempt_spec(placed.attempt))

    assert spec.outputs.resume_url is not None
    assert (_grant(spec.outputs.resume_url)["key"], _grant(spec.outputs.resume_url)["method"]) == (
        key,
        "GET",
    )


def test_a_job_cancelled_while_dispatch_runs_is_not_placed(
    make_job, dispatch_now, monkeypatch, sent
) -> None:
    _online("gpu-a")
    doomed, other = make_job(), make_job()
    real_misfit = dispatch.misfit

    def cancel_first(gpu, selector, n):  # the dispatcher has read the queue by now
        if TrainingJob.objects.filter(pk=doomed.pk, status=S.QUEUED).exists():
            job_cancel(job=doomed)
        return real_misfit(gpu, selector, n)

    monkeypatch.setattr(dispatch, "misfit", cancel_first)

    assert dispatch_now() == 1

    assert _fresh(doomed).status == S.CANCELLED
    assert not JobAttempt.objects.filter(job=doomed).exists()
    assert _attempt_of(other).node_name == "gpu-a", "the node went to the next job"
    assert [m["spec"]["job_id"] for _, m in _run_messages(sent)] == [other.public_id]


def test_a_draining_node_is_never_used(make_job, dispatch_now, sent) -> None:
    node, _ = _online("gpu-a")
    nodes.node_set_draining(node=node, draining=True)
    job = make_job()

    assert dispatch_now() == 0

    assert _fresh(job).status == S.QUEUED
    assert "gpu-a (draining)" in job.waiting_reason
    assert _run_messages(sent) == []
    assert _fresh(node).current_attempt_id is None


def test_an_ephemeral_node_is_not_given_a_second_job(make_job, dispatch_now) -> None:
    _, token = nodes.node_create(name="gpu-e")
    nodes.node_register(name="gpu-e", token=token, report=_report(ephemeral=True))
    first = make_job()
    assert dispatch_now() == 1
    attempt = _attempt_of(first)
    attempt_record_events(
        job_id=first.public_id,
        attempt_number=1,
        events=[{"seq": 1, "type": "error", "message": "CUDA OOM", "data": {"code": "oom"}}],
        node="gpu-e",
        token=token,
    )
    assert _fresh(attempt).ended_at is not None
    second = make_job()

    dispatch_now()

    assert not JobAttempt.objects.filter(job=second).exists()


def test_a_retired_ephemeral_node_comes_back_only_as_a_new_process(make_job, dispatch_now) -> None:
    """Its last heartbeats and re-registrations, sent while it shuts down, must not make it
    idle again; a restarted node (another worker process) is welcome."""
    _, token = nodes.node_create(name="gpu-r")
    report = _report(ephemeral=True, process="host:10:1")
    nodes.node_register(name="gpu-r", token=token, report=report)
    job = make_job()
    assert dispatch_now() == 1
    attempt_end(attempt=_attempt_of(job), reason=EndReason.SUCCEEDED)
    node = GpuNode.objects.get(name="gpu-r")
    assert (node.retired, node.status) == (True, N.OFFLINE)

    nodes.node_heartbeat(name="gpu-r", token=token)
    nodes.node_register(name="gpu-r", token=token, report=report)
    assert _node_status(node) == N.OFFLINE
    nodes.node_register(name="gpu-r", token=token, report={**report, "process": "host:11:2"})
    assert (_fresh(node).retired, node.status) == (False, N.IDLE)


# --- claim ------------------------------------------------------------------------------------


def test_a_node_claims_its_attempt_once(placed) -> None:
    job, attempt, node, _ = placed

    assert dispatch.attempt_claim(node=node, job_id=job.public_id, attempt_number=1) is True
    assert _fresh(attempt).claimed_at is not None
    assert dispatch.attempt_claim(node=node, job_id=job.public_id, attempt_number=1) is False


def test_another_node_cannot_claim_the_attempt(placed) -> None:
    other, _ = _online("gpu-b")
    assert (
        dispatch.attempt_claim(node=other, job_id=placed.job.public_id, attempt_number=1) is False
    )
    assert _fresh(placed.attempt).claimed_at is None
    assert dispatch.attempt_claim(node=placed.node, job_id=placed.job.public_id, attempt_number=1)


@pytest.mark.parametrize(
    ("job_id", "number"),
    [("ftjob-unknown", 1), (None, 1), ("JOB", 2), ("JOB", "1"), ("JOB", None)],
)
def test_a_claim_of_another_or_malformed_attempt_is_refused(placed, job_id, number) -> None:
    job_id = placed.job.public_id if job_id == "JOB" else job_id
    assert dispatch.attempt_claim(node=placed.node, job_id=job_id, attempt_number=number) is False
    assert _fresh(placed.attempt).claimed_at is None


def test_a_claim_after_the_attempt_ended_is_refused(placed) -> None:
    _expire(placed.attempt)
    assert attempts_expire_leases() == 1
    assert (
        dispatch.attempt_claim(node=placed.node, job_id=placed.job.public_id, attempt_number=1)
        is False
    )


def test_a_claim_after_cancel_is_refused(placed, broadcasts) -> None:
    job_cancel(job=placed.job)
    assert (
        dispatch.attempt_claim(node=placed.node, job_id=placed.job.public_id, attempt_number=1)
        is False
    )


# --- cancel -----------------------------------------------------------------------------------


def test_cancel_before_the_node_claimed_ends_the_attempt_and_frees_the_node(
    placed, broadcasts, django_capture_on_commit_callbacks, sent
) -> None:
    sent.clear()
    with django_capture_on_commit_callbacks(execute=True):
        job_cancel(job=placed.job)

    assert _fresh(placed.job).status == S.CANCELLED
    attempt = _fresh(placed.attempt)
    assert attempt.ended_at is not None and attempt.end_reason == "cancelled"
    node = _fresh(placed.node)
    assert (node.status, node.current_attempt_id) == (N.IDLE, None)
    assert broadcasts.calls == [], "nothing runs yet: nothing to stop"
    assert sent.named(cc.DISPATCH), "the freed node looks for the next job"


def test_cancel_of_a_claimed_attempt_broadcasts_a_stop_to_its_node(
    claimed, broadcasts, django_capture_on_commit_callbacks
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        job_cancel(job=claimed.job)

    assert _fresh(claimed.job).status == S.CANCELLING
    assert _fresh(claimed.attempt).ended_at is None
    assert _node_status(claimed.node) == N.BUSY
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
    assert _fresh(claimed.job).status == S.CANCELLED
    node = _fresh(claimed.node)
    assert (node.status, node.current_attempt_id) == (N.IDLE, None)


def test_resend_cancels_repeats_the_stop_until_the_job_is_cancelled(
    claimed, broadcasts, django_capture_on_commit_callbacks
) -> None:
    job_cancel(job=claimed.job)
    broadcasts.calls.clear()

    with django_capture_on_commit_callbacks(execute=True):  # beat's tick commits
        assert dispatch.attempts_resend_cancels() == 1
    assert broadcasts.calls == [
        {
            "command": cc.CANCEL_ATTEMPT_COMMAND,
            "arguments": {"job_id": claimed.job.public_id, "attempt": 1},
            "destination": ["node@gpu-a"],
        }
    ]

    _expire(claimed.attempt)
    attempts_expire_leases()
    assert _fresh(claimed.job).status == S.CANCELLED
    assert dispatch.attempts_resend_cancels() == 0
    assert len(broadcasts.calls) == 1


# --- executor events of a node attempt --------------------------------------------------------


@pytest.mark.parametrize("sender", ["no-token", "wrong-token", "other-node", "other-nodes-token"])
def test_events_of_a_node_attempt_without_its_nodes_token_are_dropped(placed, sender) -> None:
    _, other_token = _online("gpu-b")
    node, token = {
        "no-token": ("gpu-a", None),
        "wrong-token": ("gpu-a", "thn-guess"),
        "other-node": ("gpu-b", other_token),
        "other-nodes-token": ("gpu-a", other_token),
    }[sender]
    before = _fresh(placed.job).event_counter

    stored = attempt_record_events(
        job_id=placed.job.public_id,
        attempt_number=1,
        events=[_log(1), {"seq": 2, "type": "status", "data": {"status": "running"}}],
        node=node,
        token=token,
    )

    assert stored == 0
    job = _fresh(placed.job)
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
    assert _fresh(placed.job).status == S.RUNNING


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


# --- re-sending unclaimed attempts ------------------------------------------------------------


def test_resend_unclaimed_sends_only_old_unclaimed_live_local_attempts(
    make_job, dispatch_now, sent, settings, broadcasts, django_capture_on_commit_callbacks
) -> None:
    settings.TRAINHUB_DISPATCH_RESEND_SECONDS = 30
    for name in ("a-old", "b-fresh", "c-claimed", "d-ended"):
        _online(name)
    jobs = {name: make_job() for name in ("a-old", "b-fresh", "c-claimed", "d-ended")}
    assert dispatch_now() == 4
    by_node = {a.node_name: a for a in JobAttempt.objects.filter(target="local")}
    assert dispatch.attempt_claim(
        node=GpuNode.objects.get(name="c-claimed"),
        job_id=jobs["c-claimed"].public_id,
        attempt_number=1,
    )
    job_cancel(job=jobs["d-ended"])  # unclaimed: ends at once
    cloud = attempt_start(job=make_job(), target="runpod")
    for attempt in (by_node["a-old"], by_node["c-claimed"], by_node["d-ended"], cloud):
        _backdate(attempt, 31)
    _backdate(by_node["b-fresh"], 25)
    sent.clear()

    with django_capture_on_commit_callbacks(execute=True):  # beat's tick commits
        assert dispatch.attempts_resend_unclaimed() == 1

    [(queue, message)] = _run_messages(sent)
    assert queue == "gpu.node.a-old"
    assert message["spec"]["job_id"] == jobs["a-old"].public_id
    assert len(sent.calls) == 1


# --- attempt end and the node -----------------------------------------------------------------


def test_a_lost_attempt_frees_the_node_and_sends_a_dispatch(
    placed, django_capture_on_commit_callbacks, sent
) -> None:
    sent.clear()
    _expire(placed.attempt)
    with django_capture_on_commit_callbacks(execute=True):
        assert attempts_expire_leases() == 1

    node = _fresh(placed.node)
    assert (node.status, node.current_attempt_id) == (N.IDLE, None)
    assert _fresh(placed.job).status == S.QUEUED
    assert sent.named(cc.DISPATCH), "the requeued job and the free node meet again"


def test_the_nodes_next_job_is_attempt_two_of_the_requeued_job(placed, dispatch_now, sent) -> None:
    _expire(placed.attempt)
    attempts_expire_leases()
    sent.clear()

    assert dispatch_now() == 1

    second = _attempt_of(placed.job, 2)
    assert second.node_name == "gpu-a" and second.ended_at is None
    assert _fresh(placed.node).current_attempt_id == second.pk
    [(_, message)] = _run_messages(sent)
    assert (message["spec"]["job_id"], message["spec"]["attempt"]) == (placed.job.public_id, 2)
    assert (
        dispatch.attempt_claim(node=placed.node, job_id=placed.job.public_id, attempt_number=1)
        is False
    ), "the outdated attempt 1 stays refused"
    assert dispatch.attempt_claim(node=placed.node, job_id=placed.job.public_id, attempt_number=2)


def test_a_failure_reported_by_the_node_frees_it(claimed) -> None:
    attempt_record_events(
        job_id=claimed.job.public_id,
        attempt_number=1,
        events=[{"seq": 1, "type": "error", "message": "CUDA OOM", "data": {"code": "oom"}}],
        node="gpu-a",
        token=claimed.token,
    )
    job = _fresh(claimed.job)
    assert (job.status, job.error_code) == (S.FAILED, "oom")
    node = _fresh(claimed.node)
    assert (node.status, node.current_attempt_id) == (N.IDLE, None)
