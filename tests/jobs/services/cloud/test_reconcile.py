"""jobs.services.cloud.reconcile on the real database with the scripted fake provider: the reconciler
terminates only the machines no live attempt owns (an ended attempt's, a stranger's), never a
live one nor one whose launch is still in flight, and tells a job only about machines listed
under its project's account (a tenant naming a machine after another's job:
tests/security/test_operations.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.utils import timezone

from jobs.models import JobAttempt, JobEvent
from jobs.services.accounts.projects import credential_create
from jobs.services.cloud import reconcile
from jobs.services.core.attempts import attempt_start, machine_name
from providers import registry
from tests.support.cloud import launched
from tests.support.db import fresh
from tests.support.factories import ProjectFactory
from tests.support.fakes.adapter import FakeAdapter

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


@pytest.fixture
def keyed_cloud(settings) -> Iterator[dict[str, FakeAdapter]]:
    """A cloud needing a 'vastai' key whose machines are per account (api key → adapter); the
    real Vast target is left out meanwhile."""
    settings.TRAINHUB_OPERATOR_API_KEYS = {}
    settings.TRAINHUB_PUBLIC_URL = "http://127.0.0.1:8000"
    accounts: dict[str, FakeAdapter] = {}
    real = registry.get("vastai")
    registry.unregister("vastai")
    registry.register(
        registry.Target(
            name="keyed-cloud",
            description="Scripted per-account fake provider (tests only).",
            kind=registry.TargetKind.SERVERLESS,
            credential_kind="vastai",
            adapter_factory=lambda s: accounts.setdefault(s["api_key"], FakeAdapter("keyed-cloud")),
        )
    )
    yield accounts
    registry.unregister("keyed-cloud")
    if real is not None:
        registry.register(real)


def test_a_live_machine_is_spared_even_after_its_project_changed_keys(
    keyed_cloud, make_job, project, caplog
) -> None:
    credential = credential_create(
        project=project, provider="vastai", name="k", secrets={"api_key": "vk_old"}
    )
    _job, live = launched(make_job, target="keyed-cloud")
    ended_job, ended = launched(make_job, target="keyed-cloud")
    JobAttempt.objects.filter(pk=ended.pk).update(ended_at=timezone.now(), end_reason="oom")
    # The project moves to another account; the old one is still listed (another project uses it).
    credential.delete()
    credential_create(project=project, provider="vastai", name="k", secrets={"api_key": "vk_new"})
    other = ProjectFactory()
    credential_create(project=other, provider="vastai", name="k", secrets={"api_key": "vk_old"})
    events = JobEvent.objects.filter(job=ended_job).count()

    with caplog.at_level("WARNING", logger="jobs.services.cloud.reconcile"):
        assert reconcile.providers_reconcile() == 1

    assert keyed_cloud["vk_old"].cancelled_ids == [ended.provider_instance_id]
    assert fresh(live).ended_at is None, "spared by its instance id, whichever account lists it"
    assert JobEvent.objects.filter(job=ended_job).count() == events, "not the job's account now"
    assert f"{ended_job.public_id} is not told" in caplog.text
