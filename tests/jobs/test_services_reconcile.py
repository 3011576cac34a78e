"""jobs.services.reconcile on the real database with the scripted fake provider: the reconciler
terminates only the machines no live attempt owns (an ended attempt's, a stranger's), never a
live one nor one whose launch is still in flight."""

from __future__ import annotations

import pytest
from django.utils import timezone

from jobs.models import JobAttempt, JobEvent
from jobs.services import reconcile
from jobs.services.attempts import attempt_start, machine_name
from tests.jobs._cloud import launched
from tests.jobs._db import fresh

pytestmark = pytest.mark.django_db


def test_the_reconciler_terminates_only_machines_no_live_attempt_owns(
    fake_cloud, make_job, sent
) -> None:
    _live_job, live = launched(make_job)
    ended_job, ended = launched(make_job)
    JobAttempt.objects.filter(pk=ended.pk).update(ended_at=timezone.now(), end_reason="oom")
    fake_cloud.states["stranger"] = fake_cloud.states[live.provider_instance_id]
    fake_cloud.names["stranger"] = "trainhub-ftjob-unknown-a1"
    # A launch in flight: the machine exists, the attempt has not stored its id yet.
    flight_job = make_job(target="fake-cloud")
    fake_cloud.on_launch = lambda request: None

    flight = attempt_start(job=flight_job, target="fake-cloud")
    fake_cloud.states["in-flight"] = fake_cloud.states[live.provider_instance_id]
    fake_cloud.names["in-flight"] = machine_name(flight)

    assert reconcile.providers_reconcile() == 2

    assert sorted(fake_cloud.cancelled_ids) == sorted([ended.provider_instance_id, "stranger"])
    note = JobEvent.objects.filter(job=ended_job, message__startswith="Reconciler").get()
    assert "attempt 1 ended (oom)" in note.message
    assert fresh(live).ended_at is None
