"""The audit trail: one entry per change with its actor, source and before→after; nothing for a
refused or repeated action; append-only in Python and in the database itself; no secret ever
recorded; the admin's actions write it (and Django's "Recent actions"), ask before destroying,
and its page is read-only."""

from __future__ import annotations

import importlib
import json
import sqlite3
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from jobs.errors import Conflict, InvalidRequest, ServiceError
from jobs.models import (
    AuditEntry,
    GpuNode,
    JobAttempt,
    NodeEvent,
    Project,
    TrainingJob,
    WebhookEndpoint,
)
from jobs.models.audit import AppendOnly
from jobs.services.accounts import projects
from jobs.services.accounts.audit import SYSTEM, Actor, AuditObject, audit_record, redacted_url
from jobs.services.core import jobs as job_services
from jobs.services.fleet import nodes
from jobs.services.outbound import webhook_endpoints

# Every send_task is recorded (``sent``), never sent.
pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("sent")]
SECRET = "rk_audit_secret_value_1234"
PUBLIC_URL = "https://93.184.215.14/hooks/T000/B000/XXXXsecretpath?token=abc123"
ALICE_ADMIN = Actor("admin", "ops-alice")


def entries(**filters: Any) -> list[AuditEntry]:
    return list(AuditEntry.objects.filter(**filters).order_by("id"))


def one(action: str) -> AuditEntry:
    found = entries(action=action)
    assert len(found) == 1, [(e.action, e.object_id) for e in entries()]
    return found[0]


# --- the actor --------------------------------------------------------------------------------


def test_actor_constructors(user, project) -> None:
    key, _ = projects.api_key_create(user=user, name="laptop")
    assert Actor.api_key(key) == Actor("api", "alice", key.prefix)
    assert Actor.staff(user) == Actor("admin", "alice")
    assert Actor.command("create_node") == Actor("cli", "manage.py create_node")
    assert SYSTEM == Actor.system() == Actor("system", "system")
    assert Actor.coerce("ops") == Actor("system", "ops")
    assert Actor.coerce(ALICE_ADMIN) is ALICE_ADMIN


def test_the_key_prefix_is_kept_for_api_actors_only(project) -> None:
    with transaction.atomic():
        api = audit_record(
            actor=Actor("api", "alice", "th-abc"), action="x.y", obj=AuditObject("x", "1")
        )
        cli = audit_record(
            actor=Actor("cli", "manage.py x", "th-abc"), action="x.y", obj=AuditObject("x", "2")
        )
    assert (api.api_key_prefix, cli.api_key_prefix) == ("th-abc", "")


# --- append-only --------------------------------------------------------------------------------


@pytest.fixture
def entry(project) -> AuditEntry:
    with transaction.atomic():
        return audit_record(actor=SYSTEM, action="project.update", obj=project, changes={})


def test_the_model_refuses_to_change_or_delete_an_entry(entry) -> None:
    entry.actor = "mallory"
    with pytest.raises(AppendOnly):
        entry.save()
    with pytest.raises(AppendOnly):
        entry.delete()
    with pytest.raises(AppendOnly):
        AuditEntry.objects.filter(pk=entry.pk).update(actor="mallory")
    with pytest.raises(AppendOnly):
        AuditEntry.objects.filter(pk=entry.pk).delete()
    assert AuditEntry.objects.get(pk=entry.pk).actor == "system"


@pytest.mark.parametrize(
    "sql",
    [
        "UPDATE jobs_auditentry SET actor = 'mallory' WHERE id = %s",
        "UPDATE jobs_auditentry SET changes = '{}' WHERE id = %s",
        "DELETE FROM jobs_auditentry WHERE id = %s",
    ],
)
def test_the_database_refuses_raw_updates_and_deletes(entry, sql: str) -> None:
    with (
        pytest.raises(DatabaseError, match="append-only"),
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute(sql, [entry.pk])
    stored = AuditEntry.objects.filter(pk=entry.pk).values_list("actor", flat=True).first()
    assert stored == "system"


def test_the_sqlite_triggers_refuse_too() -> None:
    """The embedded default's triggers, from the migration itself, on a SQLite table."""
    migration = importlib.import_module("jobs.migrations.0008_audit_trail")
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE jobs_auditentry (id INTEGER PRIMARY KEY, actor TEXT)")
    for sql in migration.SQLITE_UP:
        db.execute(sql)
    db.execute("INSERT INTO jobs_auditentry (actor) VALUES ('system')")
    for sql in ("UPDATE jobs_auditentry SET actor = 'x'", "DELETE FROM jobs_auditentry"):
        with pytest.raises(sqlite3.DatabaseError, match="append-only"):
            db.execute(sql)
    assert db.execute("SELECT actor FROM jobs_auditentry").fetchall() == [("system",)]
    for sql in migration.SQLITE_DOWN:
        db.execute(sql)
    db.execute("DELETE FROM jobs_auditentry")  # the reverse migration drops them


def test_a_secret_value_is_refused(project) -> None:
    for changes in (
        {"secret": {"from": None, "to": "whsec_abc"}},
        {"token": {"from": "set", "to": "thn-abc"}},
        {"secrets": {"from": None, "to": {"api_key": "x"}}},
    ):
        with pytest.raises(ValueError, match="looks like a secret"), transaction.atomic():
            audit_record(actor=SYSTEM, action="x.y", obj=project, changes=changes)
    assert not AuditEntry.objects.exists()


def test_deleting_the_object_keeps_its_history(make_job) -> None:
    job = make_job()
    job_services.job_cancel(job=job)
    job_services.job_delete(job=job)
    assert not TrainingJob.objects.filter(pk=job.pk).exists()
    assert [e.action for e in entries(object_id=job.public_id)] == [
        "job.create",
        "job.cancel",
        "job.delete",
    ]
    Project.objects.all().delete()  # nothing cascades to the trail
    assert len(entries(object_id=job.public_id)) == 3


# --- each service action: one entry, right actor and changes; refusals and repeats none ----------


def test_job_create_is_recorded_once_and_an_idempotent_replay_not_again(
    project, user, make_file
) -> None:
    actor = Actor("api", "alice", "th-123456789")
    data = {"model": "acme/tiny-llama", "training_file": make_file().public_id}
    job, created = job_services.job_create(
        project=project, user=user, data=data, idempotency_key="k1", actor=actor
    )
    again, created_again = job_services.job_create(
        project=project, user=user, data=data, idempotency_key="k1", actor=actor
    )
    assert (created, created_again, again.pk) == (True, False, job.pk)
    entry = one("job.create")
    assert (entry.actor, entry.source, entry.api_key_prefix) == ("alice", "api", "th-123456789")
    assert (entry.object_type, entry.object_id) == ("fine_tuning.job", job.public_id)
    assert (entry.project_id, entry.project_slug) == (project.pk, project.slug)
    assert entry.changes["model"] == {"from": None, "to": "acme/tiny-llama"}
    assert entry.changes["status"] == {"from": None, "to": "queued"}

    with pytest.raises(InvalidRequest):
        job_services.job_create(project=project, user=user, data={"model": "x"}, actor=actor)
    with pytest.raises(Conflict):  # the same key with another body
        job_services.job_create(
            project=project, user=user, data={**data, "seed": 7}, idempotency_key="k1"
        )
    assert len(entries(action="job.create")) == 1


def test_job_cancel_retry_and_refusals(make_job) -> None:
    job = make_job()
    job_services.job_cancel(job=job, actor=ALICE_ADMIN)
    entry = one("job.cancel")
    assert (entry.actor, entry.source) == ("ops-alice", "admin")
    assert entry.changes == {"status": {"from": "queued", "to": "cancelled"}}
    with pytest.raises(Conflict):
        job_services.job_cancel(job=TrainingJob.objects.get(pk=job.pk), actor=ALICE_ADMIN)
    assert len(entries(action="job.cancel")) == 1

    job_services.job_retry(job=TrainingJob.objects.get(pk=job.pk), actor=ALICE_ADMIN)
    assert one("job.retry").changes == {"status": {"from": "cancelled", "to": "queued"}}
    with pytest.raises(Conflict):
        job_services.job_retry(job=TrainingJob.objects.get(pk=job.pk), actor=ALICE_ADMIN)
    with pytest.raises(Conflict):  # a live job cannot be deleted
        job_services.job_delete(job=TrainingJob.objects.get(pk=job.pk), actor=ALICE_ADMIN)
    assert len(entries(action="job.retry")) == 1 and not entries(action="job.delete")


def test_job_priority(make_job) -> None:
    job = make_job()
    job_services.job_set_priority(job=job, priority=0, actor=ALICE_ADMIN)  # unchanged
    with pytest.raises(InvalidRequest):
        job_services.job_set_priority(job=job, priority=101, actor=ALICE_ADMIN)
    job_services.job_set_priority(job=job, priority=5, actor=ALICE_ADMIN)
    assert one("job.update").changes == {"priority": {"from": 0, "to": 5}}
    assert TrainingJob.objects.get(pk=job.pk).priority == 5


def test_job_pause_and_resume(claimed) -> None:
    job = TrainingJob.objects.get(pk=claimed.job.pk)
    before = job.status
    job_services.job_pause(job=job, actor=ALICE_ADMIN)
    assert one("job.pause").changes == {"status": {"from": before, "to": "paused"}}
    with pytest.raises(Conflict):  # its attempt is still saving a checkpoint
        job_services.job_resume(job=TrainingJob.objects.get(pk=job.pk), actor=ALICE_ADMIN)
    assert not entries(action="job.resume")
    JobAttempt.objects.filter(pk=claimed.attempt.pk).update(ended_at=timezone.now())
    job_services.job_resume(job=TrainingJob.objects.get(pk=job.pk), actor=ALICE_ADMIN)
    assert one("job.resume").changes == {"status": {"from": "paused", "to": "queued"}}


def test_api_keys(user, project) -> None:
    cli = Actor.command("create_api_key")
    key, raw = projects.api_key_create(user=user, name="laptop", actor=cli)
    created = one("api_key.create")
    assert (created.actor, created.source, created.object_id) == (
        "manage.py create_api_key",
        "cli",
        key.prefix,
    )
    assert created.changes["secret"] == {"from": None, "to": "set"}
    assert projects.api_key_revoke(key=key, actor=ALICE_ADMIN) is True
    assert projects.api_key_revoke(key=key, actor=ALICE_ADMIN) is False  # already revoked
    revoke = one("api_key.revoke")
    assert revoke.changes["revoked_at"]["from"] is None and revoke.changes["revoked_at"]["to"]
    projects.api_key_rename(key=key, name="laptop", actor=ALICE_ADMIN)  # no change
    projects.api_key_rename(key=key, name="old laptop", actor=ALICE_ADMIN)
    assert one("api_key.update").changes == {"name": {"from": "laptop", "to": "old laptop"}}
    assert raw not in json.dumps(list(AuditEntry.objects.values()), default=str)


def test_credentials(project) -> None:
    credential = projects.credential_create(
        project=project, provider="runpod", name="main", secrets={"api_key": SECRET}
    )
    with pytest.raises(Conflict):
        projects.credential_create(
            project=project, provider="runpod", name="main", secrets={"api_key": SECRET}
        )
    with pytest.raises(InvalidRequest):
        projects.credential_create(project=project, provider="nope", name="x", secrets={})
    entry = one("credential.create")
    assert entry.source == "system"
    assert entry.changes["secrets"] == {"from": None, "to": "set"}
    assert entry.changes["provider"] == {"from": None, "to": "runpod"}
    projects.credential_delete(credential=credential, actor=ALICE_ADMIN)
    gone = one("credential.delete")
    assert gone.object_id == entry.object_id and gone.object_repr == "runpod:main"
    assert SECRET not in json.dumps(list(AuditEntry.objects.values()), default=str)


def test_nodes(settings) -> None:
    cli = Actor.command("create_node")
    node, token = nodes.node_create(name="gpu-a", actor=cli)
    with pytest.raises(ServiceError):
        nodes.node_create(name="gpu-a", actor=cli)
    with pytest.raises(ServiceError):
        nodes.node_create(name="bad name!", actor=cli)
    assert one("node.create").changes == {"token": {"from": None, "to": "set"}}
    new_token = nodes.node_rotate_token(node=node, actor=ALICE_ADMIN)
    assert one("node.rotate_token").changes == {"token": {"from": "set", "to": "rotated"}}
    nodes.node_set_draining(node=node, draining=True, actor=ALICE_ADMIN)
    nodes.node_set_draining(node=node, draining=True, actor=ALICE_ADMIN)  # a repeat
    nodes.node_set_draining(node=node, draining=False, actor=ALICE_ADMIN)
    assert one("node.drain").changes == {"draining": {"from": False, "to": True}}
    assert one("node.undrain").changes == {"draining": {"from": True, "to": False}}
    # Online nodes cannot be deleted: refused, nothing recorded.
    nodes.node_register(node=node, report={"capabilities": {"gpus": []}})
    with pytest.raises(Conflict):
        nodes.node_delete(node=GpuNode.objects.get(pk=node.pk), actor=ALICE_ADMIN)
    assert not entries(action="node.delete")
    GpuNode.objects.filter(pk=node.pk).update(last_heartbeat_at=None)
    nodes.node_delete(node=GpuNode.objects.get(pk=node.pk), actor=ALICE_ADMIN)
    assert one("node.delete").object_id == "gpu-a"
    trail = json.dumps(list(AuditEntry.objects.values()), default=str)
    assert token not in trail and new_token not in trail
    # NodeEvent keeps its short actor line.
    drains = NodeEvent.objects.filter(node_name="gpu-a", kind="drain")
    assert set(drains.values_list("actor", flat=True)) == {"ops-alice"}


def test_webhook_endpoints(project) -> None:
    endpoint, secret = webhook_endpoints.endpoint_create(
        project=project,
        data={"url": PUBLIC_URL, "event_types": ["fine_tuning.job.failed"]},
        actor=ALICE_ADMIN,
    )
    created = one("webhook_endpoint.create")
    assert created.changes["secret"] == {"from": None, "to": "set"}
    assert created.changes["url"]["to"] == redacted_url(PUBLIC_URL)
    assert created.changes["url"]["to"].startswith("https://93.184.215.14/… (sha256 ")
    webhook_endpoints.endpoint_update(endpoint=endpoint, data={"enabled": True}, actor=ALICE_ADMIN)
    assert not entries(action="webhook_endpoint.update")  # nothing changed
    webhook_endpoints.endpoint_update(
        endpoint=endpoint, data={"enabled": False, "description": "off"}, actor=ALICE_ADMIN
    )
    update = one("webhook_endpoint.update")
    assert update.changes["enabled"] == {"from": True, "to": False}
    assert update.changes["description"] == {"from": "", "to": "off"}
    with pytest.raises(InvalidRequest):
        webhook_endpoints.endpoint_update(
            endpoint=endpoint, data={"url": "https://169.254.169.254/"}, actor=ALICE_ADMIN
        )
    assert len(entries(action="webhook_endpoint.update")) == 1
    new_secret = webhook_endpoints.endpoint_rotate_secret(endpoint=endpoint, actor=ALICE_ADMIN)
    assert one("webhook_endpoint.rotate_secret").changes == {
        "secret": {"from": "set", "to": "rotated"}
    }
    webhook_endpoints.endpoint_delete(endpoint=endpoint, actor=ALICE_ADMIN)
    assert one("webhook_endpoint.delete").object_id == endpoint.public_id
    trail = json.dumps(list(AuditEntry.objects.values()), default=str)
    for leaked in (secret, new_secret, "XXXXsecretpath", "abc123"):
        assert leaked not in trail


def test_project_settings(project) -> None:
    projects.project_update(
        project=project,
        data={"max_concurrent_jobs": project.max_concurrent_jobs},
        actor=ALICE_ADMIN,
    )
    assert not entries(action="project.update")
    projects.project_update(
        project=project,
        data={"max_concurrent_jobs": 3, "operator_credential_providers": ["vastai", "runpod"]},
        actor=ALICE_ADMIN,
    )
    entry = one("project.update")
    assert entry.changes == {
        "max_concurrent_jobs": {"from": 10, "to": 3},
        "operator_credential_providers": {"from": [], "to": ["runpod", "vastai"]},
    }
    with pytest.raises(InvalidRequest):
        projects.project_update(
            project=project, data={"operator_credential_providers": ["gcp"]}, actor=ALICE_ADMIN
        )
    assert len(entries(action="project.update")) == 1
    assert Project.objects.get(pk=project.pk).operator_credential_providers == ["runpod", "vastai"]


# --- the admin ------------------------------------------------------------------------------------


def test_admin_job_actions_record_the_staff_user_and_recent_actions(admin_client, make_job) -> None:
    queued, other = make_job(), make_job()
    job_services.job_cancel(job=other)
    response = admin_client.post(
        "/admin/jobs/trainingjob/",
        {"action": "cancel_jobs", "_selected_action": [queued.pk, other.pk]},
    )
    assert response.status_code == 302
    [entry] = entries(action="job.cancel", source="admin")  # the refused one wrote none
    assert (entry.actor, entry.object_id) == ("root", queued.public_id)
    assert entry.changes == {"status": {"from": "queued", "to": "cancelled"}}
    log = LogEntry.objects.get(object_id=str(queued.pk))
    assert log.user.username == "root" and "Cancelled" in log.get_change_message()
    assert not LogEntry.objects.filter(object_id=str(other.pk)).exists()
    admin_client.post(
        "/admin/jobs/trainingjob/", {"action": "retry_jobs", "_selected_action": [queued.pk]}
    )
    assert one("job.retry").actor == "root"
    index = admin_client.get("/admin/").content.decode()
    assert "Recent actions" in index and str(queued) in index


def test_admin_node_actions(admin_client) -> None:
    node, _ = nodes.node_create(name="gpu-z", actor=Actor.command("create_node"))
    form = {"action": "drain", "_selected_action": [node.pk]}
    admin_client.post("/admin/jobs/gpunode/", form)
    entry = one("node.drain")
    assert (entry.actor, entry.source) == ("root", "admin")
    assert LogEntry.objects.filter(object_id=str(node.pk)).count() == 1
    delete = {"action": "delete_offline", "_selected_action": [node.pk]}
    admin_client.post("/admin/jobs/gpunode/", delete)  # asks first
    assert not entries(action="node.delete")
    admin_client.post("/admin/jobs/gpunode/", {**delete, "confirm": "yes"})
    assert one("node.delete").actor == "root"
    assert LogEntry.objects.filter(object_id=str(node.pk), action_flag=3).exists()  # DELETION


def test_admin_webhook_endpoint_delete_asks_first_and_is_recorded(admin_client, project) -> None:
    endpoint, _ = webhook_endpoints.endpoint_create(
        project=project, data={"url": PUBLIC_URL, "event_types": ["fine_tuning.job.failed"]}
    )
    url = f"/admin/jobs/webhookendpoint/{endpoint.pk}/delete/"
    asked = admin_client.get(url)
    assert asked.status_code == 200 and "Are you sure" in asked.content.decode()
    assert WebhookEndpoint.objects.filter(pk=endpoint.pk).exists()
    assert admin_client.post(url, {"post": "yes"}).status_code == 302
    assert not WebhookEndpoint.objects.filter(pk=endpoint.pk).exists()
    assert one("webhook_endpoint.delete").actor == "root"

    # "Delete selected" goes through the service too, after Django's confirmation page.
    second, _ = webhook_endpoints.endpoint_create(
        project=project, data={"url": PUBLIC_URL, "event_types": ["fine_tuning.job.failed"]}
    )
    form = {"action": "delete_selected", "_selected_action": [second.pk]}
    assert (
        "Are you sure" in admin_client.post("/admin/jobs/webhookendpoint/", form).content.decode()
    )
    admin_client.post("/admin/jobs/webhookendpoint/", {**form, "post": "yes"})
    assert not WebhookEndpoint.objects.filter(pk=second.pk).exists()
    assert len(entries(action="webhook_endpoint.delete")) == 2


def test_admin_webhook_endpoint_change_and_actions(admin_client, project) -> None:
    endpoint, _ = webhook_endpoints.endpoint_create(
        project=project, data={"url": PUBLIC_URL, "event_types": ["fine_tuning.job.failed"]}
    )
    admin_client.post(
        "/admin/jobs/webhookendpoint/", {"action": "disable", "_selected_action": [endpoint.pk]}
    )
    assert one("webhook_endpoint.update").changes["enabled"] == {"from": True, "to": False}
    r = admin_client.post(
        f"/admin/jobs/webhookendpoint/{endpoint.pk}/change/",
        {"url": PUBLIC_URL, "event_types": ["fine_tuning.job.failed"], "description": "x",
         "enabled": "on"},
    )  # fmt: skip
    assert r.status_code == 302, r.content.decode()[:2000]
    latest = entries(action="webhook_endpoint.update")[-1]
    assert latest.changes["enabled"] == {"from": False, "to": True}
    assert latest.changes["disabled_reason"] == {"from": "disabled by a user", "to": ""}
    admin_client.post(
        "/admin/jobs/webhookendpoint/",
        {"action": "rotate_secret", "_selected_action": [endpoint.pk]},
    )
    assert one("webhook_endpoint.rotate_secret").actor == "root"


def _project_form(project: Project, **changes: Any) -> dict[str, Any]:
    form: dict[str, Any] = {
        "name": project.name,
        "slug": project.slug,
        "max_concurrent_jobs": project.max_concurrent_jobs,
        "max_spend_per_hour": "",
        "operator_credential_providers": [],
        "memberships-TOTAL_FORMS": "0",
        "memberships-INITIAL_FORMS": "0",
        "memberships-MIN_NUM_FORMS": "0",
        "memberships-MAX_NUM_FORMS": "1000",
    }
    form.update(changes)
    return form


def test_admin_project_settings_are_a_checked_choice_and_recorded(admin_client, project) -> None:
    url = f"/admin/jobs/project/{project.pk}/change/"
    page = admin_client.get(url).content.decode()
    assert 'type="checkbox" name="operator_credential_providers" value="runpod"' in page
    refused = admin_client.post(url, _project_form(project, operator_credential_providers=["gcp"]))
    assert refused.status_code == 200 and "Select a valid choice" in refused.content.decode()
    assert not entries(action="project.update")

    done = admin_client.post(
        url,
        _project_form(project, operator_credential_providers=["runpod"], max_spend_per_hour="2.50"),
    )
    assert done.status_code == 302, done.content.decode()[:3000]
    project.refresh_from_db()
    assert project.operator_credential_providers == ["runpod"]
    entry = one("project.update")
    assert (entry.actor, entry.source) == ("root", "admin")
    assert entry.changes == {
        "max_spend_per_hour": {"from": None, "to": "2.50"},
        "operator_credential_providers": {"from": [], "to": ["runpod"]},
    }
    assert LogEntry.objects.filter(object_id=str(project.pk)).exists()


def test_admin_credential_delete_goes_through_the_service(admin_client, project) -> None:
    credential = projects.credential_create(
        project=project, provider="runpod", name="main", secrets={"api_key": SECRET}
    )
    url = f"/admin/jobs/providercredential/{credential.pk}/delete/"
    assert "Are you sure" in admin_client.get(url).content.decode()
    admin_client.post(url, {"post": "yes"})
    assert one("credential.delete").actor == "root"


def test_training_files_are_read_only_in_the_admin(admin_client, make_file) -> None:
    record = make_file()
    url = f"/admin/jobs/trainingfile/{record.pk}/change/"
    page = admin_client.get(url).content.decode()
    assert 'name="_save"' not in page and "deletelink" not in page
    assert admin_client.post(url, {"filename": "x.jsonl"}).status_code == 403
    assert admin_client.get(f"/admin/jobs/trainingfile/{record.pk}/delete/").status_code == 403
    record.refresh_from_db()
    assert record.filename == "data.jsonl"


def test_the_audit_admin_is_read_only_and_shows_changes(admin_client, make_job) -> None:
    job = make_job()
    job_services.job_cancel(job=job, actor=ALICE_ADMIN)
    entry = one("job.cancel")
    listing = admin_client.get("/admin/jobs/auditentry/").content.decode()
    assert "job.cancel" in listing and "ops-alice" in listing and job.public_id in listing
    assert "queued → cancelled" in listing
    url = f"/admin/jobs/auditentry/{entry.pk}/change/"
    page = admin_client.get(url).content.decode()
    assert "queued → cancelled" in page and 'name="_save"' not in page
    assert admin_client.post(url, {"actor": "mallory"}).status_code == 403
    assert admin_client.get(f"/admin/jobs/auditentry/{entry.pk}/delete/").status_code == 403
    assert admin_client.get("/admin/jobs/auditentry/add/").status_code == 403
    filtered = admin_client.get("/admin/jobs/auditentry/?source__exact=cli").content.decode()
    assert job.public_id not in filtered
    assert AuditEntry.objects.get(pk=entry.pk).actor == "ops-alice"


def test_admin_project_create_and_members_are_recorded(admin_client, user) -> None:
    form = {
        "name": "Research",
        "slug": "research",
        "max_concurrent_jobs": "4",
        "max_spend_per_hour": "",
        "operator_credential_providers": ["lambda"],
        "memberships-TOTAL_FORMS": "1",
        "memberships-INITIAL_FORMS": "0",
        "memberships-MIN_NUM_FORMS": "0",
        "memberships-MAX_NUM_FORMS": "1000",
        "memberships-0-user": str(user.pk),
        "memberships-0-role": "owner",
    }
    done = admin_client.post("/admin/jobs/project/add/", form)
    assert done.status_code == 302, done.content.decode()[:3000]
    project = Project.objects.get(slug="research")
    created = one("project.create")
    assert (created.actor, created.object_id, created.project_id) == (
        "root",
        "research",
        project.pk,
    )
    assert created.changes["operator_credential_providers"] == {"from": None, "to": ["lambda"]}
    assert one("project.members").changes == {"members": {"from": {}, "to": {"alice": "owner"}}}

    url = f"/admin/jobs/project/{project.pk}/delete/"
    assert "Are you sure" in admin_client.get(url).content.decode()
    admin_client.post(url, {"post": "yes"})
    assert not Project.objects.filter(pk=project.pk).exists()
    assert one("project.delete").object_id == "research"
