"""jobs.services.webhooks on the real database: the signed per-attempt webhook URL a launch
hands the provider, a call to it polling that attempt at once, and a forged one refused."""

from __future__ import annotations

import pytest

from gpu_worker import celery_conf as cc
from jobs import tasks
from jobs.states import JobStatus
from providers.base import RemoteStatus
from tests.jobs._cloud import launched
from tests.jobs._db import fresh

pytestmark = pytest.mark.django_db
S = JobStatus


def test_the_webhook_polls_its_attempt_at_once(
    fake_cloud, make_job, client, sent, django_capture_on_commit_callbacks
) -> None:
    job, attempt = launched(make_job)
    request = fake_cloud.launches[-1]
    assert request.webhook_url.startswith("http://127.0.0.1:8000/api/v1/webhooks/provider/")

    path = request.webhook_url.removeprefix("http://127.0.0.1:8000")
    with django_capture_on_commit_callbacks(execute=True):  # the request commits
        response = client.post(path, {"id": "anything", "status": "COMPLETED"}, format="json")
    assert response.status_code == 200
    assert sent.named(cc.POLL_ATTEMPT) == [[attempt.pk]]

    forged = path.replace(path.split("/")[-2], f"{attempt.pk}:forged")
    response = client.post(forged, {}, content_type="application/json")
    assert response.status_code == 404 and response.json()["error"]["code"] == "not_found"

    fake_cloud.set_state(attempt.provider_instance_id, RemoteStatus.RUNNING)
    tasks.poll_attempt(attempt.pk)
    assert fresh(job).status == S.RUNNING
