"""Webhook endpoints in the Django admin: created and rotated through the services, the secret
shown once in a message and never on a page; the delivery log with every try."""

from __future__ import annotations

from django.contrib.messages import get_messages

from jobs.models import WebhookAttempt, WebhookDelivery, WebhookEndpoint
from jobs.services.outbound import webhook_endpoints

PUBLIC_URL = "https://93.184.215.14/hooks"


def shown_messages(response) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]


def test_add_shows_the_secret_once_and_never_again(admin_client, project) -> None:
    r = admin_client.post(
        "/admin/jobs/webhookendpoint/add/",
        {
            "project": project.pk,
            "url": PUBLIC_URL,
            "event_types": ["fine_tuning.job.succeeded", "fine_tuning.job.failed"],
            "description": "ops",
            "enabled": "on",
        },
    )
    assert r.status_code == 302, r.content.decode()[:2000]
    endpoint = WebhookEndpoint.objects.get()
    [message] = [m for m in shown_messages(r) if "shown this once" in m]
    secret = message.rsplit(" ", 1)[-1]
    assert secret.startswith("whsec_")
    assert webhook_endpoints.endpoint_signing_secrets(endpoint, endpoint.created_at) == [secret]
    assert endpoint.event_types == ["fine_tuning.job.succeeded", "fine_tuning.job.failed"]
    # The page after the redirect shows the message (once); no page shows it again.
    assert secret in admin_client.get("/admin/jobs/webhookendpoint/").content.decode()
    for page in (
        "/admin/jobs/webhookendpoint/",
        f"/admin/jobs/webhookendpoint/{endpoint.pk}/change/",
    ):
        html = admin_client.get(page).content.decode()
        assert endpoint.public_id in html
        assert secret not in html and endpoint.secret_ciphertext not in html


def test_the_admin_refuses_an_internal_url(admin_client, project) -> None:
    r = admin_client.post(
        "/admin/jobs/webhookendpoint/add/",
        {"project": project.pk, "url": "https://169.254.169.254/", "event_types": ["fine_tuning.job.failed"]},
    )  # fmt: skip
    assert r.status_code == 200
    assert "cloud metadata address" in r.content.decode()
    assert not WebhookEndpoint.objects.exists()


def test_rotate_action_and_delivery_log(admin_client, project) -> None:
    endpoint, first = webhook_endpoints.endpoint_create(
        project=project, data={"url": PUBLIC_URL, "event_types": ["fine_tuning.job.failed"]}
    )
    r = admin_client.post(
        "/admin/jobs/webhookendpoint/",
        {"action": "rotate_secret", "_selected_action": [endpoint.pk]},
    )
    assert r.status_code == 302
    [message] = shown_messages(r)
    new = message.rsplit(" ", 1)[-1]
    endpoint.refresh_from_db()
    assert webhook_endpoints.endpoint_signing_secrets(endpoint, endpoint.updated_at) == [
        new,
        first,
    ]
    delivery = WebhookDelivery.objects.create(
        endpoint=endpoint,
        event_id="evt_1",
        event_type="fine_tuning.job.failed",
        job_public_id="ftjob-x",
        body="{}",
    )
    WebhookAttempt.objects.create(
        delivery=delivery,
        number=1,
        started_at=delivery.created_at,
        status_code=503,
        latency_ms=12,
        response_excerpt="busy, try later",
        error="the receiver answered 503",
    )
    html = admin_client.get(f"/admin/jobs/webhookdelivery/{delivery.pk}/change/").content.decode()
    assert "busy, try later" in html and "the receiver answered 503" in html
    assert admin_client.get("/admin/jobs/webhookdelivery/").status_code == 200
