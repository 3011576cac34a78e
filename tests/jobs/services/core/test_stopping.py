"""jobs.services.core.stopping on the real database, through the tasks with the scripted fake
provider: the two-phase stop of a cloud attempt's machine (a cancel racing the run's completion
ends in one terminal state, a stop the provider did not confirm is sent again) and the machine
of a succeeded attempt stopped too."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from jobs import tasks
from jobs.models import JobAttempt, JobEvent
from jobs.services.core import stopping
from jobs.services.core.attempts import attempt_end
from jobs.services.core.jobs import job_cancel
from jobs.states import EndReason, JobStatus
from providers.base import RemoteStatus
from tests.support.cloud import launched, poll_due
from tests.support.db import fresh
from trainhub_contract import celery_conf as cc

pytestmark = pytest.mark.django_db
S = JobStatus


def test_a_cancel_racing_completion_ends_in_exactly_one_terminal_state(
    fake_cloud, make_job, django_capture_on_commit_callbacks, sent
) -> None:
    job, attempt = launched(make_job)
    fake_cloud.set_state(attempt.provider_instance_id, RemoteStatus.RUNNING)
    poll_due()
    with django_capture_on_commit_callbacks(execute=True):
        job_cancel(job=fresh(job))
    # The run finished at the provider before the cancel reached it.
    fake_cloud.set_state(attempt.provider_instance_id, RemoteStatus.SUCCEEDED)
    tasks.stop_machines(job.pk)
    fake_cloud.set_state(attempt.provider_instance_id, RemoteStatus.SUCCEEDED)
    poll_due()

    job.refresh_from_db()
    assert job.status == S.CANCELLED
    assert fresh(attempt).end_reason == "cancelled"
    assert sent.named(cc.INGEST_ARTIFACT) == []
    statuses = JobEvent.objects.filter(job=job, type="status", attempt=0)
    terminal = [
        e.data["status"]
        for e in statuses
        if e.data.get("status") in ("succeeded", "cancelled", "failed")
    ]
    assert terminal == ["cancelled"]


def test_a_stop_the_provider_did_not_confirm_is_sent_again(
    fake_cloud, make_job, django_capture_on_commit_callbacks, sent
) -> None:
    job, attempt = launched(make_job)
    with django_capture_on_commit_callbacks(execute=True):
        job_cancel(job=fresh(job))
    tasks.stop_machines(job.pk)
    # The provider ignored the stop: the machine still runs.
    fake_cloud.set_state(attempt.provider_instance_id, RemoteStatus.RUNNING)
    poll_due()
    assert len(fake_cloud.cancels) == 1, "not re-sent within the resend interval"
    JobAttempt.objects.filter(pk=attempt.pk).update(
        stop_requested_at=timezone.now() - timedelta(seconds=stopping.STOP_RESEND_SECONDS + 1)
    )
    poll_due()
    assert len(fake_cloud.cancels) == 2
    assert fresh(job).status == S.CANCELLING


def test_a_succeeded_attempts_machine_stops_billing_too(
    fake_cloud, make_job, django_capture_on_commit_callbacks, sent
) -> None:
    job, attempt = launched(make_job)
    with django_capture_on_commit_callbacks(execute=True):
        attempt_end(attempt=fresh(attempt), reason=EndReason.SUCCEEDED, message="adapter verified")
    assert sent.named(cc.STOP_MACHINES) == [[job.pk]]
    tasks.stop_machines(job.pk)
    assert fake_cloud.cancelled_ids == [attempt.provider_instance_id]
    tasks.stop_machines(job.pk)  # an ended attempt whose stop was sent is not asked again
    assert len(fake_cloud.cancels) == 1
