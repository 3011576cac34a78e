"""Chaos: 50 ``runpod-pod`` jobs against a fake RunPod (real HTTP on loopback) that fails 30%
of calls: 5xx pages, 429s, and for creates and deletes, failures *after* the action took effect
(a 502 or a dropped connection once the pod exists or is gone).

The jobs meet every ending a pod job can have: pods that never accept SSH (readiness deadline,
requeue, then failure), pods that exit unasked (lost, requeued), and user cancels mid-flight.
The tasks the services send are run in this process as a worker would, in order, with beat's
polls and the reconciler in between. The invariants: every job ends in exactly one terminal
state, no attempt ever had two pods, and no pod is left running.
"""

from __future__ import annotations

import functools
import time
from collections import Counter

import pytest

from jobs import tasks
from jobs.models import JobAttempt, JobEvent, TrainingJob
from jobs.services.accounts.projects import credential_create
from jobs.services.cloud import reconcile
from jobs.services.core.jobs import job_cancel
from jobs.states import TERMINAL
from providers import runpod_pod
from providers.http import ProviderHTTP
from tests.support.fakes.runpod_api import API_KEY, FakeRunpod
from trainhub_contract import celery_conf as cc

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]
JOBS = 50
DEADLINE_SECONDS = 240

TASKS = {
    cc.PLACE_JOB: tasks.place_job,
    cc.PROVISION_ATTEMPT: tasks.provision_attempt,
    cc.STOP_MACHINES: tasks.stop_machines,
    cc.POLL_ATTEMPT: tasks.poll_attempt,
}


@pytest.fixture
def chaotic_runpod(settings, monkeypatch) -> FakeRunpod:
    limits = {f"pods.{op}": (2000, 10.0) for op in ("create", "list", "get", "delete")}
    with FakeRunpod(
        failure_rate=0.3, seed=20261123, pod_ready_seconds=0.2, rate_limits=limits
    ) as fake:
        settings.RUNPOD_REST_URL = fake.url
        settings.TRAINHUB_PUBLIC_URL = "http://127.0.0.1:8000"
        settings.TRAINHUB_MACHINE_READY_TIMEOUT_SECONDS = 2  # these pods never offer SSH
        # RunPod's pace, 20 times faster: the backoff and Retry-After waits stay in proportion.
        fast = functools.partial(ProviderHTTP, sleep=lambda seconds: time.sleep(seconds / 20))
        monkeypatch.setattr(runpod_pod, "ProviderHTTP", fast)
        monkeypatch.setattr(runpod_pod, "RATE_LIMITS", {"default": (1800, 10.0)})
        yield fake


def _run_sent_tasks(sent) -> None:
    """Run what the services sent, oldest first, including what those tasks send."""
    while sent.calls:
        name, args = sent.calls.pop(0)
        sent.queues.pop(0)
        if name in TASKS:
            TASKS[name](*args)


def test_fifty_pod_jobs_under_30_percent_failures_all_end_and_leave_no_pod(
    chaotic_runpod, make_job, project, sent
) -> None:
    credential_create(project=project, provider="runpod", name="main", secrets={"api_key": API_KEY})
    project.max_concurrent_jobs = JOBS
    project.save()
    jobs = [make_job(target="runpod-pod", max_attempts=2) for _ in range(JOBS)]
    cancel_these = {j.pk for j in jobs[:15]}
    exit_these = {j.pk for j in jobs[15:25]}
    exited: set[int] = set()
    deadline = time.monotonic() + DEADLINE_SECONDS
    tick = 0
    while time.monotonic() < deadline:
        _run_sent_tasks(sent)
        for attempt in JobAttempt.objects.filter(
            job_id__in=cancel_these | exit_these, ended_at__isnull=True
        ).exclude(provider_instance_id=""):
            if attempt.job_id in cancel_these and attempt.job.status not in TERMINAL:
                job_cancel(job=attempt.job)
            elif attempt.job_id in exit_these and attempt.pk not in exited:
                chaotic_runpod.exit_pod(attempt.provider_instance_id)  # dies unasked
                exited.add(attempt.pk)
        _run_sent_tasks(sent)
        JobAttempt.objects.filter(ended_at__isnull=True).update(next_poll_at=None)
        tasks.poll_target("runpod-pod")
        tasks.place_waiting()  # what beat does: jobs whose offers could not be listed
        tick += 1
        if tick % 5 == 0:
            reconcile.providers_reconcile()
        done = not TrainingJob.objects.exclude(status__in=TERMINAL).exists()
        if done and not sent.calls and not chaotic_runpod.live_pods():
            break
        time.sleep(0.2)

    stats = chaotic_runpod.stats()
    assert sum(stats["injected"].values()) > 50, f"the chaos happened: {stats['injected']}"
    statuses = Counter(TrainingJob.objects.values_list("status", flat=True))
    assert set(statuses) <= set(TERMINAL), f"every job ended: {statuses}"
    assert statuses["cancelled"] >= len(cancel_these)
    # Exactly one terminal status event per job: no job ended twice.
    for job in jobs:
        ends = [
            e.data["status"]
            for e in JobEvent.objects.filter(job=job, type="status", attempt=0)
            if e.data.get("status") in TERMINAL
        ]
        assert len(ends) == 1, (job.public_id, ends)
    created = Counter(chaotic_runpod.created_names())
    assert created and max(created.values()) == 1, "never two pods for one attempt"
    assert not JobAttempt.objects.filter(ended_at__isnull=True).exists()
    assert chaotic_runpod.live_pods() == [], "no pod left billing"
    owned = set(
        JobAttempt.objects.exclude(provider_instance_id="").values_list(
            "provider_instance_id", flat=True
        )
    )
    assert {p["id"] for p in chaotic_runpod.pods(include_terminated=True)} == owned, (
        "every pod created belongs to an attempt"
    )
