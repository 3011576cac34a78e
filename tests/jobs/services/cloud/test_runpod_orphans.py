"""Orphan provider jobs on the real database and Redis: a RunPod job that ran twice after an
ambiguous ``/run`` shows itself only in a webhook body (RunPod cannot list jobs). A job id that
no attempt owns is noted once and counted; the reconciler cancels it with the key of the
attempt whose webhook named it, counts the cancel, and tells the job. Its own job, another
attempt's, a launch storing its id and a repeated webhook are not orphans; a cancel that fails
is tried again at the next run."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from jobs.models import JobAttempt, JobEvent
from jobs.services.cloud import provider_webhooks as webhooks
from jobs.services.cloud import reconcile
from jobs.services.core.attempts import attempt_start
from providers.errors import TransientProviderError
from tests.support.cloud import launched
from tests.support.fakes.adapter import FakeAdapter
from trainhub.shared_redis import redis_client

pytestmark = pytest.mark.django_db
DUPLICATE = "60902e6c-5a3e-4b8f-b1c4-0f9e6b2d7a11-u1"  # shaped like RunPod's job ids


@pytest.fixture(autouse=True)
def _clean_redis() -> Iterator[None]:
    def clean() -> None:
        client = redis_client()
        seen = client.keys(webhooks.ORPHAN_SEEN_PREFIX + "*")
        client.delete(
            webhooks.ORPHANS_PENDING_KEY,
            webhooks.ORPHANS_SEEN_METRIC,
            webhooks.ORPHANS_CANCELLED_METRIC,
            *seen,
        )

    clean()
    yield
    clean()


def _webhook_path(fake_cloud: FakeAdapter) -> str:
    return fake_cloud.launches[-1].webhook_url.removeprefix("http://127.0.0.1:8000")


def _call(client: Any, path: str, body: object) -> None:
    response = client.post(path, json.dumps(body), content_type="application/json")
    assert response.status_code == 200 and response.json() == {"received": True}


def test_a_job_no_attempt_owns_is_noted_once_then_cancelled_and_counted(
    fake_cloud, make_job, client
) -> None:
    job, attempt = launched(make_job)
    path = _webhook_path(fake_cloud)
    # RunPod's webhook body is the job's /status object.
    completed = {"id": DUPLICATE, "status": "COMPLETED", "delayTime": 31618, "executionTime": 1437}
    _call(client, path, completed)
    _call(client, path, completed)  # RunPod repeats a webhook: counted once
    assert webhooks.orphan_jobs_pending() == {DUPLICATE: attempt.pk}
    assert webhooks.orphan_job_metrics() == {"seen": 1, "cancelled": 0}

    assert reconcile.providers_reconcile() == 1
    assert fake_cloud.cancelled_ids == [DUPLICATE], "the live attempt's own job is left alone"
    assert JobAttempt.objects.get(pk=attempt.pk).ended_at is None
    assert webhooks.orphan_jobs_pending() == {}
    assert webhooks.orphan_job_metrics() == {"seen": 1, "cancelled": 1}
    event = JobEvent.objects.filter(job=job, message__contains=DUPLICATE).get()
    assert event.level == "warning" and "ran a launch twice" in event.message

    assert reconcile.providers_reconcile() == 0, "cancelled once"
    assert fake_cloud.cancelled_ids == [DUPLICATE]


def test_the_attempts_own_job_and_another_attempts_are_not_orphans(
    fake_cloud, make_job, client
) -> None:
    _job, attempt = launched(make_job)
    path = _webhook_path(fake_cloud)
    _other_job, other = launched(make_job)
    _call(client, path, {"id": attempt.provider_instance_id, "status": "COMPLETED"})
    _call(client, path, {"id": other.provider_instance_id, "status": "FAILED"})
    # Not a job id: a forged body cannot name just anything.
    _call(client, path, {"id": "../../etc" + "x" * 200, "status": "COMPLETED"})
    _call(client, path, ["not", "an", "object"])
    response = client.post(path, "{not json", content_type="application/json")
    assert response.status_code == 200, "the body is a hint: a bad one still polls"
    assert webhooks.orphan_jobs_pending() == {}
    assert webhooks.orphan_job_metrics() == {"seen": 0, "cancelled": 0}


def test_a_launch_still_storing_its_id_is_not_second_guessed(fake_cloud, make_job) -> None:
    job = make_job(target="fake-cloud")
    flight = attempt_start(job=job, target="fake-cloud")  # no provider id stored yet
    assert not webhooks.webhook_job_seen(attempt_pk=flight.pk, job_id=DUPLICATE)
    assert webhooks.orphan_jobs_pending() == {}


def test_a_cancel_that_fails_is_tried_again_and_one_owned_meanwhile_is_dropped(
    fake_cloud, make_job
) -> None:
    _job, attempt = launched(make_job)
    assert webhooks.webhook_job_seen(attempt_pk=attempt.pk, job_id=DUPLICATE)
    assert webhooks.webhook_job_seen(attempt_pk=attempt.pk, job_id="claimed-later")

    def refuse(handle: Any) -> None:
        raise TransientProviderError("runpod-serverless POST /cancel returned HTTP 502")

    original = fake_cloud.cancel
    fake_cloud.cancel = refuse  # type: ignore[method-assign]
    # An attempt came to own the second id meanwhile (the launch's answer arrived after all).
    JobAttempt.objects.filter(pk=attempt.pk).update(provider_instance_id="claimed-later")
    assert reconcile.orphan_jobs_cancel() == 0
    assert webhooks.orphan_jobs_pending() == {DUPLICATE: attempt.pk}, "kept for the next run"

    fake_cloud.cancel = original  # type: ignore[method-assign]
    assert reconcile.orphan_jobs_cancel() == 1
    assert fake_cloud.cancelled_ids == [DUPLICATE]
    assert webhooks.orphan_job_metrics() == {"seen": 2, "cancelled": 1}
