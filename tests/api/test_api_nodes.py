"""GPU node API: the operators' registry (staff with the model permission), the calls nodes make
with their own token (claim, heartbeat) and the executor's events with its attempt's report
token, and the jobs API's placement fields (``gpu``, ``node_selector``, ``waiting_reason``)."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import Permission
from rest_framework.test import APIClient

from jobs.models import GpuNode, JobAttempt, JobEvent, NodeEvent, TrainingJob
from jobs.services.core.attempts import attempts_expire_leases
from jobs.services.fleet import nodes
from jobs.services.scheduling import dispatch
from tests.support.api import assert_error, assert_list, assert_unix_seconds
from tests.support.db import fresh
from tests.support.fleet import expire_lease

# Every send_task is recorded (``sent``), never sent.
pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("sent")]
NODES = "/api/v1/nodes/"
JOBS = "/api/v1/jobs/"
NODE_KEYS = {
    "id", "object", "status", "draining", "ephemeral", "labels", "capabilities", "cached_models",
    "models_reported_at", "current_job", "current_attempt", "last_heartbeat_at", "registered_at",
    "created_at",
}  # fmt: skip
H100 = {"name": "NVIDIA H100 80GB HBM3", "vram_mb": 81559}


# --- helpers ----------------------------------------------------------------------------------


@pytest.fixture
def admin(make_user, make_client) -> APIClient:
    """An operator holding every permission (a superuser)."""
    return make_client(make_user("root", is_staff=True, is_superuser=True))


def _online(name: str, **labels: str) -> str:
    """A node created, registered and idle; returns its token."""
    node, token = nodes.node_create(name=name, actor="ops")
    report = {"capabilities": {"gpus": [H100]}, "labels": labels, "celery_hostname": f"n@{name}"}
    nodes.node_register(node=node, report=report)
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


def _as_node(
    token: str | None, path: str, body: Any, *, scheme: str = "Bearer", **kwargs: Any
) -> Any:
    """POST ``/api/v1/nodes/<path>`` as a node (or an executor) would: its token, no session."""
    client = APIClient()
    if token is not None:
        client.credentials(HTTP_AUTHORIZATION=f"{scheme} {token}")
    return client.post(f"{NODES}{path}", body, **({"format": "json"} | kwargs))


def _claim(token: str | None, body: Any, *, node: str = "gpu-a", **kwargs: Any) -> Any:
    return _as_node(token, f"{node}/claim/", body, **kwargs)


def _heartbeat(token: str | None, body: Any = None, *, node: str = "gpu-a", **kwargs: Any) -> Any:
    return _as_node(token, f"{node}/heartbeat/", {} if body is None else body, **kwargs)


def _events_path(job_id: str, attempt: int = 1, node: str = "gpu-a") -> str:
    return f"{node}/attempts/{job_id}/{attempt}/events/"


# --- operators: staff with the model permission ------------------------------------------------

ENDPOINTS = [
    ("get", NODES, "view"),
    ("post", NODES, "add"),
    ("get", f"{NODES}gpu-a/", "view"),
    ("delete", f"{NODES}gpu-a/", "delete"),
    ("post", f"{NODES}gpu-a/drain/", "change"),
    ("post", f"{NODES}gpu-a/undrain/", "change"),
    ("post", f"{NODES}gpu-a/rotate-token/", "change"),
    ("get", f"{NODES}gpu-a/events/", "view"),
]


def _assert_nothing_changed(token: str) -> None:
    node = _node("gpu-a")
    assert not node.draining and nodes.node_authenticate(name="gpu-a", token=token) == node
    assert list(GpuNode.objects.values_list("name", flat=True)) == ["gpu-a"]
    assert list(NodeEvent.objects.values_list("kind", flat=True)) == ["created"]


@pytest.mark.parametrize(("method", "path", "verb"), ENDPOINTS)
def test_a_non_staff_key_is_refused_on_every_node_endpoint(api, method, path, verb) -> None:
    _, token = nodes.node_create(name="gpu-a")

    response = getattr(api, method)(path, {"name": "gpu-b"}, format="json")

    error = assert_error(response, 403)
    assert error["type"] == "permission_error"
    _assert_nothing_changed(token)


@pytest.mark.parametrize(("method", "path", "verb"), ENDPOINTS)
def test_a_staff_user_without_the_permission_is_refused(
    make_user, make_client, method, path, verb
) -> None:
    """Staff status alone is not enough: each call needs its ``jobs.<verb>_gpunode``. The user
    holds every other node permission, so the one missing is what refuses it."""
    _, token = nodes.node_create(name="gpu-a")
    staff = make_user("staff", is_staff=True)
    others = [v for v in ("view", "add", "change", "delete") if v != verb]
    staff.user_permissions.set(
        Permission.objects.filter(
            content_type__app_label="jobs", codename__in=[f"{v}_gpunode" for v in others]
        )
    )

    response = getattr(make_client(staff), method)(path, {"name": "gpu-b"}, format="json")

    error = assert_error(response, 403)
    assert error["type"] == "permission_error"
    _assert_nothing_changed(token)


@pytest.mark.parametrize(("method", "path", "verb"), ENDPOINTS)
def test_a_staff_user_with_the_permission_is_let_through(
    make_user, make_client, method, path, verb
) -> None:
    nodes.node_create(name="gpu-a")
    staff = make_user("staff", is_staff=True)
    staff.user_permissions.add(
        Permission.objects.get(content_type__app_label="jobs", codename=f"{verb}_gpunode")
    )

    response = getattr(make_client(staff), method)(path, {"name": "gpu-b"}, format="json")

    assert response.status_code in (200, 201), response.content


def test_the_permission_is_not_enough_without_staff_status(make_user, make_client) -> None:
    nodes.node_create(name="gpu-a")
    user = make_user("not-staff")
    user.user_permissions.set(Permission.objects.filter(codename__endswith="_gpunode"))

    assert_error(make_client(user).get(NODES), 403)
    assert_error(make_client(user).post(f"{NODES}gpu-a/drain/"), 403)
    assert not _node("gpu-a").draining


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
    _online("gpu-a")
    nodes.node_stopping(node=_node("gpu-a"))

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


def test_claim_is_200_once_with_the_spec_and_a_report_token_then_409(placed) -> None:
    job_id, token = placed
    body = {"job_id": job_id, "attempt": 1}

    first = _claim(token, body)
    assert first.status_code == 200, first.content
    answer = first.json()
    assert set(answer) == {"spec", "report_token"}
    assert (answer["spec"]["job_id"], answer["spec"]["attempt"]) == (job_id, 1)
    assert dispatch.attempt_for_report(
        node_name="gpu-a", job_id=job_id, attempt_number=1, token=answer["report_token"]
    )
    assert JobAttempt.objects.get(job__public_id=job_id).claimed_at is not None

    assert_error(_claim(token, body), 409, code="attempt_not_claimable")


@pytest.mark.parametrize(
    "case",
    ["missing", "wrong-token", "other-nodes-token", "not-bearer", "path-names-another-node",
     "unknown-node", "operators-api-key"],
)  # fmt: skip
def test_claim_without_the_nodes_token_is_401(placed, make_user, make_client, case) -> None:
    job_id, token = placed
    other = _online("gpu-b")
    body = {"job_id": job_id, "attempt": 1}
    response = {
        "missing": lambda: _claim(None, body),
        "wrong-token": lambda: _claim("thn-guess", body),
        "other-nodes-token": lambda: _claim(other, body),
        "not-bearer": lambda: _claim(token, body, scheme="Token"),
        "path-names-another-node": lambda: _claim(token, body, node="gpu-b"),
        "unknown-node": lambda: _claim(token, body, node="no-such-node"),
        # Only a node token speaks for a node: not even a superuser's API key.
        "operators-api-key": lambda: make_client(
            make_user("root", is_staff=True, is_superuser=True)
        ).post(f"{NODES}gpu-a/claim/", body, format="json"),
    }[case]()

    error = assert_error(response, 401, code="invalid_node_token")
    assert token[4:] not in error["message"]
    assert JobAttempt.objects.get(job__public_id=job_id).claimed_at is None


def test_another_node_cannot_claim_the_attempt_with_its_own_token(placed) -> None:
    job_id, _ = placed
    other = _online("gpu-b")
    response = _claim(other, {"job_id": job_id, "attempt": 1}, node="gpu-b")
    assert_error(response, 409, code="attempt_not_claimable")
    assert JobAttempt.objects.get(job__public_id=job_id).claimed_at is None


def test_claim_of_a_cancelled_attempt_is_409(api, placed) -> None:
    job_id, token = placed
    assert api.post(f"{JOBS}{job_id}/cancel/").json()["status"] == "cancelled"
    response = _claim(token, {"job_id": job_id, "attempt": 1})
    assert_error(response, 409, code="attempt_not_claimable")


@pytest.mark.parametrize("raw", ["not json", '{"job_id": ', "[1, 2]", '"gpu-a"', "null"])
def test_claim_with_a_body_that_is_not_a_json_object_is_400(placed, raw) -> None:
    job_id, token = placed
    response = _claim(token, raw, format=None, content_type="application/json")
    assert_error(response, 400)
    assert JobAttempt.objects.get(job__public_id=job_id).claimed_at is None


# --- heartbeat: alive, registration, goodbye, and the cancels it answers -----------------------


def test_a_heartbeat_brings_a_node_idle_and_answers_no_cancel() -> None:
    _, token = nodes.node_create(name="gpu-a")

    response = _heartbeat(token)

    assert response.status_code == 200, response.content
    assert response.json() == {"cancel": []}
    node = _node("gpu-a")
    assert node.status == "idle" and node.last_heartbeat_at is not None


def test_a_heartbeat_with_a_registration_stores_it() -> None:
    _, token = nodes.node_create(name="gpu-a")
    registration = {"capabilities": {"gpus": [H100], "backend": "unsloth"},
                    "labels": {"region": "eu"}, "process": "host:1:2"}  # fmt: skip

    response = _heartbeat(token, {"registration": registration})

    assert response.status_code == 200, response.content
    node = _node("gpu-a")
    assert node.capabilities == {"gpu_count": 1, "gpus": [H100], "backend": "unsloth"}
    assert (node.labels, node.status) == ({"region": "eu"}, "idle")
    assert node.registered_at is not None


def test_a_goodbye_takes_the_node_offline_at_once() -> None:
    token = _online("gpu-a")
    response = _heartbeat(token, {"stopping": True})
    assert response.status_code == 200, response.content
    node = _node("gpu-a")
    assert node.status == "offline"
    assert node.last_heartbeat_at is not None, "when it was last seen stays"


@pytest.mark.parametrize(
    "body", [{}, {"registration": {"capabilities": {"gpus": [H100]}}}, {"stopping": True}]
)
@pytest.mark.parametrize("case", ["missing", "wrong-token", "other-nodes-token", "not-bearer"])
def test_a_heartbeat_without_the_nodes_token_is_401_and_changes_nothing(body, case) -> None:
    _, token = nodes.node_create(name="gpu-a")
    other = _online("gpu-b")
    nodes.node_create(name="gpu-c")
    nodes.node_heartbeat(node=_node("gpu-c"))  # online: a forged goodbye must not end that
    sender = {"missing": None, "wrong-token": "thn-guess", "other-nodes-token": other,
              "not-bearer": token}[case]  # fmt: skip
    scheme = "Token" if case == "not-bearer" else "Bearer"

    for name in ("gpu-a", "gpu-c"):
        response = _heartbeat(sender, body, node=name, scheme=scheme)
        assert_error(response, 401, code="invalid_node_token")

    node = _node("gpu-a")
    assert (node.status, node.last_heartbeat_at, node.capabilities) == ("offline", None, {})
    assert node.registered_at is None
    assert _node("gpu-c").status == "idle"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"registration": "8x H100"}, "registration"),
        ({"registration": [1]}, "registration"),
        ({"running": "ftjob-x"}, "running"),
        ({"running": ["ftjob-x"]}, "running"),
        ({"running": ["ftjob-x", 1, 2]}, "running"),
        ({"running": {"job_id": "ftjob-x"}}, "running"),
    ],
)
def test_a_heartbeat_with_a_malformed_field_is_400_naming_it(body, param) -> None:
    _, token = nodes.node_create(name="gpu-a")
    response = _heartbeat(token, body)
    assert_error(response, 400, param=param, code="invalid_value")
    assert _node("gpu-a").last_heartbeat_at is None


@pytest.mark.parametrize("raw", ["not json", "[1, 2]", "null"])
def test_a_heartbeat_with_a_body_that_is_not_a_json_object_is_400(raw) -> None:
    _, token = nodes.node_create(name="gpu-a")
    response = _heartbeat(token, raw, format=None, content_type="application/json")
    assert_error(response, 400)
    assert _node("gpu-a").last_heartbeat_at is None


def test_a_cancel_is_answered_to_the_node_running_the_attempt_only(api, placed) -> None:
    job_id, token = placed
    other = _online("gpu-b")
    assert _claim(token, {"job_id": job_id, "attempt": 1}).status_code == 200
    assert _heartbeat(token, {"running": [job_id, 1]}).json() == {"cancel": []}

    assert api.post(f"{JOBS}{job_id}/cancel/").json()["status"] == "cancelling"

    stop = {"cancel": [{"job_id": job_id, "attempt": 1, "mode": "cancel"}]}
    assert _heartbeat(token, {"running": [job_id, 1]}).json() == stop
    assert _heartbeat(token).json() == stop
    assert _heartbeat(other, node="gpu-b").json() == {"cancel": []}


def test_after_rotation_the_old_token_is_refused_and_the_new_one_works(admin, placed) -> None:
    job_id, old = placed
    new = admin.post(f"{NODES}gpu-a/rotate-token/").json()["token"]
    body = {"job_id": job_id, "attempt": 1}

    assert_error(_heartbeat(old), 401, code="invalid_node_token")
    assert_error(_claim(old, body), 401, code="invalid_node_token")
    assert JobAttempt.objects.get(job__public_id=job_id).claimed_at is None

    assert _heartbeat(new).status_code == 200
    assert _claim(new, body).status_code == 200


# --- the executor's events: the attempt's report token -----------------------------------------


def _claimed(placed: tuple[str, str]) -> str:
    """Claim the placed attempt as its node; returns the report token."""
    job_id, token = placed
    answer = _claim(token, {"job_id": job_id, "attempt": 1})
    assert answer.status_code == 200, answer.content
    return str(answer.json()["report_token"])


def _log(seq: int) -> dict:
    return {"seq": seq, "type": "log", "message": f"line {seq}"}


RUNNING = {"seq": 2, "type": "status", "data": {"status": "running"}}


def test_events_with_the_attempts_report_token_are_stored(placed) -> None:
    job_id, _ = placed
    report_token = _claimed(placed)

    response = _as_node(report_token, _events_path(job_id), {"events": [_log(1), RUNNING]})

    assert response.status_code == 200, response.content
    assert response.json() == {"stored": 2}
    job = TrainingJob.objects.get(public_id=job_id)
    assert job.status == "running"
    assert list(JobEvent.objects.filter(job=job, attempt=1).values_list("seq", flat=True)) == [
        1,
        2,
    ]


@pytest.mark.parametrize(
    "case",
    ["missing", "garbage", "node-token", "not-bearer", "path-names-another-node",
     "path-names-another-attempt", "path-names-another-job", "other-nodes-report-token"],
)  # fmt: skip
def test_events_without_the_attempts_report_token_are_403_and_store_nothing(
    placed, make_job, case
) -> None:
    job_id, node_token = placed
    report_token = _claimed(placed)
    other = _online("gpu-b")
    job_b = make_job()
    assert dispatch.dispatch_queued() == 1
    claim_b = _claim(other, {"job_id": job_b.public_id, "attempt": 1}, node="gpu-b")
    report_b = claim_b.json()["report_token"]
    before = {j.pk: (j.status, j.event_counter) for j in TrainingJob.objects.all()}
    token: str | None = report_token
    path, scheme = _events_path(job_id), "Bearer"
    if case == "missing":
        token = None
    elif case == "garbage":
        token = "rt-guess"
    elif case == "node-token":
        token = node_token
    elif case == "not-bearer":
        scheme = "Token"
    elif case == "path-names-another-node":
        path = _events_path(job_id, node="gpu-b")
    elif case == "path-names-another-attempt":
        path = _events_path(job_id, attempt=2)
    elif case == "path-names-another-job":
        path = _events_path(job_b.public_id, node="gpu-b")
    elif case == "other-nodes-report-token":
        token = report_b

    response = _as_node(token, path, {"events": [_log(1), RUNNING]}, scheme=scheme)

    error = assert_error(response, 403, code="invalid_report_token")
    assert error["type"] == "permission_error"
    assert report_token not in error["message"]
    after = {j.pk: (j.status, j.event_counter) for j in TrainingJob.objects.all()}
    assert after == before
    assert not JobEvent.objects.filter(attempt__gt=0).exists()


def test_events_of_an_attempt_that_ended_are_dropped(placed) -> None:
    """The token still speaks for its attempt; the attempt no longer moves the job."""
    job_id, _ = placed
    report_token = _claimed(placed)
    attempt = JobAttempt.objects.get(job__public_id=job_id)
    expire_lease(attempt)
    assert attempts_expire_leases() == 1
    job = TrainingJob.objects.get(public_id=job_id)
    before = (job.status, job.event_counter)

    response = _as_node(report_token, _events_path(job_id), {"events": [_log(1), RUNNING]})

    assert response.status_code == 200, response.content
    assert response.json() == {"stored": 0}
    fresh(job)
    assert (job.status, job.event_counter) == before == ("queued", before[1])


@pytest.mark.parametrize(
    ("raw", "param"),
    [({"events": "x"}, "events"), ({"events": {"seq": 1}}, "events"), ({}, "events"),
     ("[1, 2]", None), ("not json", None)],
)  # fmt: skip
def test_events_with_a_malformed_body_are_400(placed, raw, param) -> None:
    job_id, _ = placed
    report_token = _claimed(placed)
    kwargs: dict[str, Any] = (
        {} if isinstance(raw, dict) else {"format": None, "content_type": "application/json"}
    )
    response = _as_node(report_token, _events_path(job_id), raw, **kwargs)
    error = assert_error(response, 400)
    if param:
        assert error["param"] == param
    assert not JobEvent.objects.filter(attempt=1).exists()


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
    # By kind: the node's name and state are the operator's (tests/security/test_operations.py).
    assert job["waiting_reason"] == "Waiting for a node: every GPU node that fits this job is busy."
