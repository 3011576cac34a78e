"""Webhooks through the real processes: the control plane's Celery worker on Redis delivers,
a receiver on loopback verifies with the ``standardwebhooks`` package. A job fails through the
real status service; the message goes over the broker on commit; the worker signs and POSTs;
a receiver that was down gets the same webhook-id once it is back."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from jobs.models import WebhookAttempt, WebhookDelivery
from jobs.services.core.status import job_transition
from jobs.services.outbound import webhook_delivery, webhook_endpoints
from jobs.states import JobStatus
from tests.e2e.conftest import wait_for
from tests.support.webhooks import receiving

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]
D = WebhookDelivery.Status


@pytest.fixture(scope="module")
def control_worker_env() -> dict[str, str]:
    # The receiver listens on loopback over http: the operator allows both for this worker.
    return {"TRAINHUB_WEBHOOK_ALLOW_HTTP": "1", "TRAINHUB_WEBHOOK_ALLOWED_CIDRS": "127.0.0.0/8"}


@pytest.fixture(autouse=True)
def _same_policy_here(settings) -> None:
    settings.TRAINHUB_WEBHOOK_ALLOW_HTTP = True
    settings.TRAINHUB_WEBHOOK_ALLOWED_CIDRS = ["127.0.0.0/8"]


def test_the_worker_delivers_signed_and_retries_until_the_receiver_is_back(
    plane, project, make_job
) -> None:
    # plane: the worker and this process share one storage folder, so the worker's own
    # validation of the uploads make_job stores agrees with this process's.
    control_worker = plane
    with receiving() as receiver:
        _, secret = webhook_endpoints.endpoint_create(
            project=project,
            data={"url": receiver.url, "event_types": ["fine_tuning.job.failed"]},
        )
        receiver.secrets.append(secret)
        job = make_job()
        job_transition(job=job, to=JobStatus.FAILED, error_code="oom", message="OOM")
        wait_for("the first delivery", lambda: receiver.verified(), 30, control_worker)
        [first] = receiver.verified()
        assert first.payload["type"] == "fine_tuning.job.failed"
        assert first.payload["data"]["id"] == job.public_id
        wait_for(
            "the delivery row to settle",
            lambda: WebhookDelivery.objects.filter(status=D.SUCCEEDED).exists(),
            10,
            control_worker,
        )

        receiver.stop()  # down
        second_job = make_job()
        job_transition(job=second_job, to=JobStatus.FAILED, error_code="oom")
        pending = wait_for(
            "a failed try",
            lambda: WebhookDelivery.objects.filter(
                status=D.PENDING, attempts=1, locked_until__isnull=True
            ).first(),
            30,
            control_worker,
        )
        assert "refused" in pending.last_error
        receiver.start()  # back on the same port
        # The retry is due (time moved, not slept) and the beat's run sends it.
        WebhookDelivery.objects.filter(pk=pending.pk).update(
            next_attempt_at=timezone.now() - timedelta(seconds=1)
        )
        assert webhook_delivery.deliveries_send_due() == 1
        wait_for(
            "the retry to arrive",
            lambda: [
                r for r in receiver.verified() if r.payload["data"]["id"] == second_job.public_id
            ],
            30,
            control_worker,
        )
    retried = WebhookDelivery.objects.get(pk=pending.pk)
    wait_for("the retry's row", lambda: fresh_status(retried.pk) == D.SUCCEEDED, 10, control_worker)
    tries = WebhookAttempt.objects.filter(delivery_id=pending.pk).order_by("number")
    assert [t.status_code for t in tries] == [None, 204]
    [arrived] = [r for r in receiver.received if r.payload["data"]["id"] == second_job.public_id]
    assert arrived.webhook_id == retried.message_id
    assert arrived.verified_with == [secret]


def fresh_status(pk: int) -> str:
    return WebhookDelivery.objects.values_list("status", flat=True).get(pk=pk)
