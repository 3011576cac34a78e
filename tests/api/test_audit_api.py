"""The audit trail over the API: every state-changing call leaves one entry naming the key's
user and prefix (source api), refused calls none; ``GET /api/v1/audit`` lists them newest
first for operators only, with filters and keyset pages; no secret ever appears in it."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.utils import timezone
from rest_framework.test import APIClient

from jobs.models import ApiKey, AuditEntry, JobAttempt, TrainingJob
from jobs.services.accounts.projects import api_key_create
from tests.support.api import assert_error, assert_list

# Every send_task is recorded (``sent``), never sent.
pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("sent")]
AUDIT = "/api/v1/audit/"
JOBS = "/v1/fine_tuning/jobs/"
SECRET = "rk_api_audit_secret_987654"
PUBLIC_URL = "https://93.184.215.14/hooks/secret-path-token"
ENTRY_KEYS = {
    "id", "object", "created_at", "actor", "source", "api_key_prefix", "action", "object_type",
    "object_id", "object_repr", "project", "changes",
}  # fmt: skip


def _client(user: Any) -> tuple[APIClient, ApiKey]:
    key, raw = api_key_create(user=user, name="audit-test")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client, key


@pytest.fixture
def member(user, project) -> tuple[APIClient, ApiKey]:
    """alice, a project member without staff status, with her own key."""
    return _client(user)


@pytest.fixture
def operator(make_user) -> tuple[APIClient, ApiKey]:
    root = make_user("root", is_staff=True, is_superuser=True)
    return _client(root)


def made_by(action: str, key: ApiKey) -> AuditEntry:
    """The one entry of ``action``, made through the API with ``key``."""
    found = list(AuditEntry.objects.filter(action=action))
    assert len(found) == 1, [(e.action, e.object_id) for e in AuditEntry.objects.order_by("id")]
    entry = found[0]
    assert (entry.source, entry.actor, entry.api_key_prefix) == (
        "api",
        key.user.username,
        key.prefix,
    )
    return entry


def count(action: str) -> int:
    return AuditEntry.objects.filter(action=action).count()


# --- each action through the API ----------------------------------------------------------------


def test_job_actions(member, project, make_file) -> None:
    client, key = member
    body = {"model": "acme/tiny-llama", "training_file": make_file().public_id}
    first = client.post(JOBS, body, format="json", HTTP_IDEMPOTENCY_KEY="same")
    replay = client.post(JOBS, body, format="json", HTTP_IDEMPOTENCY_KEY="same")
    assert (first.status_code, replay.status_code) == (201, 200)
    job_id = first.json()["id"]
    created = made_by("job.create", key)
    assert (created.object_id, created.project_slug) == (job_id, project.slug)

    assert client.post(f"{JOBS}{job_id}/cancel").status_code == 200
    assert made_by("job.cancel", key).changes == {"status": {"from": "queued", "to": "cancelled"}}
    assert_error(client.post(f"{JOBS}{job_id}/cancel"), 409)
    assert count("job.cancel") == 1

    assert client.post(f"/api/v1/jobs/{job_id}/retry/").status_code == 200
    assert made_by("job.retry", key).object_id == job_id
    assert_error(client.delete(f"{JOBS}{job_id}"), 409)  # live: refused
    client.post(f"{JOBS}{job_id}/cancel")
    assert client.delete(f"{JOBS}{job_id}").status_code == 200
    assert made_by("job.delete", key).object_id == job_id
    assert_error(client.post(JOBS, {"model": "nope"}, format="json"), 400)
    assert count("job.create") == 1


def test_pause_and_resume(member, claimed) -> None:
    client, key = member
    job_id = claimed.job.public_id
    assert client.post(f"{JOBS}{job_id}/pause").status_code == 200
    assert made_by("job.pause", key).changes["status"]["to"] == "paused"
    assert_error(client.post(f"{JOBS}{job_id}/resume"), 409)  # still saving its checkpoint
    assert count("job.resume") == 0
    JobAttempt.objects.filter(pk=claimed.attempt.pk).update(ended_at=timezone.now())
    assert client.post(f"{JOBS}{job_id}/resume").status_code == 200
    assert made_by("job.resume", key).changes == {"status": {"from": "paused", "to": "queued"}}
    assert TrainingJob.objects.get(pk=claimed.job.pk).status == "queued"


def test_credentials(member) -> None:
    client, key = member
    body = {"provider": "runpod", "name": "main", "secrets": {"api_key": SECRET}}
    created = client.post("/api/v1/credentials/", body, format="json")
    assert created.status_code == 201
    assert_error(client.post("/api/v1/credentials/", body, format="json"), 409)
    entry = made_by("credential.create", key)
    assert entry.changes["secrets"] == {"from": None, "to": "set"}
    credential_id = created.json()["id"]
    assert client.delete(f"/api/v1/credentials/{credential_id}/").status_code == 200
    assert made_by("credential.delete", key).object_id == str(credential_id)
    assert_error(client.delete(f"/api/v1/credentials/{credential_id}/"), 404)
    assert count("credential.delete") == 1


def test_webhook_endpoints(member) -> None:
    client, key = member
    url = "/api/v1/webhook_endpoints/"
    created = client.post(
        url, {"url": PUBLIC_URL, "event_types": ["fine_tuning.job.failed"]}, format="json"
    )
    assert created.status_code == 201
    endpoint_id = created.json()["id"]
    made_by("webhook_endpoint.create", key)
    patched = client.patch(f"{url}{endpoint_id}/", {"description": "ci"}, format="json")
    assert patched.status_code == 200
    assert made_by("webhook_endpoint.update", key).changes == {
        "description": {"from": "", "to": "ci"}
    }
    rotated = client.post(f"{url}{endpoint_id}/rotate_secret/")
    assert rotated.status_code == 200
    made_by("webhook_endpoint.rotate_secret", key)
    assert client.delete(f"{url}{endpoint_id}/").status_code == 200
    made_by("webhook_endpoint.delete", key)
    trail = json.dumps(list(AuditEntry.objects.values()), default=str)
    for secret in (created.json()["secret"], rotated.json()["secret"], "secret-path-token"):
        assert secret not in trail


def test_nodes(operator) -> None:
    client, key = operator
    created = client.post("/api/v1/nodes/", {"name": "gpu-q"}, format="json")
    assert created.status_code == 201
    assert made_by("node.create", key).changes == {"token": {"from": None, "to": "set"}}
    assert client.post("/api/v1/nodes/gpu-q/drain/").status_code == 200
    assert client.post("/api/v1/nodes/gpu-q/drain/").status_code == 200  # a repeat
    made_by("node.drain", key)
    assert client.post("/api/v1/nodes/gpu-q/undrain/").status_code == 200
    made_by("node.undrain", key)
    rotated = client.post("/api/v1/nodes/gpu-q/rotate-token/")
    made_by("node.rotate_token", key)
    assert client.delete("/api/v1/nodes/gpu-q/").status_code == 200
    made_by("node.delete", key)
    trail = json.dumps(list(AuditEntry.objects.values()), default=str)
    assert created.json()["token"] not in trail and rotated.json()["token"] not in trail


# --- GET /api/v1/audit -------------------------------------------------------------------------


def test_only_operators_read_the_trail(member, make_user) -> None:
    client, _ = member
    error = assert_error(client.get(AUDIT), 403)
    assert error["type"] == "permission_error"
    assert_error(APIClient().get(AUDIT), 401)

    staff = make_user("viewer", is_staff=True)
    staff_client, _ = _client(staff)
    assert_error(staff_client.get(AUDIT), 403)  # staff, without the view permission
    staff.user_permissions.add(Permission.objects.get(codename="view_auditentry"))
    assert_list(staff_client.get(AUDIT))

    not_staff = make_user("bob")
    not_staff.user_permissions.add(Permission.objects.get(codename="view_auditentry"))
    bob_client, _ = _client(not_staff)
    assert_error(bob_client.get(AUDIT), 403)


def _all_pages(client: APIClient, query: str = "") -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    after = ""
    while True:
        page = client.get(f"{AUDIT}?limit=2{query}{after}")
        rows += assert_list(page)
        if not page.json()["has_more"]:
            return rows
        after = f"&after={rows[-1]['id']}"


def test_listing_filters_and_pages(member, operator, project, make_file) -> None:
    client, key = member
    staff, staff_key = operator
    body = {"model": "acme/tiny-llama", "training_file": make_file().public_id}
    jobs = [client.post(JOBS, body, format="json").json()["id"] for _ in range(3)]
    client.post(f"{JOBS}{jobs[0]}/cancel")
    staff.post("/api/v1/nodes/", {"name": "gpu-w"}, format="json")

    everything = _all_pages(staff)
    ids = [e["id"] for e in everything]
    assert len(ids) == len(set(ids)) == AuditEntry.objects.count()
    assert ids == list(AuditEntry.objects.order_by("-id").values_list("public_id", flat=True))
    newest = everything[0]
    assert set(newest) == ENTRY_KEYS
    assert (newest["action"], newest["object_id"], newest["source"]) == (
        "node.create",
        "gpu-w",
        "api",
    )
    assert (newest["actor"], newest["api_key_prefix"], newest["project"]) == (
        "root",
        staff_key.prefix,
        None,
    )
    assert isinstance(newest["created_at"], int)

    cancel = assert_list(staff.get(f"{AUDIT}?action=job.cancel"))
    assert [e["object_id"] for e in cancel] == [jobs[0]]
    assert cancel[0]["changes"] == {"status": {"from": "queued", "to": "cancelled"}}
    by_object = assert_list(staff.get(f"{AUDIT}?object_id={jobs[0]}"))
    assert [e["action"] for e in by_object] == ["job.cancel", "job.create"]
    by_prefix = assert_list(staff.get(f"{AUDIT}?actor={key.prefix}"))
    by_name = assert_list(staff.get(f"{AUDIT}?actor=alice&source=api"))
    assert len(by_prefix) == 4 and [e["id"] for e in by_prefix] == [e["id"] for e in by_name]
    in_project = _all_pages(staff, f"&project={project.slug}")
    assert {e["project"] for e in in_project} == {project.slug}
    assert "gpu-w" not in {e["object_id"] for e in in_project}
    assert assert_list(staff.get(f"{AUDIT}?actor=nobody")) == []
    assert assert_list(staff.get(f"{AUDIT}?action=job%00cancel")) == []  # never queried

    assert_error(staff.get(f"{AUDIT}?source=robot"), 400, param="source")
    assert_error(staff.get(f"{AUDIT}?object_id={'x' * 151}"), 400, param="object_id")
    assert_error(staff.get(f"{AUDIT}?after=audit-nope"), 400, param="after")
    assert_error(staff.get(f"{AUDIT}?limit=0"), 400, param="limit")


def test_no_secret_anywhere(member, admin_client, django_user_model) -> None:
    """A credential, a webhook secret, a node token and an API key, created with known values:
    none is in the table, the API's answers or the admin's pages."""
    client, key = member
    staff, _ = _client(django_user_model.objects.get(username="root"))  # admin_client's user
    client.post(
        "/api/v1/credentials/",
        {"provider": "runpod", "name": "main", "secrets": {"api_key": SECRET}},
        format="json",
    )
    hook = client.post(
        "/api/v1/webhook_endpoints/",
        {"url": PUBLIC_URL, "event_types": ["fine_tuning.job.failed"]},
        format="json",
    ).json()
    node = staff.post("/api/v1/nodes/", {"name": "gpu-s"}, format="json").json()
    raw_key = api_key_create(user=key.user, name="second")[1]
    secrets = [SECRET, hook["secret"], node["token"], raw_key, "secret-path-token"]

    table = json.dumps(list(AuditEntry.objects.values()), default=str)
    listed = json.dumps(_all_pages(staff))
    pages = [admin_client.get("/admin/jobs/auditentry/").content.decode()]
    for pk in AuditEntry.objects.values_list("pk", flat=True):
        pages.append(admin_client.get(f"/admin/jobs/auditentry/{pk}/change/").content.decode())
    assert AuditEntry.objects.count() >= 5 and "credential.create" in listed
    for text in (table, listed, *pages):
        for secret in secrets:
            assert secret not in text


def test_the_schema_lists_the_audit_operation(member) -> None:
    client, _ = member
    schema = client.get("/api/schema/?format=json").json()
    operation = schema["paths"]["/api/v1/audit/"]["get"]
    assert operation["operationId"] == "audit_list"
    assert {"200", "400", "401", "403"} <= set(operation["responses"])
    names = {p["name"] for p in operation["parameters"]}
    assert {"action", "object_id", "actor", "project", "limit", "after"} <= names
