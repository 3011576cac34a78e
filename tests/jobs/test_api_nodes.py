"""GPU node API: the operators' registry (staff only), the nodes' claim call, and the jobs
API's placement fields (``gpu``, ``node_selector``, ``waiting_reason``)."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from jobs.models import GpuNode, JobAttempt, NodeEvent, TrainingJob
from jobs.services import dispatch, nodes
from tests.jobs._api import assert_error, assert_list, assert_unix_seconds

NODES = "/api/v1/nodes/"
CLAIM = "/api/v1/node-claims/"
JOBS = "/api/v1/jobs/"
NODE_KEYS = {
    "id", "object", "status", "draining", "ephemeral", "labels", "capabilities", "current_job",
    "current_attempt", "last_heartbeat_at", "registered_at", "created_at",
}  # fmt: skip
H100 = {"name": "NVIDIA H100 80GB HBM3", "vram_mb": 81559}


# --- helpers ----------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _no_broker(sent) -> None:
    """Every send_task is recorded, never sent."""


@pytest.fixture
def admin(make_user, make_client) -> APIClient:
    return make_client(make_user("root", is_staff=True))


def _online(name: str, **labels: str) -> str:
    """A node created, registered and idle; returns its token."""
    _, token = nodes.node_create(name=name, actor="ops")
    report = {"capabilities": {"gpus": [H100]}, "labels": labels, "celery_hostname": f"n@{name}"}
    nodes.node_register(name=name, token=token, report=report)
    return token


def _node(name: str) -> GpuNode:
    return GpuNode.objects.get(name=name)


def _event_kinds(client: APIClient, name: str) -> list[str]:
    return [e["kind"] for e in assert_list(client.get(f"{NODES}{name}/events/"))]


@pytest.fixture
def placed(make_job) -> tuple[str, str]:
    """Job placed on idle node gpu-a, not claimed yet; returns (job id, node token)."""
    token = _online("gpu-a")
    job = make_job()
    assert dispatch.dispatch_queued() == 1
    return job.public_id, token


def _claim(token: str | None, body: Any, *, scheme: str = "Bearer", **kwargs: Any):
    client = APIClient()
    if token is not None:
        client.credentials(HTTP_AUTHORIZATION=f"{scheme} {token}")
    return client.post(CLAIM, body, **({"format": "json"} | kwargs))


# --- staff only -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("get", NODES),
        ("post", NODES),
        ("get", f"{NODES}gpu-a/"),
        ("delete", f"{NODES}gpu-a/"),
        ("post", f"{NODES}gpu-a/drain/"),
        ("post", f"{NODES}gpu-a/undrain/"),
        ("post", f"{NODES}gpu-a/rotate-token/"),
        ("get", f"{NODES}gpu-a/events/"),
    ],
)
def test_a_non_staff_key_is_refused_on_every_node_endpoint(api, method, path) -> None:
    _, token = nodes.node_create(name="gpu-a")

    response = getattr(api, method)(path, {"name": "gpu-b"}, format="json")

    error = assert_error(response, 403)
    assert error["type"] == "permission_error"
    node = _node("gpu-a")
    assert not node.draining and nodes.node_authenticate(name="gpu-a", token=token) == node
    assert list(GpuNode.objects.values_list("name", flat=True)) == ["gpu-a"]


# --- registry ---------------------------------------------------------------------------------


def test_create_shows_the_token_once_and_never_again(admin) -> None:
    created = admin.post(NODES, {"name": "gpu-a"}, format="json")

    assert created.status_code == 201, created.content
    body = created.json()
    assert set(body) == NODE_KEYS | {"token"}
    assert body["id"] == "gpu-a" and body["object"] == "gpu_node"
    assert (body["status"], body["current_job"], body["last_heartbeat_at"]) == (
        "offline",
        None,
        None,
    )
    assert_unix_seconds(body["created_at"])
    token = body["token"]
    assert token.startswith("thn-")
    assert nodes.node_authenticate(name="gpu-a", token=token) == _node("gpu-a")

    detail = admin.get(f"{NODES}gpu-a/")
    assert detail.status_code == 200
    assert set(detail.json()) == NODE_KEYS
    listed = assert_list(admin.get(NODES))
    assert [n["id"] for n in listed] == ["gpu-a"] and set(listed[0]) == NODE_KEYS
    for response in (detail, admin.get(NODES), admin.get(f"{NODES}gpu-a/events/")):
        assert token[4:].encode() not in response.content


def test_create_of_an_existing_name_is_409(admin) -> None:
    assert admin.post(NODES, {"name": "gpu-a"}, format="json").status_code == 201
    assert_error(admin.post(NODES, {"name": "gpu-a"}, format="json"), 409, code="node_exists")
    assert GpuNode.objects.count() == 1


@pytest.mark.parametrize(
    "body",
    [{}, {"name": ""}, {"name": "-lead"}, {"name": "has space"}, {"name": "gpu/a"},
     {"name": "a" * 101}, {"name": 5}, {"name": ["gpu-a"]}],
)  # fmt: skip
def test_create_with_a_bad_name_is_400_naming_it(admin, body) -> None:
    error = assert_error(admin.post(NODES, body, format="json"), 400, param="name")
    assert "letters, digits" in error["message"]
    assert GpuNode.objects.count() == 0


def test_every_node_name_accepted_can_be_read_and_deleted(admin) -> None:
    created = admin.post(NODES, {"name": "claim"}, format="json")
    if created.status_code != 201:  # refusing the reserved name is a fine answer too
        assert_error(created, 400, param="name")
        return
    assert admin.get(f"{NODES}claim/").status_code == 200
    assert admin.delete(f"{NODES}claim/").status_code == 200


def test_detail_shows_the_current_job(admin, placed) -> None:
    job_id, _ = placed
    node = admin.get(f"{NODES}gpu-a/").json()
    assert (node["status"], node["current_job"], node["current_attempt"]) == ("busy", job_id, 1)
    assert node["capabilities"]["gpus"] == [H100]
    assert_unix_seconds(node["last_heartbeat_at"])
    assert_unix_seconds(node["registered_at"])


def test_drain_and_undrain(admin) -> None:
    _online("gpu-a")

    drained = admin.post(f"{NODES}gpu-a/drain/")
    assert drained.status_code == 200, drained.content
    assert (drained.json()["status"], drained.json()["draining"]) == ("draining", True)
    undrained = admin.post(f"{NODES}gpu-a/undrain/")
    assert undrained.status_code == 200
    assert (undrained.json()["status"], undrained.json()["draining"]) == ("idle", False)

    events = assert_list(admin.get(f"{NODES}gpu-a/events/"))
    assert [(e["kind"], e["actor"]) for e in events[:2]] == [("undrain", "root"), ("drain", "root")]


def test_rotate_token_returns_a_new_token_and_the_old_one_is_refused(admin) -> None:
    old = admin.post(NODES, {"name": "gpu-a"}, format="json").json()["token"]

    rotated = admin.post(f"{NODES}gpu-a/rotate-token/")

    assert rotated.status_code == 200, rotated.content
    new = rotated.json()["token"]
    assert new.startswith("thn-") and new != old
    assert nodes.node_authenticate(name="gpu-a", token=old) is None
    assert nodes.node_authenticate(name="gpu-a", token=new) == _node("gpu-a")
    assert "token" not in admin.get(f"{NODES}gpu-a/").json()
    assert _event_kinds(admin, "gpu-a")[0] == "token_rotated"


def test_delete_of_an_online_node_is_409(admin) -> None:
    _online("gpu-a")
    admin.post(f"{NODES}gpu-a/drain/")

    error = assert_error(admin.delete(f"{NODES}gpu-a/"), 409, code="node_not_offline")

    assert "draining" in error["message"]
    assert GpuNode.objects.filter(name="gpu-a").exists()


def test_delete_of_an_offline_node_removes_it_and_keeps_its_events(admin) -> None:
    token = _online("gpu-a")
    nodes.node_stopping(name="gpu-a", token=token)

    deleted = admin.delete(f"{NODES}gpu-a/")

    assert deleted.status_code == 200, deleted.content
    assert deleted.json() == {"id": "gpu-a", "object": "gpu_node", "deleted": True}
    assert_error(admin.get(f"{NODES}gpu-a/"), 404, code="node_not_found")
    events = assert_list(admin.get(f"{NODES}gpu-a/events/"))
    assert [e["kind"] for e in events] == ["deleted", "offline", "registered", "created"]
    assert events[0] == {
        "object": "gpu_node.event",
        "node": "gpu-a",
        "kind": "deleted",
        "message": events[0]["message"],
        "actor": "root",
        "created_at": events[0]["created_at"],
    }
    assert events[-1]["actor"] == "ops"
    assert NodeEvent.objects.filter(node_name="gpu-a").count() == 4


@pytest.mark.parametrize(
    ("method", "suffix"),
    [("get", ""), ("delete", ""), ("post", "drain/"), ("post", "undrain/"),
     ("post", "rotate-token/")],
)  # fmt: skip
def test_an_unknown_node_is_404(admin, method, suffix) -> None:
    response = getattr(admin, method)(f"{NODES}no-such-node/{suffix}")
    error = assert_error(response, 404, code="node_not_found")
    assert "no-such-node" in error["message"]
    assert not NodeEvent.objects.exists()


# --- claim ------------------------------------------------------------------------------------


def test_claim_is_200_once_then_409(placed) -> None:
    job_id, token = placed
    body = {"node": "gpu-a", "job_id": job_id, "attempt": 1}

    first = _claim(token, body)
    assert first.status_code == 200, first.content
    assert first.json() == {"claimed": True}
    assert JobAttempt.objects.get(job__public_id=job_id).claimed_at is not None

    assert_error(_claim(token, body), 409, code="attempt_not_claimable")


@pytest.mark.parametrize(
    "case", ["missing", "wrong-token", "other-nodes-token", "not-bearer", "node-not-named"]
)
def test_claim_without_the_nodes_token_is_401(placed, case) -> None:
    job_id, token = placed
    other = _online("gpu-b")
    body = {"node": "gpu-a", "job_id": job_id, "attempt": 1}
    response = {
        "missing": lambda: _claim(None, body),
        "wrong-token": lambda: _claim("thn-guess", body),
        "other-nodes-token": lambda: _claim(other, body),
        "not-bearer": lambda: _claim(token, body, scheme="Token"),
        "node-not-named": lambda: _claim(token, {"job_id": job_id, "attempt": 1}),
    }[case]()

    error = assert_error(response, 401, code="invalid_node_token")
    assert token[4:] not in error["message"]
    assert JobAttempt.objects.get(job__public_id=job_id).claimed_at is None


def test_claim_of_a_cancelled_attempt_is_409(api, placed) -> None:
    job_id, token = placed
    assert api.post(f"{JOBS}{job_id}/cancel/").json()["status"] == "cancelled"
    response = _claim(token, {"node": "gpu-a", "job_id": job_id, "attempt": 1})
    assert_error(response, 409, code="attempt_not_claimable")


@pytest.mark.parametrize("raw", ["not json", '{"node": ', "[1, 2]", '"gpu-a"', "null"])
def test_claim_with_a_body_that_is_not_a_json_object_is_400(placed, raw) -> None:
    _, token = placed
    response = _claim(token, raw, format=None, content_type="application/json")
    assert_error(response, 400)


# --- jobs: placement fields -------------------------------------------------------------------


def _create_job(api: APIClient, file_id: str, **extra: Any):
    body = {"model": "acme/tiny-llama", "training_file": file_id, **extra}
    return api.post(JOBS, body, format="json")


def test_job_create_accepts_gpu_and_node_selector_and_echoes_them(api, make_file) -> None:
    gpu = {"count": 2, "min_vram_gb": 40, "name": "*H100*"}
    selector = {"region": "eu-*", "tier": "spot"}

    created = _create_job(api, make_file().public_id, gpu=gpu, node_selector=selector)

    assert created.status_code == 201, created.content
    job = created.json()
    assert (job["gpu"], job["node_selector"], job["waiting_reason"]) == (gpu, selector, None)
    assert api.get(f"{JOBS}{job['id']}/").json()["gpu"] == gpu
    stored = TrainingJob.objects.get(public_id=job["id"])
    assert (stored.gpu, stored.node_selector) == (gpu, selector)


def test_job_create_normalises_a_gpu_name_to_one_gpu(api, make_file) -> None:
    created = _create_job(api, make_file().public_id, gpu={"name": "*A100*"})
    assert created.status_code == 201, created.content
    assert created.json()["gpu"] == {"name": "*A100*", "count": 1}


def test_job_create_without_placement_fields_has_empty_ones(api, make_file) -> None:
    job = _create_job(api, make_file().public_id).json()
    assert (job["gpu"], job["node_selector"]) == ({}, {})


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"gpu": "H100"}, "gpu"),
        ({"gpu": {"vram": 24}}, "gpu"),
        ({"gpu": {"count": "2"}}, "gpu.count"),
        ({"gpu": {"count": -1}}, "gpu.count"),
        ({"gpu": {"count": 65}}, "gpu.count"),
        ({"gpu": {"count": True}}, "gpu.count"),
        ({"gpu": {"min_vram_gb": 0}}, "gpu.min_vram_gb"),
        ({"gpu": {"min_vram_gb": "24"}}, "gpu.min_vram_gb"),
        ({"gpu": {"name": ""}}, "gpu.name"),
        ({"node_selector": ["region=eu"]}, "node_selector"),
        ({"node_selector": {"region": 5}}, "node_selector.region"),
        ({"node_selector": {"region": ""}}, "node_selector.region"),
        ({"node_selector": {"region": "eu\n"}}, "node_selector.region"),
        ({"node_selector": {"bad key": "x"}}, "node_selector"),
        ({"node_selector": {f"k{i}": "x" for i in range(17)}}, "node_selector"),
    ],
)
def test_job_create_with_bad_placement_is_400_naming_the_param(
    api, make_file, change, param
) -> None:
    response = _create_job(api, make_file().public_id, **change)
    error = assert_error(response, 400, param=param, code="invalid_value")
    assert error["type"] == "invalid_request_error"
    assert TrainingJob.objects.count() == 0


def test_a_waiting_job_shows_why(api, make_file) -> None:
    _online("gpu-a")
    first = _create_job(api, make_file().public_id).json()["id"]
    second = _create_job(api, make_file().public_id).json()["id"]

    dispatch.dispatch_queued()

    assert api.get(f"{JOBS}{first}/").json()["waiting_reason"] is None
    job = api.get(f"{JOBS}{second}/").json()
    assert job["status"] == "queued"
    assert (
        job["waiting_reason"] == "Waiting for a node: every node that fits is busy: gpu-a (busy)."
    )
