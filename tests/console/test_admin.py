"""Django admin: pages render for an operator, secrets never show, actions go through services,
and revocation is one-way."""

from __future__ import annotations

import re

import pytest
from django.apps import apps
from django.contrib import admin
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import User
from django.db.models import Model
from django.test import Client, RequestFactory

from jobs.models import ApiKey, AuditEntry, JobEvent, ProviderCredential, TrainingJob
from jobs.services.accounts.projects import (
    api_key_authenticate,
    api_key_create,
    api_key_revoke,
    credential_create,
)
from tests.support.factories import ArtifactFactory, StorageDeletionFactory

SECRET = "rk_secret_for_admin"


@pytest.fixture
def objects(user, project, make_job):
    queued = make_job()
    cancelled = make_job()
    from jobs.services.core.jobs import job_cancel

    job_cancel(job=cancelled)
    artifact = ArtifactFactory(
        job=cancelled,
        kind="adapter",
        storage_key="projects/x/adapter.tar",
        filename="adapter.tar",
        size=10,
        sha256="0" * 64,
        verified=True,
    )
    key, raw = api_key_create(user=user, name="laptop")
    credential = credential_create(
        project=project, provider="runpod", name="main", secrets={"api_key": SECRET}
    )
    return {
        "queued": queued,
        "cancelled": cancelled,
        "artifact": artifact,
        "key": key,
        "raw": raw,
        "credential": credential,
    }


def _page(client: Client, url: str) -> str:
    response = client.get(url)
    assert response.status_code == 200, (url, response.status_code)
    return response.content.decode()


def test_changelists_and_change_pages_render(admin_client, objects) -> None:
    pages = {
        "trainingjob": objects["queued"].pk,
        "trainingfile": objects["queued"].training_file_id,
        "artifact": objects["artifact"].pk,
        "apikey": objects["key"].pk,
        "providercredential": objects["credential"].pk,
        "project": objects["queued"].project_id,
    }
    for model, pk in pages.items():
        _page(admin_client, f"/admin/jobs/{model}/")
        _page(admin_client, f"/admin/jobs/{model}/{pk}/change/")
    assert objects["queued"].public_id in _page(admin_client, "/admin/jobs/trainingjob/")
    assert objects["artifact"].public_id in _page(admin_client, "/admin/jobs/artifact/")
    job_page = _page(admin_client, f"/admin/jobs/trainingjob/{objects['cancelled'].pk}/change/")
    assert "Job cancelled." in job_page  # the events inline


def test_secrets_never_show(admin_client, objects) -> None:
    key, raw, credential = objects["key"], objects["raw"], objects["credential"]
    row = ProviderCredential.objects.get(pk=credential.pk)
    for url in (
        "/admin/jobs/providercredential/",
        f"/admin/jobs/providercredential/{credential.pk}/change/",
        f"/admin/jobs/providercredential/{credential.pk}/history/",
    ):
        html = _page(admin_client, url)
        assert SECRET not in html
        assert row.secret_ciphertext not in html
    cred_page = _page(admin_client, f"/admin/jobs/providercredential/{credential.pk}/change/")
    assert "api_key" in cred_page  # field names are shown

    stored = ApiKey.objects.get(pk=key.pk)
    for url in ("/admin/jobs/apikey/", f"/admin/jobs/apikey/{key.pk}/change/"):
        html = _page(admin_client, url)
        assert raw not in html
        assert stored.key_sha256 not in html
        assert stored.prefix in html


def test_admin_cancel_action_uses_the_service(admin_client, objects) -> None:
    queued, cancelled = objects["queued"], objects["cancelled"]
    response = admin_client.post(
        "/admin/jobs/trainingjob/",
        {"action": "cancel_jobs", "_selected_action": [queued.pk, cancelled.pk]},
        follow=True,
    )
    assert response.status_code == 200
    html = response.content.decode()
    assert "Cancelled 1 job(s)." in html
    assert f"Skipped {cancelled.public_id}: Job {cancelled.public_id} is already cancelled." in html

    queued.refresh_from_db()
    assert queued.status == "cancelled" and queued.finished_at is not None
    statuses = list(
        JobEvent.objects.filter(job=queued)
        .order_by("number")
        .values_list("data__status", flat=True)
    )
    assert statuses[-2:] == ["cancelling", "cancelled"]


def test_admin_retry_action(admin_client, objects) -> None:
    cancelled = objects["cancelled"]
    admin_client.post(
        "/admin/jobs/trainingjob/", {"action": "retry_jobs", "_selected_action": [cancelled.pk]}
    )
    cancelled.refresh_from_db()
    assert cancelled.status == "queued"


def test_status_filter(admin_client, objects) -> None:
    html = _page(admin_client, "/admin/jobs/trainingjob/?status=queued")
    assert objects["queued"].public_id in html
    assert objects["cancelled"].public_id not in html
    html = _page(admin_client, "/admin/jobs/trainingjob/?status=cancelled")
    assert objects["cancelled"].public_id in html
    assert objects["queued"].public_id not in html
    html = _page(admin_client, f"/admin/jobs/trainingjob/?q={objects['cancelled'].public_id}")
    assert objects["cancelled"].public_id in html
    assert objects["queued"].public_id not in html
    html = _page(admin_client, "/admin/jobs/trainingfile/?status=processed")
    assert objects["queued"].training_file.public_id in html


def test_revoke_action_asks_first(admin_client, objects) -> None:
    key, raw = objects["key"], objects["raw"]
    assert api_key_authenticate(raw=raw) is not None
    form = {"action": "revoke", "_selected_action": [key.pk]}
    asked = admin_client.post("/admin/jobs/apikey/", form)
    assert asked.status_code == 200
    page = asked.content.decode()
    assert "Revoke these API keys?" in page and key.prefix in page and raw not in page
    key.refresh_from_db()
    assert key.revoked_at is None  # nothing revoked yet
    assert not AuditEntry.objects.filter(action="api_key.revoke").exists()

    done = admin_client.post("/admin/jobs/apikey/", {**form, "confirm": "yes"})
    assert done.status_code == 302
    key.refresh_from_db()
    assert key.revoked_at is not None
    assert api_key_authenticate(raw=raw) is None
    entry = AuditEntry.objects.get(action="api_key.revoke")
    assert (entry.actor, entry.source, entry.object_id) == ("root", "admin", key.prefix)
    recent = LogEntry.objects.get(object_id=str(key.pk))
    assert recent.is_change() and recent.user.username == "root"

    # A second revoke changes nothing and records nothing.
    admin_client.post("/admin/jobs/apikey/", {**form, "confirm": "yes"})
    assert AuditEntry.objects.filter(action="api_key.revoke").count() == 1


def test_no_add_pages_for_api_owned_objects(admin_client, db) -> None:
    models = ("trainingjob", "trainingfile", "artifact", "apikey", "providercredential",
              "storagedeletion", "auditentry")  # fmt: skip
    for model in models:
        assert admin_client.get(f"/admin/jobs/{model}/add/").status_code == 403


def test_pending_storage_deletions_are_listed(admin_client, db) -> None:
    row = StorageDeletionFactory(key="projects/1/jobs/ftjob-gone/", reason="job deleted")
    assert "projects/1/jobs/ftjob-gone/" in _page(admin_client, "/admin/jobs/storagedeletion/")
    _page(admin_client, f"/admin/jobs/storagedeletion/{row.pk}/change/")


def test_non_staff_is_sent_to_login(user, objects) -> None:
    client = Client()
    client.force_login(user)
    response = client.get("/admin/jobs/trainingjob/")
    assert response.status_code == 302
    assert "/admin/login/" in response["Location"]
    assert TrainingJob.objects.count() == 2


def test_a_revoked_key_stays_revoked_whatever_the_form_says(admin_client, objects) -> None:
    key, raw = objects["key"], objects["raw"]
    api_key_revoke(key=key)
    revoked_at = ApiKey.objects.get(pk=key.pk).revoked_at
    page = _page(admin_client, f"/admin/jobs/apikey/{key.pk}/change/")
    assert 'name="revoked_at' not in page  # shown, not editable

    response = admin_client.post(
        f"/admin/jobs/apikey/{key.pk}/change/",
        {"name": "renamed", "revoked_at_0": "", "revoked_at_1": "", "_save": "Save"},
    )
    assert response.status_code == 302
    stored = ApiKey.objects.get(pk=key.pk)
    assert (stored.name, stored.revoked_at) == ("renamed", revoked_at)
    assert api_key_authenticate(raw=raw) is None
    # Nor can a revoked key be deleted (and then made again): the admin has no delete for keys.
    assert admin_client.get(f"/admin/jobs/apikey/{key.pk}/delete/").status_code == 403
    assert ApiKey.objects.filter(pk=key.pk).exists()


def test_a_live_key_cannot_be_revoked_or_backdated_through_the_form(admin_client, objects) -> None:
    key = objects["key"]
    admin_client.post(
        f"/admin/jobs/apikey/{key.pk}/change/",
        {"name": "laptop", "revoked_at_0": "2020-01-01", "revoked_at_1": "00:00:00"},
    )
    assert ApiKey.objects.get(pk=key.pk).revoked_at is None  # the action revokes, via the service
    assert not AuditEntry.objects.filter(action__startswith="api_key.revoke").exists()
    admin_client.post(
        "/admin/jobs/apikey/",
        {"action": "revoke", "_selected_action": [key.pk], "confirm": "yes"},
        follow=True,
    )
    assert ApiKey.objects.get(pk=key.pk).revoked_at is not None


def _secret_fields() -> dict[type[Model], set[str]]:
    """Per jobs model, the fields holding a secret or what verifies one (a token's hash)."""
    return {
        model: names
        for model in apps.get_app_config("jobs").get_models()
        if (
            names := {
                f.name
                for f in model._meta.get_fields()
                if f.name.endswith(("_ciphertext", "token_sha256", "key_sha256"))
            }
        )
    }


def test_no_admin_page_shows_a_secret_field(admin_client, objects) -> None:
    """Every field holding a secret or a secret's hash, on every model, today's and any added
    later: not in any admin's list, form or inline."""
    request = RequestFactory().get("/admin/")
    request.user = User.objects.get(username="root")
    secret = _secret_fields()
    assert {m.__name__ for m in secret} >= {"ApiKey", "ProviderCredential", "GpuNode", "JobAttempt"}
    shown: list[str] = []
    for model, model_admin in admin.site._registry.items():
        obj = model._default_manager.first()
        views = [(model, model_admin, obj)]
        for inline in model_admin.get_inline_instances(request, obj):
            views.append((inline.model, inline, None))
        for each, view, instance in views:
            fields = set(view.get_fields(request, instance))
            if hasattr(view, "list_display"):
                fields |= set(view.list_display)
            shown += [f"{view}: {f}" for f in fields & secret.get(each, set())]
    assert shown == []


def test_an_artifact_page_is_truly_read_only(admin_client, objects) -> None:
    artifact = objects["artifact"]
    page = _page(admin_client, f"/admin/jobs/artifact/{artifact.pk}/change/")
    assert 'name="_save"' not in page and "deletelink" not in page
    posted = admin_client.post(f"/admin/jobs/artifact/{artifact.pk}/change/", {"size": 1})
    assert posted.status_code == 403
    assert admin_client.get(f"/admin/jobs/artifact/{artifact.pk}/delete/").status_code == 403
    artifact.refresh_from_db()
    assert artifact.size == 10


def test_a_cancelled_job_keeps_no_waiting_reason(objects) -> None:
    from jobs.models import TrainingJob
    from jobs.services.core.jobs import job_cancel

    job = objects["queued"]
    TrainingJob.objects.filter(pk=job.pk).update(waiting_reason="No online node fits this job.")
    job.refresh_from_db()
    job_cancel(job=job)
    job.refresh_from_db()
    assert (job.status, job.waiting_reason) == ("cancelled", "")


def test_a_job_page_shows_its_latest_events_without_metrics(admin_client, objects) -> None:
    from console.admin.training_jobs import ADMIN_EVENTS
    from jobs.services.core.events import event_append

    job = objects["queued"]
    for i in range(ADMIN_EVENTS + 20):
        event_append(job=job, type="log", message=f"line-{i:03d}")
        event_append(job=job, type="metrics", message=f"metric-{i:03d}", data={"step": i})
    page = _page(admin_client, f"/admin/jobs/trainingjob/{job.pk}/change/")
    assert f"line-{ADMIN_EVENTS + 19:03d}" in page  # the newest
    assert "line-000" not in page and "metric-" not in page
    assert len(set(re.findall(r"line-\d{3}", page))) == ADMIN_EVENTS
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", page)  # to the second


def test_deleting_offline_nodes_asks_first(admin_client, db) -> None:
    from jobs.models import GpuNode
    from jobs.services.fleet.nodes import node_create

    node_create(name="old-node", actor="test")
    node = GpuNode.objects.get(name="old-node")
    form = {"action": "delete_offline", "_selected_action": [str(node.pk)]}
    asked = admin_client.post("/admin/jobs/gpunode/", form)
    assert asked.status_code == 200
    page = asked.content.decode()
    assert "Delete these GPU nodes?" in page and "old-node" in page
    assert GpuNode.objects.filter(name="old-node").exists()  # nothing deleted yet
    done = admin_client.post("/admin/jobs/gpunode/", {**form, "confirm": "yes"})
    assert done.status_code == 302
    assert not GpuNode.objects.filter(name="old-node").exists()


def test_the_servers_page_shows_each_model_s_traffic(admin_client, project) -> None:
    """Requests/s, completion tokens/s and latency percentiles per model over the last five
    minutes, from what the relay recorded; older calls and failed ones count apart."""
    from datetime import timedelta

    from django.utils import timezone

    from jobs.models import InferenceCall

    now = timezone.now()

    def call(model: str, duration: int, *, status: int = 200, ago: int = 10) -> None:
        InferenceCall.objects.create(
            project=project, model=model, status_code=status, completion_tokens=30,
            duration_ms=duration, first_token_ms=duration // 10, streamed=True,
            created_at=now - timedelta(seconds=ago),
        )  # fmt: skip

    for duration in range(100, 2100, 100):  # 20 calls: 100 ms ... 2000 ms
        call("ft:acme/tiny:p::busy", duration)
    call("ft:acme/tiny:p::busy", 50, status=503)
    call("acme/tiny", 400)
    call("acme/tiny", 999_999, ago=3600)  # an hour ago: outside the window

    page = admin_client.get("/admin/jobs/inferenceserver/").content.decode()
    rows = re.findall(r"<tr>\s*<td><code>(.*?)</code></td>(.*?)</tr>", page, re.S)
    cells = {model: re.findall(r"<td>(.*?)</td>", rest) for model, rest in rows}
    assert list(cells) == ["ft:acme/tiny:p::busy", "acme/tiny"], "busiest first"
    # 21 calls in 300 s, 20 of them answered with 30 tokens each; nearest-rank percentiles.
    assert cells["ft:acme/tiny:p::busy"] == ["21", "1", "0.07", "2.0", "1000 ms", "1900 ms",
                                             "190 ms"]  # fmt: skip
    assert cells["acme/tiny"] == ["1", "0", "0.00", "0.1", "400 ms", "400 ms", "40 ms"]
    assert "999999" not in page
    assert admin_client.get("/admin/jobs/inferencecall/").status_code == 200
