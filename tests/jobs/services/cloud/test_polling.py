"""jobs.services.cloud.polling on the real database, through the poll task with the scripted fake
provider: which attempts a poll takes within the target's budget and when each is polled next,
a status the provider could not tell this cycle, and a provider's repeated events stored once."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from jobs import tasks
from jobs.models import JobAttempt, JobEvent
from jobs.services.cloud import polling
from jobs.states import JobStatus
from providers import registry
from providers.base import RemoteStatus
from tests.support.cloud import launched, poll_due
from tests.support.db import fresh
from tests.support.fakes.adapter import register_fake

pytestmark = pytest.mark.django_db
S = JobStatus


def test_polls_take_the_least_recently_polled_attempts_within_the_budget(
    make_job, settings, sent
) -> None:
    settings.TRAINHUB_PUBLIC_URL = "http://127.0.0.1:8000"
    fake = register_fake("small-budget", poll_batch=2)
    try:
        attempts = [launched(make_job, target="small-budget")[1] for _ in range(3)]
        now = timezone.now()
        for minutes, attempt in zip((1, 3, 2), attempts, strict=True):
            JobAttempt.objects.filter(pk=attempt.pk).update(
                next_poll_at=now, polled_at=now - timedelta(minutes=minutes)
            )
        fake.set_state(attempts[1].provider_instance_id, RemoteStatus.RUNNING)

        tasks.poll_target("small-budget")

        assert [h.instance_id for h in fake.polls[-1]] == [
            attempts[1].provider_instance_id,
            attempts[2].provider_instance_id,
        ]
        running, pending = fresh(attempts[1]), fresh(attempts[2])
        assert running.next_poll_at - timezone.now() == pytest.approx(
            timedelta(seconds=polling.POLL_EVERY[RemoteStatus.RUNNING]), abs=timedelta(seconds=3)
        )
        assert pending.next_poll_at - timezone.now() == pytest.approx(
            timedelta(seconds=polling.POLL_EVERY[RemoteStatus.PENDING]), abs=timedelta(seconds=3)
        )
        tasks.poll_target("small-budget")  # only the overdue one is left
        assert [h.instance_id for h in fake.polls[-1]] == [attempts[0].provider_instance_id]
    finally:
        registry.unregister("small-budget")


def test_a_status_unknown_this_cycle_is_neither_lost_nor_renewed(
    fake_cloud, make_job, sent
) -> None:
    _job, attempt = launched(make_job)
    lease = fresh(attempt).lease_expires_at
    fake_cloud.unknown.add(attempt.provider_instance_id)
    poll_due()
    attempt.refresh_from_db()
    assert attempt.ended_at is None and attempt.lease_expires_at == lease


def test_repeated_provider_events_are_stored_once(fake_cloud, make_job, sent) -> None:
    job, attempt = launched(make_job)
    window = tuple(
        {"seq": i, "type": "metrics", "data": {"step": i, "loss": 2.0 - i / 10}} for i in range(3)
    )
    fake_cloud.set_state(attempt.provider_instance_id, RemoteStatus.RUNNING, events=window)
    poll_due()
    poll_due()
    fake_cloud.set_state(
        attempt.provider_instance_id,
        RemoteStatus.RUNNING,
        events=(*window[1:], {"seq": 3, "type": "metrics", "data": {"step": 3}}),
    )
    poll_due()
    assert list(
        JobEvent.objects.filter(job=job, attempt=1).order_by("seq").values_list("seq", flat=True)
    ) == [0, 1, 2, 3]
    assert fresh(job).status == S.RUNNING
