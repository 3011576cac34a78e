"""jobs.services.scheduling.dispatch on the real database: queued own-fleet jobs placed on idle nodes that
fit (highest priority, then oldest first), the waiting reason of a job no node takes, the
run_attempt message (the attempt's ids, nothing else), a node's claim of its attempt (its spec
with signed transfer URLs, and the report token its executor reports with), and the re-send
beat repeats for unclaimed attempts. Celery messages are recorded (``sent``), never sent; the
fleet fixtures are in conftest.py, the helpers in _fleet.py."""

from __future__ import annotations

import json
import threading
from datetime import timedelta
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from django.core import signing
from django.db import connections, transaction
from django.utils import timezone

from jobs import storage
from jobs.models import GpuNode, JobAttempt, JobEvent, TrainingJob
from jobs.services.core import specs
from jobs.services.core.attempts import (
    attempt_record_events,
    attempt_start,
    attempts_expire_leases,
)
from jobs.services.core.jobs import job_cancel
from jobs.services.fleet import nodes
from jobs.services.runners import node as runners_node
from jobs.services.runners.node import attempts_resend_unclaimed
from jobs.services.scheduling import dispatch
from jobs.states import JobStatus
from jobs.storage import transfer
from tests.support.db import fresh
from tests.support.fleet import (
    H100,
    T4,
    attempt_of,
    expire_lease,
    node_report,
    online_node,
    run_messages,
)
from trainhub_contract import celery_conf as cc
from trainhub_contract.spec import parse_job_spec

pytestmark = pytest.mark.django_db
S = JobStatus
N = GpuNode.Status


def _grant(url: str) -> dict[str, Any]:
    """What a signed transfer URL allows (key, method, expiry, size cap)."""
    token = parse_qs(urlsplit(url).query)["t"][0]
    return signing.loads(token, salt=transfer.SALT)


def _waiting_notes(job: TrainingJob, text: str) -> int:
    return JobEvent.objects.filter(job=job, type="log", message__contains=text).count()


def _backdate(attempt: JobAttempt, seconds: int) -> None:
    JobAttempt.objects.filter(pk=attempt.pk).update(
        created_at=timezone.now() - timedelta(seconds=seconds)
    )


# --- dispatch ---------------------------------------------------------------------------------


def test_a_local_job_entering_queued_sends_a_dispatch(
    make_job, django_capture_on_commit_callbacks, sent
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        job = make_job()
    assert job.status == S.QUEUED
    assert sent.named(cc.DISPATCH) == [[]]


def test_dispatch_places_the_highest_priority_then_the_oldest_job_first(
    make_job, dispatch_now
) -> None:
    online_node("gpu-a")
    online_node("gpu-b")
    low_old = make_job()
    high_old = make_job()
    high_new = make_job()
    TrainingJob.objects.filter(pk__in=[high_old.pk, high_new.pk]).update(priority=5)

    assert dispatch_now() == 2

    assert attempt_of(high_old).node_name == "gpu-a"
    assert attempt_of(high_new).node_name == "gpu-b"
    assert fresh(low_old).status == S.QUEUED
    assert "every node that fits is busy" in low_old.waiting_reason


def test_dispatch_uses_only_an_idle_node_that_fits(make_job, dispatch_now) -> None:
    online_node("a-cpu")
    online_node("b-t4", T4)
    online_node("c-h100", H100)
    job = make_job(gpu={"min_vram_gb": 40})

    assert dispatch_now() == 1

    assert attempt_of(job).node_name == "c-h100"
    assert fresh(job).status == S.PROVISIONING
    node = GpuNode.objects.get(name="c-h100")
    assert (node.status, node.current_attempt_id) == (N.BUSY, attempt_of(job).pk)
    assert set(GpuNode.objects.filter(status=N.IDLE).values_list("name", flat=True)) == {
        "a-cpu",
        "b-t4",
    }


def test_dispatch_places_by_label_selector(make_job, dispatch_now) -> None:
    online_node("a-us", region="us-east")
    online_node("b-eu", region="eu-west")
    job = make_job(node_selector={"region": "eu-*"})
    assert dispatch_now() == 1
    assert attempt_of(job).node_name == "b-eu"


def test_a_job_cancelled_while_dispatch_runs_is_not_placed(
    make_job, dispatch_now, monkeypatch, sent
) -> None:
    online_node("gpu-a")
    doomed, other = make_job(), make_job()
    real_misfit = dispatch.misfit

    def cancel_first(gpu, selector, n):  # the dispatcher has read the queue by now
        if TrainingJob.objects.filter(pk=doomed.pk, status=S.QUEUED).exists():
            job_cancel(job=doomed)
        return real_misfit(gpu, selector, n)

    monkeypatch.setattr(dispatch, "misfit", cancel_first)

    assert dispatch_now() == 1

    assert fresh(doomed).status == S.CANCELLED
    assert not JobAttempt.objects.filter(job=doomed).exists()
    assert attempt_of(other).node_name == "gpu-a", "the node went to the next job"
    assert [m["job_id"] for _, m in run_messages(sent)] == [other.public_id]


def test_a_draining_node_is_never_used(make_job, dispatch_now, sent) -> None:
    node, _ = online_node("gpu-a")
    nodes.node_set_draining(node=node, draining=True)
    job = make_job()

    assert dispatch_now() == 0

    assert fresh(job).status == S.QUEUED
    assert "gpu-a (draining)" in job.waiting_reason
    assert run_messages(sent) == []
    assert fresh(node).current_attempt_id is None


def test_an_ephemeral_node_is_not_given_a_second_job(make_job, dispatch_now) -> None:
    node, _ = nodes.node_create(name="gpu-e")
    nodes.node_register(node=node, report=node_report(ephemeral=True))
    first = make_job()
    assert dispatch_now() == 1
    attempt = attempt_of(first)
    attempt_record_events(
        job_id=first.public_id,
        attempt_number=1,
        events=[{"seq": 1, "type": "error", "message": "CUDA OOM", "data": {"code": "oom"}}],
    )
    assert fresh(attempt).ended_at is not None
    second = make_job()

    dispatch_now()

    assert not JobAttempt.objects.filter(job=second).exists()


# --- waiting reasons --------------------------------------------------------------------------


def test_of_two_jobs_for_one_node_the_second_waits_naming_the_busy_node(
    make_job, dispatch_now
) -> None:
    online_node("gpu-a")
    first, second = make_job(), make_job()

    assert dispatch_now() == 1

    assert fresh(first).status == S.PROVISIONING and first.waiting_reason == ""
    second.refresh_from_db()
    assert second.status == S.QUEUED
    assert (
        second.waiting_reason == "Waiting for a node: every node that fits is busy: gpu-a (busy)."
    )
    assert _waiting_notes(second, "gpu-a (busy)") == 1
    assert not JobAttempt.objects.filter(job=second).exists()


def test_without_nodes_a_job_waits_saying_no_node_is_registered(make_job, dispatch_now) -> None:
    job = make_job()
    assert dispatch_now() == 0
    assert "no GPU node is registered" in fresh(job).waiting_reason


def test_a_job_that_fits_no_online_node_says_why_per_node(make_job, dispatch_now) -> None:
    online_node("a-cpu")
    stopped, _ = online_node("b-h100", H100)
    nodes.node_stopping(node=stopped)
    job = make_job(gpu={"count": 1})

    assert dispatch_now() == 0

    assert fresh(job).waiting_reason == (
        "No online node fits this job: a-cpu has 0 GPU(s), the job needs 1. "
        "Fitting but offline: b-h100."
    )


def test_the_waiting_reason_is_noted_once_not_on_every_pass(make_job, dispatch_now) -> None:
    job = make_job()
    for _ in range(3):
        dispatch_now()
    assert _waiting_notes(job, "no GPU node is registered") == 1

    online_node("gpu-cpu")
    jumps_the_queue = make_job()
    TrainingJob.objects.filter(pk=jumps_the_queue.pk).update(priority=1)
    for _ in range(2):
        dispatch_now()
    assert _waiting_notes(job, "gpu-cpu (busy)") == 1
    assert _waiting_notes(job, "no GPU node is registered") == 1


def test_a_waiting_job_is_placed_when_a_node_turns_idle_and_its_reason_cleared(
    make_job, dispatch_now, django_capture_on_commit_callbacks, sent
) -> None:
    node, _ = nodes.node_create(name="gpu-a")
    job = make_job()
    dispatch_now()
    assert "every GPU node is offline" in fresh(job).waiting_reason

    with django_capture_on_commit_callbacks(execute=True):
        nodes.node_heartbeat(node=node)
    assert sent.named(cc.DISPATCH) == [[]]
    assert dispatch_now() == 1

    job.refresh_from_db()
    assert (job.status, job.waiting_reason) == (S.PROVISIONING, "")
    assert attempt_of(job).node_name == "gpu-a"


@pytest.mark.django_db(transaction=True)
def test_a_node_whose_row_is_held_meanwhile_is_looked_at_again_in_a_second(
    make_job, dispatch_now, sent
) -> None:
    """A heartbeat (or another dispatcher) holding the idle node's row makes the pass skip it;
    nothing else would ring for that node, so the dispatcher asks for another pass, once."""
    node, _ = online_node("gpu-a")
    jobs = [make_job(), make_job()]
    held, release = threading.Event(), threading.Event()

    def hold_the_row() -> None:  # another connection, as the node's heartbeat request is
        try:
            with transaction.atomic():
                GpuNode.objects.select_for_update().get(pk=node.pk)
                held.set()
                release.wait(10)
        finally:
            connections.close_all()

    holder = threading.Thread(target=hold_the_row)
    holder.start()
    assert held.wait(10)
    try:
        sent.clear()
        assert dispatch_now() == 0
    finally:
        release.set()
        holder.join(10)

    assert [fresh(job).status for job in jobs] == [S.QUEUED, S.QUEUED]
    assert sent.countdowns(cc.DISPATCH) == [runners_node.CONTENDED_RETRY_SECONDS]
    assert dispatch_now() == 1, "the next pass finds the node free"
    assert attempt_of(jobs[0]).node_name == "gpu-a"


# --- the run_attempt message and the spec the claim answers --------------------------------


def test_run_attempt_goes_to_the_nodes_queue_with_the_attempts_ids_only(
    make_job, dispatch_now, sent, settings
) -> None:
    """Every node could once read the broker: the message names the attempt and carries
    nothing a reader could use (no spec, no signed URL, no token)."""
    settings.TRAINHUB_CONTROL_URL = "https://plane.example/"
    online_node("gpu-a", H100)
    job = make_job()

    dispatch_now()

    [(queue, message)] = run_messages(sent)
    assert queue == "gpu.node.gpu-a"
    assert message == {"job_id": job.public_id, "attempt": 1}


def test_the_claim_answers_a_valid_spec_with_signed_urls(
    make_job, make_file, dispatch_now, settings
) -> None:
    settings.TRAINHUB_CONTROL_URL = "https://plane.example/"
    node, _ = online_node("gpu-a", H100)
    job = make_job(validation_file=make_file().public_id, max_runtime_seconds=3600)
    dispatch_now()

    claim = dispatch.attempt_claim(node=node, job_id=job.public_id, attempt_number=1)

    assert claim is not None
    spec = parse_job_spec(claim.spec)
    assert (spec.job_id, spec.attempt, spec.model) == (job.public_id, 1, "acme/tiny-llama")
    assert spec.max_runtime_seconds == 3600
    assert spec.dataset.sha256 == job.training_file.sha256
    assert spec.validation_dataset is not None
    assert spec.validation_dataset.sha256 == job.validation_file.sha256
    assert spec.report["sinks"] == [{"type": "http"}], "events go to the events endpoint"

    assert all(
        u.startswith("https://plane.example/transfer/?")
        for u in (spec.dataset.url, spec.outputs.artifact_url, spec.outputs.checkpoint_url)
    )
    dataset = _grant(spec.dataset.url)
    assert (dataset["key"], dataset["method"]) == (job.training_file.storage_key, "GET")
    artifact = _grant(spec.outputs.artifact_url)
    assert (artifact["key"], artifact["method"]) == (
        storage.bundle_key(job.project_id, job.public_id, 1),
        "PUT",
    )
    assert artifact["max_bytes"] > 0
    checkpoint = _grant(spec.outputs.checkpoint_url)
    # (the checkpoint key's layout is jobs.storage's; test_storage pins it)
    assert checkpoint["method"] == "PUT" and job.public_id in checkpoint["key"]
    assert "checkpoint" in checkpoint["key"]
    assert dataset["exp"] > timezone.now().timestamp() + 3600, "URLs outlive max_runtime"
    assert spec.outputs.resume_url is None, "no checkpoint yet"
    assert claim.report_token and claim.report_token not in json.dumps(claim.spec)


def test_the_spec_never_resumes_from_an_upload_key(placed) -> None:
    """Attempt 1's own checkpoint upload is no resume point: a later attempt resumes from an
    earlier one's sealed copy (tests/jobs/services/core/test_specs.py)."""
    job = placed.job
    storage.save_stream(
        storage.checkpoint_key(job.project_id, job.public_id, 1), [b"a checkpoint bundle"]
    )

    spec = parse_job_spec(specs.attempt_spec(placed.attempt))

    assert spec.outputs.resume_url is None


# --- claim ------------------------------------------------------------------------------------


def test_a_node_claims_its_attempt_once(placed) -> None:
    job, attempt, node, _ = placed

    claim = dispatch.attempt_claim(node=node, job_id=job.public_id, attempt_number=1)
    assert claim is not None
    assert (claim.spec["job_id"], claim.spec["attempt"]) == (job.public_id, 1)
    assert fresh(attempt).claimed_at is not None
    assert dispatch.attempt_claim(node=node, job_id=job.public_id, attempt_number=1) is None


def test_another_node_cannot_claim_the_attempt(placed) -> None:
    other, _ = online_node("gpu-b")
    assert dispatch.attempt_claim(node=other, job_id=placed.job.public_id, attempt_number=1) is None
    assert fresh(placed.attempt).claimed_at is None
    assert dispatch.attempt_claim(node=placed.node, job_id=placed.job.public_id, attempt_number=1)


@pytest.mark.parametrize(
    ("job_id", "number"),
    [("ftjob-unknown", 1), (None, 1), ("JOB", 2), ("JOB", "1"), ("JOB", None), ("JOB", True),
     ("JOB", 1.0), ([1], 1)],
)  # fmt: skip
def test_a_claim_of_another_or_malformed_attempt_is_refused(placed, job_id, number) -> None:
    job_id = placed.job.public_id if job_id == "JOB" else job_id
    assert dispatch.attempt_claim(node=placed.node, job_id=job_id, attempt_number=number) is None
    assert fresh(placed.attempt).claimed_at is None


def test_a_claim_after_the_attempt_ended_is_refused(placed) -> None:
    expire_lease(placed.attempt)
    assert attempts_expire_leases() == 1
    assert (
        dispatch.attempt_claim(node=placed.node, job_id=placed.job.public_id, attempt_number=1)
        is None
    )


def test_a_claim_after_cancel_is_refused(placed) -> None:
    job_cancel(job=placed.job)
    assert (
        dispatch.attempt_claim(node=placed.node, job_id=placed.job.public_id, attempt_number=1)
        is None
    )
    assert fresh(placed.attempt).claimed_at is None


# --- the report token: who may report for a node attempt ---------------------------------------


def test_the_report_token_speaks_for_its_attempt_of_its_node(claimed) -> None:
    assert dispatch.attempt_for_report(
        node_name="gpu-a", job_id=claimed.job.public_id, attempt_number=1,
        token=claimed.report_token,
    )  # fmt: skip


def test_a_rotation_of_the_node_token_cuts_off_its_report_tokens(claimed) -> None:
    nodes.node_rotate_token(node=claimed.node)
    assert not dispatch.attempt_for_report(
        node_name="gpu-a", job_id=claimed.job.public_id, attempt_number=1,
        token=claimed.report_token,
    )  # fmt: skip


@pytest.mark.parametrize(
    "case",
    ["empty", "garbage", "node-token", "other-node-named", "other-attempt", "other-job",
     "other-nodes-attempt", "other-salt", "other-secret", "tampered", "expired"],
)  # fmt: skip
def test_a_report_token_is_refused_for_anything_but_its_attempt(
    claimed, make_job, dispatch_now, settings, monkeypatch, case
) -> None:
    node_b, _ = online_node("gpu-b")
    job_b = make_job()
    assert dispatch_now() == 1
    claim_b = dispatch.attempt_claim(node=node_b, job_id=job_b.public_id, attempt_number=1)
    assert claim_b is not None
    job_id, good = claimed.job.public_id, claimed.report_token
    payload = {"attempt": claimed.attempt.pk, "node": "gpu-a"}
    ask = {"node_name": "gpu-a", "job_id": job_id, "attempt_number": 1, "token": good}
    if case == "empty":
        ask["token"] = ""
    elif case == "garbage":
        ask["token"] = "not-a-token"
    elif case == "node-token":
        ask["token"] = claimed.token
    elif case == "other-node-named":
        ask["node_name"] = "gpu-b"
    elif case == "other-attempt":
        ask["attempt_number"] = 2
    elif case == "other-job":
        ask["job_id"] = job_b.public_id
    elif case == "other-nodes-attempt":  # gpu-b's token for gpu-b's attempt, sent as gpu-a's
        ask["token"] = claim_b.report_token
    elif case == "other-salt":
        ask["token"] = signing.dumps(payload, salt="trainhub.something-else")
    elif case == "other-secret":
        ask["token"] = signing.dumps(
            payload, key="another-deployments-secret", salt="trainhub.attempt-report"
        )
    elif case == "tampered":  # gpu-b's attempt in the payload, under gpu-a's signature
        ask |= {"node_name": "gpu-b", "job_id": job_b.public_id}
        assert dispatch.attempt_for_report(**(ask | {"token": claim_b.report_token}))
        parts = good.split(":")  # payload:timestamp:signature
        parts[0] = claim_b.report_token.split(":")[0]
        ask["token"] = ":".join(parts)
    elif case == "expired":
        monkeypatch.setattr(dispatch, "_REPORT_TOKEN_SECONDS", -1)

    assert dispatch.attempt_for_report(**ask) is False


def test_a_report_token_for_an_attempt_not_claimed_is_refused(placed) -> None:
    """Only a claim issues one: even signed with the real key, it is refused before that."""
    forged = dispatch.report_token(placed.attempt)  # as the claim would have issued it
    assert not dispatch.attempt_for_report(
        node_name="gpu-a", job_id=placed.job.public_id, attempt_number=1, token=forged
    )


# --- re-sends: unclaimed attempts --------------------------------------------------------------


def test_resend_unclaimed_sends_only_old_unclaimed_live_local_attempts(
    make_job, dispatch_now, sent, settings, django_capture_on_commit_callbacks
) -> None:
    settings.TRAINHUB_DISPATCH_RESEND_SECONDS = 30
    for name in ("a-old", "b-fresh", "c-claimed", "d-ended"):
        online_node(name)
    jobs = {name: make_job() for name in ("a-old", "b-fresh", "c-claimed", "d-ended")}
    assert dispatch_now() == 4
    by_node = {a.node_name: a for a in JobAttempt.objects.filter(target="local")}
    assert dispatch.attempt_claim(
        node=GpuNode.objects.get(name="c-claimed"),
        job_id=jobs["c-claimed"].public_id,
        attempt_number=1,
    )
    job_cancel(job=jobs["d-ended"])  # unclaimed: ends at once
    cloud = attempt_start(job=make_job(), target="runpod")
    for attempt in (by_node["a-old"], by_node["c-claimed"], by_node["d-ended"], cloud):
        _backdate(attempt, 31)
    _backdate(by_node["b-fresh"], 25)
    sent.clear()

    with django_capture_on_commit_callbacks(execute=True):  # beat's tick commits
        assert attempts_resend_unclaimed() == 1

    [(queue, message)] = run_messages(sent)
    assert queue == "gpu.node.a-old"
    assert message == {"job_id": jobs["a-old"].public_id, "attempt": 1}
    assert len(sent.calls) == 1


# --- after a lost attempt ---------------------------------------------------------------------


def test_the_nodes_next_job_is_attempt_two_of_the_requeued_job(placed, dispatch_now, sent) -> None:
    expire_lease(placed.attempt)
    attempts_expire_leases()
    sent.clear()

    assert dispatch_now() == 1

    second = attempt_of(placed.job, 2)
    assert second.node_name == "gpu-a" and second.ended_at is None
    assert fresh(placed.node).current_attempt_id == second.pk
    [(_, message)] = run_messages(sent)
    assert message == {"job_id": placed.job.public_id, "attempt": 2}
    assert (
        dispatch.attempt_claim(node=placed.node, job_id=placed.job.public_id, attempt_number=1)
        is None
    ), "the outdated attempt 1 stays refused"
    claim = dispatch.attempt_claim(node=placed.node, job_id=placed.job.public_id, attempt_number=2)
    assert claim is not None and claim.spec["attempt"] == 2
