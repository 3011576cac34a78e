"""jobs.services.cloud.provider_webhooks on the real database: the signed per-attempt webhook URL a launch
hands the provider, a call to it polling that attempt at once (once per gap), a forged or
foreign one not found, an expired one refused and an ended attempt's answered without a poll."""

from __future__ import annotations

import time

import pytest
from django.core import signing
from django.utils import timezone

from jobs import tasks
from jobs.errors import NotFound
from jobs.models import JobAttempt
from jobs.services.cloud import provider_webhooks as webhooks
from jobs.states import JobStatus
from providers.base import RemoteStatus
from tests.support.cloud import launched
from tests.support.db import fresh
from trainhub.shared_redis import redis_client
from trainhub_contract import celery_conf as cc

pytestmark = pytest.mark.django_db
S = JobStatus


def test_the_webhook_polls_its_attempt_at_once(
    fake_cloud, make_job, client, sent, django_capture_on_commit_callbacks
) -> None:
    job, attempt = launched(make_job)
    redis_client().delete(f"trainhub:webhook-poll:{attempt.pk}")
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


class _SignedAgo(signing.TimestampSigner):
    """Signs as webhook_url did ``age`` seconds ago."""

    def __init__(self, age: int, salt: str = webhooks.WEBHOOK_SALT) -> None:
        super().__init__(salt=salt)
        self.age = age

    def timestamp(self) -> str:
        return signing.b62_encode(int(time.time()) - self.age)


@pytest.fixture
def attempt(fake_cloud, make_job) -> JobAttempt:
    _, attempt = launched(make_job)
    redis_client().delete(f"trainhub:webhook-poll:{attempt.pk}")
    return attempt


def test_a_url_is_valid_for_the_jobs_max_runtime_and_the_slack(attempt) -> None:
    valid_for = attempt.job.max_runtime_seconds + webhooks.WEBHOOK_SLACK_SECONDS
    assert webhooks.webhook_attempt(_SignedAgo(valid_for - 60).sign(str(attempt.pk))) == attempt.pk
    with pytest.raises(webhooks.WebhookExpired) as info:
        webhooks.webhook_attempt(_SignedAgo(valid_for + 60).sign(str(attempt.pk)))
    assert (info.value.http_status, info.value.code) == (403, "webhook_expired")
    assert f"valid for {valid_for} s" in info.value.message


@pytest.mark.parametrize(
    "token",
    [
        "not-a-token",
        "1:2:3",
        pytest.param("v1", id="a v1 token (no issue time)"),
        pytest.param("other-salt", id="signed for something else"),
    ],
)
def test_a_token_this_control_plane_did_not_issue_is_not_found(attempt, token) -> None:
    if token == "v1":
        token = signing.Signer(salt="trainhub.provider-webhook").sign(str(attempt.pk))
    elif token == "other-salt":
        token = _SignedAgo(0, salt="trainhub.something-else").sign(str(attempt.pk))
    with pytest.raises(NotFound):
        webhooks.webhook_attempt(token)


def test_an_ended_attempts_webhook_is_answered_without_a_poll(
    attempt, client, sent, django_capture_on_commit_callbacks
) -> None:
    JobAttempt.objects.filter(pk=attempt.pk).update(ended_at=timezone.now(), end_reason="oom")
    token = _SignedAgo(0).sign(str(attempt.pk))
    sent.clear()
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(f"/api/v1/webhooks/provider/{token}/", {}, format="json")
    assert response.status_code == 200 and sent.calls == []


def test_repeated_calls_send_one_poll_per_gap(
    attempt, client, sent, django_capture_on_commit_callbacks
) -> None:
    token = _SignedAgo(0).sign(str(attempt.pk))
    sent.clear()
    with django_capture_on_commit_callbacks(execute=True):
        for _ in range(20):
            assert client.post(f"/api/v1/webhooks/provider/{token}/").status_code == 200
    assert sent.named(cc.POLL_ATTEMPT) == [[attempt.pk]]
    ttl = redis_client().ttl(f"trainhub:webhook-poll:{attempt.pk}")
    assert 0 < ttl <= webhooks.POLL_GAP_SECONDS
