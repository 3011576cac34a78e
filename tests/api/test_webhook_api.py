"""The webhook endpoints API: create (the secret shown once), list, retrieve, update, delete,
rotate, the delivery log and redeliver; bad input named by field; other projects' endpoints
are 404."""

from __future__ import annotations

import logging

import pytest
from standardwebhooks import Webhook

from jobs import crypto
from jobs.models import WebhookDelivery, WebhookEndpoint
from jobs.services.core.status import job_transition
from jobs.services.outbound import webhook_endpoints
from jobs.states import JobStatus
from tests.support.webhooks import delivery_messages, receiving

BASE = "/api/v1/webhook_endpoints"
PUBLIC_URL = "https://93.184.215.14/hooks"  # a public address literal: no DNS in tests
FAILED = "fine_tuning.job.failed"


@pytest.fixture
def created(api) -> dict:
    r = api.post(BASE, {"url": PUBLIC_URL, "event_types": [FAILED]}, format="json")
    assert r.status_code == 201, r.json()
    return r.json()


def test_create_shows_the_secret_once(api, created, caplog) -> None:
    secret = created["secret"]
    assert secret.startswith("whsec_")
    Webhook(secret)  # the reference library takes it
    assert created["id"].startswith("whep-")
    assert created["object"] == "webhook_endpoint"
    assert created["url"] == PUBLIC_URL and created["event_types"] == [FAILED]
    assert created["enabled"] is True and created["disabled_reason"] is None
    row = WebhookEndpoint.objects.get(public_id=created["id"])
    assert secret not in row.secret_ciphertext  # encrypted at rest
    assert crypto.decrypt_json(row.secret_ciphertext) == {"secret": secret}
    with caplog.at_level(logging.DEBUG):
        listed = api.get(BASE).json()
        one = api.get(f"{BASE}/{created['id']}/").json()
    assert [e["id"] for e in listed["data"]] == [created["id"]]
    assert listed["object"] == "list" and listed["has_more"] is False
    for body in (listed["data"][0], one):
        assert "secret" not in body
        assert secret not in str(body)
    assert secret not in caplog.text


def test_create_answers_the_slashless_path_and_dedupes_types(api) -> None:
    r = api.post(
        BASE.rstrip("/"),
        {"url": PUBLIC_URL, "event_types": [FAILED, "fine_tuning.job.running", FAILED],
         "description": "ci", "enabled": False},
        format="json",
    )  # fmt: skip
    assert r.status_code == 201
    assert r.json()["event_types"] == [FAILED, "fine_tuning.job.running"]
    assert r.json()["enabled"] is False and r.json()["description"] == "ci"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"event_types": [FAILED]}, "url"),
        ({"url": PUBLIC_URL}, "event_types"),
        ({"url": 5, "event_types": [FAILED]}, "url"),
        ({"url": "ftp://93.184.215.14/x", "event_types": [FAILED]}, "url"),
        ({"url": "https://user:pw@93.184.215.14/x", "event_types": [FAILED]}, "url"),
        ({"url": "https:///nohost", "event_types": [FAILED]}, "url"),
        ({"url": "https://93.184.215.14:99999/", "event_types": [FAILED]}, "url"),
        ({"url": PUBLIC_URL, "event_types": []}, "event_types"),
        ({"url": PUBLIC_URL, "event_types": "fine_tuning.job.failed"}, "event_types"),
        ({"url": PUBLIC_URL, "event_types": [FAILED, "job.done"]}, "event_types.1"),
        ({"url": PUBLIC_URL, "event_types": [FAILED], "enabled": "yes"}, "enabled"),
        ({"url": PUBLIC_URL, "event_types": [FAILED], "description": "x" * 201}, "description"),
        ({"url": PUBLIC_URL, "event_types": [FAILED], "secret": "whsec_AAAA"}, "secret"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(api, body, param) -> None:
    r = api.post(BASE, body, format="json")
    assert r.status_code == 400, r.json()
    error = r.json()["error"]
    assert error["param"] == param
    assert error["type"] == "invalid_request_error" and error["message"]
    assert WebhookEndpoint.objects.count() == 0


def test_update_changes_what_it_is_given(api, created) -> None:
    url = f"{BASE}/{created['id']}"
    r = api.patch(url, {"event_types": ["fine_tuning.job.succeeded"]}, format="json")
    assert r.status_code == 200
    assert r.json()["event_types"] == ["fine_tuning.job.succeeded"]
    assert r.json()["url"] == PUBLIC_URL
    r = api.patch(url, {"enabled": False}, format="json")
    assert r.json()["enabled"] is False and r.json()["disabled_reason"] == "disabled by a user"
    r = api.patch(url, {"url": "http://93.184.215.14/x"}, format="json")
    assert r.status_code == 400 and r.json()["error"]["param"] == "url"
    assert "https" in r.json()["error"]["message"]
    r = api.patch(url, {"enabled": True, "description": "back"}, format="json")
    assert r.json()["enabled"] is True and r.json()["disabled_reason"] is None
    assert "secret" not in r.json()


def test_rotate_shows_the_new_secret_once_and_reports_the_overlap(api, created) -> None:
    r = api.post(f"{BASE}/{created['id']}/rotate_secret")
    assert r.status_code == 200
    body = r.json()
    assert body["secret"].startswith("whsec_") and body["secret"] != created["secret"]
    assert body["previous_secret_expires_at"] > body["updated_at"] - 5
    again = api.get(f"{BASE}/{created['id']}").json()
    assert "secret" not in again
    endpoint = WebhookEndpoint.objects.get(public_id=created["id"])
    from django.utils import timezone

    assert webhook_endpoints.endpoint_signing_secrets(endpoint, timezone.now()) == [
        body["secret"],
        created["secret"],
    ]


def test_delete(api, created) -> None:
    r = api.delete(f"{BASE}/{created['id']}/")
    assert r.json() == {"id": created["id"], "object": "webhook_endpoint", "deleted": True}
    assert api.get(f"{BASE}/{created['id']}").status_code == 404


def test_another_projects_endpoint_is_404_everywhere(api, make_user, make_client) -> None:
    other = make_client(make_user("bob"))
    theirs = other.post(BASE, {"url": PUBLIC_URL, "event_types": [FAILED]}, format="json").json()
    tid = theirs["id"]
    for method, path in [
        ("get", f"{BASE}/{tid}"),
        ("patch", f"{BASE}/{tid}"),
        ("delete", f"{BASE}/{tid}"),
        ("post", f"{BASE}/{tid}/rotate_secret"),
        ("get", f"{BASE}/{tid}/deliveries"),
        ("post", f"{BASE}/{tid}/deliveries/msg_x/redeliver"),
    ]:
        r = getattr(api, method)(path, {"enabled": False}, format="json")
        assert r.status_code == 404, (method, path)
        assert r.json()["error"]["code"] == "webhook_endpoint_not_found"
    assert api.get(BASE).json()["data"] == []
    endpoint = WebhookEndpoint.objects.get(public_id=tid)
    assert endpoint.enabled  # untouched


def test_pagination(api) -> None:
    ids = [
        api.post(BASE, {"url": PUBLIC_URL, "event_types": [FAILED]}, format="json").json()["id"]
        for _ in range(3)
    ]
    page = api.get(BASE, {"limit": 2}).json()
    assert [e["id"] for e in page["data"]] == ids[::-1][:2] and page["has_more"]
    rest = api.get(BASE, {"limit": 2, "after": page["data"][-1]["id"]}).json()
    assert [e["id"] for e in rest["data"]] == [ids[0]] and not rest["has_more"]
    r = api.get(BASE, {"after": "whep-nope"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "after"


def test_the_endpoint_limit(api) -> None:
    for _ in range(webhook_endpoints.MAX_ENDPOINTS_PER_PROJECT):
        api.post(BASE, {"url": PUBLIC_URL, "event_types": [FAILED]}, format="json")
    r = api.post(BASE, {"url": PUBLIC_URL, "event_types": [FAILED]}, format="json")
    assert r.status_code == 409 and r.json()["error"]["code"] == "webhook_endpoint_limit"


def test_deliveries_log_and_redeliver(
    api, make_job, settings, sent, django_capture_on_commit_callbacks
) -> None:
    from jobs import tasks

    settings.TRAINHUB_WEBHOOK_ALLOW_HTTP = True
    settings.TRAINHUB_WEBHOOK_ALLOWED_CIDRS = ["127.0.0.0/8"]
    with receiving(statuses=[500], body=b'{"ok": false}') as receiver:
        created = api.post(
            BASE, {"url": receiver.url, "event_types": [FAILED]}, format="json"
        ).json()
        receiver.secrets.append(created["secret"])
        job = make_job()
        with django_capture_on_commit_callbacks(execute=True):
            job_transition(job=job, to=JobStatus.FAILED, error_code="oom", message="OOM")
        [pk] = delivery_messages(sent)
        tasks.deliver_webhook(pk)

        listed = api.get(f"{BASE}/{created['id']}/deliveries").json()
        [d] = listed["data"]
        assert d["object"] == "webhook_endpoint.delivery"
        assert d["id"].startswith("msg_") and d["event_id"].startswith("evt_")
        assert d["event_type"] == FAILED and d["job_id"] == job.public_id
        assert d["status"] == "pending" and d["next_attempt_at"] is not None
        assert d["last_status_code"] == 500
        assert d["payload"]["data"]["error"] == {"code": "oom", "message": "OOM"}
        [t] = d["attempts"]
        assert t["number"] == 1 and t["status_code"] == 500
        assert t["response_excerpt"] == '{"ok": false}'
        assert t["error"] == "the receiver answered 500" and t["latency_ms"] >= 0

        with django_capture_on_commit_callbacks(execute=True):
            r = api.post(f"{BASE}/{created['id']}/deliveries/{d['id']}/redeliver")
        assert r.status_code == 202 and r.json()["status"] == "pending"
        assert delivery_messages(sent) == [pk]
        tasks.deliver_webhook(pk)
    after = api.get(f"{BASE}/{created['id']}/deliveries", {"status": "succeeded"}).json()
    [d] = after["data"]
    assert [t["status_code"] for t in d["attempts"]] == [500, 204]
    assert d["delivered_at"] is not None and d["next_attempt_at"] is None
    assert len({r.webhook_id for r in receiver.received}) == 1
    assert api.get(f"{BASE}/{created['id']}/deliveries", {"status": "nope"}).status_code == 400
    r = api.post(f"{BASE}/{created['id']}/deliveries/msg_unknown/redeliver")
    assert r.status_code == 404
    api.patch(f"{BASE}/{created['id']}", {"enabled": False}, format="json")
    r = api.post(f"{BASE}/{created['id']}/deliveries/{d['id']}/redeliver")
    assert r.status_code == 409 and r.json()["error"]["code"] == "webhook_endpoint_disabled"
    assert WebhookDelivery.objects.count() == 1
