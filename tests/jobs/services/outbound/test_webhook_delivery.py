"""Outbound webhooks end to end in one process: jobs driven through the real services, the
deliveries their events queue, the delivery task run for real against a receiver on loopback
that verifies every message with the ``standardwebhooks`` package."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone
from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError

from api.presenters import checkpoint_id
from jobs import outbound_http, tasks
from jobs.models import JobEvent, WebhookAttempt, WebhookDelivery, WebhookEndpoint
from jobs.models.webhooks import EVENT_TYPES
from jobs.services.core import jobs as job_services
from jobs.services.core.attempts import attempt_record_events, attempt_start
from jobs.services.core.status import job_transition
from jobs.services.outbound import webhook_delivery, webhook_endpoints
from jobs.services.outbox import webhook_outbox
from jobs.states import JobStatus
from tests.support.db import fresh
from tests.support.webhooks import Receiver, delivery_messages, receiving

S = JobStatus
D = WebhookDelivery.Status


@pytest.fixture(autouse=True)
def _loopback_receivers(settings) -> None:
    """The receivers of these tests listen on loopback over plain http: the operator allows
    both (tests/security/test_webhook_ssrf.py checks that nothing else is reachable)."""
    settings.TRAINHUB_WEBHOOK_ALLOW_HTTP = True
    settings.TRAINHUB_WEBHOOK_ALLOWED_CIDRS = ["127.0.0.0/8", "::1/128"]


@pytest.fixture
def receiver():
    with receiving() as r:
        yield r


@pytest.fixture
def subscribe(project, receiver: Receiver):
    """An endpoint of ``project`` for ``receiver`` (all event types unless told)."""

    def make(types=EVENT_TYPES, proj=None, url=None) -> WebhookEndpoint:
        endpoint, secret = webhook_endpoints.endpoint_create(
            project=proj or project,
            data={"url": url or receiver.url, "event_types": list(types)},
        )
        receiver.secrets.append(secret)
        return endpoint

    return make


@pytest.fixture
def deliver(sent, django_capture_on_commit_callbacks):
    """Run ``action`` in a transaction that commits (its on-commit messages are recorded by
    ``sent``), then run the delivery task for every deliver_webhook message, as a worker does."""

    def run(action=None) -> list[int]:
        with django_capture_on_commit_callbacks(execute=True):
            if action is not None:
                action()
        pks = delivery_messages(sent)
        for pk in pks:
            tasks.deliver_webhook(pk)
        return pks

    return run


def event_types_received(receiver: Receiver) -> list[str]:
    return [r.payload["type"] for r in receiver.received]


def test_a_job_lifecycle_arrives_signed_in_openai_shape(
    make_job, subscribe, receiver, deliver, project
) -> None:
    subscribe()
    job = make_job(suffix="bot")
    attempt = deliver(lambda: attempt_start(job=job, target="local"))
    assert attempt == [], "queued and provisioning make no webhook"
    deliver(
        lambda: attempt_record_events(
            job_id=job.public_id,
            attempt_number=1,
            events=[
                {"seq": 0, "type": "status", "message": "go", "data": {"status": "running"}},
                {"seq": 1, "type": "metrics", "data": {"step": 5, "loss": 1.5}},
                {"seq": 2, "type": "checkpoint", "data": {"step": 10, "size": 9, "sha256": "0"}},
                # the executor's own "succeeded" means "verify my adapter": no webhook yet
                {"seq": 3, "type": "status", "data": {"status": "succeeded", "sha256": "0"}},
            ],
        )
    )
    assert fresh(job).status == S.FINALIZING
    deliver(lambda: job_transition(job=job, to=S.SUCCEEDED, message="Adapter verified."))

    # In the order the events were stored: the batch (its checkpoint) before the transition
    # it caused (running). Webhooks promise no order; a receiver sorts by created_at if it cares.
    assert event_types_received(receiver) == [
        "fine_tuning.job.checkpoint",
        "fine_tuning.job.running",
        "fine_tuning.job.succeeded",
    ]
    assert all(r.verified_with == receiver.secrets for r in receiver.received)
    assert all(r.path == "/hooks/trainhub" for r in receiver.received)
    checkpoint, running, succeeded = (r.payload for r in receiver.received)
    for p in (running, checkpoint, succeeded):
        assert p["object"] == "event"
        assert p["id"].startswith("evt_")
        assert isinstance(p["created_at"], int)
        assert p["data"]["id"] == job.public_id
    assert running["data"]["status"] == "running"
    assert succeeded["data"] == {
        "id": job.public_id,
        "object": "fine_tuning.job",
        "status": "succeeded",
        "fine_tuned_model": f"ft:acme/tiny-llama:{project.slug}:bot:"
        + job.public_id.removeprefix("ftjob-"),
    }
    stored = JobEvent.objects.get(job=job, type="checkpoint")
    assert checkpoint["data"]["checkpoint"] == {
        "id": checkpoint_id(job.public_id, stored.number),  # the checkpoints API's id
        "object": "fine_tuning.job.checkpoint",
        "step_number": 10,
        "attempt": 1,
    }
    assert len({r.webhook_id for r in receiver.received}) == 3
    assert set(WebhookDelivery.objects.values_list("status", flat=True)) == {D.SUCCEEDED}
    log = WebhookAttempt.objects.filter(delivery__event_type="fine_tuning.job.succeeded").get()
    assert log.status_code == 204 and log.error == "" and log.latency_ms >= 0


def test_failed_cancelled_and_paused_jobs(make_job, subscribe, receiver, deliver) -> None:
    subscribe()
    failing, cancelled, paused = make_job(), make_job(), make_job()
    deliver(lambda: job_transition(job=failing, to=S.FAILED, error_code="oom", message="CUDA OOM"))
    deliver(lambda: job_services.job_cancel(job=cancelled))
    attempt_start(job=paused, target="local")
    deliver(lambda: job_transition(job=paused, to=S.RUNNING))
    deliver(lambda: job_services.job_pause(job=fresh(paused)))

    by_type = {r.payload["type"]: r.payload for r in receiver.verified()}
    assert list(by_type) == [
        "fine_tuning.job.failed",
        "fine_tuning.job.cancelled",
        "fine_tuning.job.running",
        "fine_tuning.job.paused",
    ]
    assert by_type["fine_tuning.job.failed"]["data"]["error"] == {
        "code": "oom",
        "message": "CUDA OOM",
    }
    assert by_type["fine_tuning.job.cancelled"]["data"]["id"] == cancelled.public_id
    assert by_type["fine_tuning.job.paused"]["data"]["status"] == "paused"


def test_only_enabled_subscribed_endpoints_of_the_jobs_project_hear(
    make_job, subscribe, receiver, deliver, make_user
) -> None:
    from jobs.services.accounts.projects import project_default_for_user

    subscribe(types=["fine_tuning.job.failed"])
    off = subscribe()
    webhook_endpoints.endpoint_update(endpoint=off, data={"enabled": False})
    other_project = project_default_for_user(user=make_user("bob"))
    subscribe(proj=other_project)
    job = make_job()
    deliver(lambda: job_services.job_cancel(job=job))
    assert receiver.received == []
    deliver(lambda: job_transition(job=make_job(), to=S.FAILED, error_code="oom"))
    assert event_types_received(receiver) == ["fine_tuning.job.failed"]
    assert WebhookDelivery.objects.count() == 1


def test_events_that_make_no_webhook_cost_no_query(
    make_job, subscribe, django_assert_num_queries
) -> None:
    subscribe()
    job = make_job()
    events = [
        JobEvent(job=job, attempt=1, seq=i, number=100 + i, type=t, data={"status": "running"})
        for i, t in enumerate(["metrics", "log", "heartbeat", "artifact", "status"])
    ]
    with django_assert_num_queries(0):
        webhook_outbox.webhooks_for_events(job, events)  # status of attempt 1: the executor's


def test_a_rolled_back_transition_leaves_no_delivery(make_job, subscribe, sent) -> None:
    subscribe()
    job = make_job()
    with pytest.raises(RuntimeError), transaction.atomic():
        job_transition(job=job, to=S.FAILED, error_code="oom")
        raise RuntimeError("rolled back")
    assert WebhookDelivery.objects.count() == 0


def beat_sends_due(capture) -> int:
    """The beat's webhooks_due run (outside any transaction in a worker: sent at once)."""
    with capture(execute=True):
        return webhook_delivery.deliveries_send_due()


def test_receiver_down_then_back_gets_it_once_with_one_webhook_id(
    make_job, subscribe, receiver, deliver, sent, django_capture_on_commit_callbacks
) -> None:
    subscribe(types=["fine_tuning.job.failed"])
    receiver.statuses = [503, 500]
    [pk] = deliver(lambda: job_transition(job=make_job(), to=S.FAILED, error_code="oom"))
    delivery = WebhookDelivery.objects.get(pk=pk)
    assert delivery.status == D.PENDING and delivery.attempts == 1
    delays = [(delivery.next_attempt_at - delivery.last_attempt_at).total_seconds()]

    def due_now() -> None:
        """Time passes (the retry is due) and the beat sends it; the task runs."""
        WebhookDelivery.objects.filter(pk=pk).update(
            next_attempt_at=timezone.now() - timedelta(seconds=1)
        )
        assert beat_sends_due(django_capture_on_commit_callbacks) == 1
        assert delivery_messages(sent) == [pk]
        tasks.deliver_webhook(pk)

    due_now()  # 500
    receiver.stop()  # then down altogether: connection refused
    due_now()
    after_refused = fresh(delivery)
    assert after_refused.status == D.PENDING
    assert "refused" in after_refused.last_error
    delays.append((after_refused.next_attempt_at - after_refused.last_attempt_at).total_seconds())
    receiver.start()  # back, on the same port
    due_now()

    delivery = fresh(delivery)
    assert delivery.status == D.SUCCEEDED and delivery.attempts == 4
    tries = list(WebhookAttempt.objects.filter(delivery=delivery).order_by("number"))
    assert [(t.number, t.status_code) for t in tries] == [(1, 503), (2, 500), (3, None), (4, 204)]
    assert "refused" in tries[2].error
    assert tries[0].error == "the receiver answered 503"
    # backoff: 5 s after the first failure, about 45 s after the third (x3 each, +-10 %)
    assert 4.5 <= delays[0] <= 5.5
    assert 40 <= delays[1] <= 50
    ids = {r.webhook_id for r in receiver.received}
    assert len(receiver.received) == 3 and ids == {delivery.message_id}
    assert len({r.headers["webhook-signature"] for r in receiver.received}) >= 1
    assert len(receiver.verified()) == 3  # each try signed afresh, each verifies
    # nothing is due any more: the beat sends nothing
    assert webhook_delivery.deliveries_send_due() == 0


def test_retries_stop_after_the_window(make_job, subscribe, receiver, deliver, settings) -> None:
    subscribe(types=["fine_tuning.job.failed"])
    receiver.default_status = 500
    [pk] = deliver(lambda: job_transition(job=make_job(), to=S.FAILED, error_code="oom"))
    window = settings.TRAINHUB_WEBHOOK_RETRY_WINDOW_SECONDS
    # Near the window's end, the last retry falls exactly on it.
    WebhookDelivery.objects.filter(pk=pk).update(
        created_at=timezone.now() - timedelta(seconds=window - 2),
        next_attempt_at=timezone.now(),
    )
    tasks.deliver_webhook(pk)
    last = WebhookDelivery.objects.get(pk=pk)
    assert last.status == D.PENDING
    assert last.next_attempt_at <= last.created_at + timedelta(seconds=window)
    WebhookDelivery.objects.filter(pk=pk).update(
        created_at=timezone.now() - timedelta(seconds=window + 1),
        next_attempt_at=timezone.now(),
    )
    tasks.deliver_webhook(pk)
    gave_up = WebhookDelivery.objects.get(pk=pk)
    assert gave_up.status == D.FAILED and gave_up.next_attempt_at is None
    assert gave_up.attempts == 3


def test_a_duplicate_message_or_a_held_delivery_is_not_sent_twice(
    make_job, subscribe, receiver, deliver
) -> None:
    subscribe(types=["fine_tuning.job.failed"])
    [pk] = deliver(lambda: job_transition(job=make_job(), to=S.FAILED, error_code="oom"))
    tasks.deliver_webhook(pk)  # the same message again (at-least-once broker)
    assert len(receiver.received) == 1
    # A worker holding it (mid-try) keeps others off until its hold runs out.
    WebhookDelivery.objects.filter(pk=pk).update(
        status=D.PENDING,
        next_attempt_at=timezone.now(),
        locked_until=timezone.now() + timedelta(seconds=30),
    )
    assert webhook_delivery.delivery_try(delivery_pk=pk) is None
    assert webhook_delivery.deliveries_send_due() == 0
    WebhookDelivery.objects.filter(pk=pk).update(locked_until=timezone.now() - timedelta(seconds=1))
    assert webhook_delivery.delivery_try(delivery_pk=pk) is not None
    assert len(receiver.received) == 2


def test_a_first_try_whose_message_was_lost_is_sent_by_the_beat(
    make_job, subscribe, sent, django_capture_on_commit_callbacks
) -> None:
    subscribe(types=["fine_tuning.job.failed"])
    with django_capture_on_commit_callbacks(execute=True):
        job_transition(job=make_job(), to=S.FAILED, error_code="oom")
    delivery = WebhookDelivery.objects.get()
    delivery_messages(sent)  # the on-commit message, lost on its way
    # Just created: its message may still be in flight, the beat leaves it alone a minute.
    assert webhook_delivery.deliveries_send_due() == 0
    WebhookDelivery.objects.filter(pk=delivery.pk).update(
        created_at=timezone.now() - timedelta(minutes=2)
    )
    assert beat_sends_due(django_capture_on_commit_callbacks) == 1
    assert delivery_messages(sent) == [delivery.pk]


def test_rotation_signs_with_both_secrets_during_the_overlap_then_the_new_one(
    make_job, subscribe, receiver, deliver, settings
) -> None:
    endpoint = subscribe(types=["fine_tuning.job.failed"])
    old = receiver.secrets[0]
    new = webhook_endpoints.endpoint_rotate_secret(endpoint=endpoint)
    assert new != old and new.startswith("whsec_")
    receiver.secrets.append(new)
    endpoint.refresh_from_db()
    overlap = (endpoint.previous_secret_expires_at - timezone.now()).total_seconds()
    assert abs(overlap - settings.TRAINHUB_WEBHOOK_SECRET_OVERLAP_SECONDS) < 60

    deliver(lambda: job_transition(job=make_job(), to=S.FAILED, error_code="oom"))
    during = receiver.received[-1]
    assert len(during.headers["webhook-signature"].split(" ")) == 2
    assert during.verified_with == [old, new]
    for secret in (old, new):  # each alone verifies, as a receiver with one of them does
        Webhook(secret).verify(during.body, during.headers)

    WebhookEndpoint.objects.filter(pk=endpoint.pk).update(
        previous_secret_expires_at=timezone.now() - timedelta(seconds=1)
    )
    deliver(lambda: job_transition(job=make_job(), to=S.FAILED, error_code="oom"))
    after = receiver.received[-1]
    assert len(after.headers["webhook-signature"].split(" ")) == 1
    assert after.verified_with == [new]
    with pytest.raises(WebhookVerificationError):
        Webhook(old).verify(after.body, after.headers)


def test_an_endpoint_failing_for_five_days_is_disabled_and_members_told(
    make_job, subscribe, receiver, deliver, mailoutbox, user, make_user, project
) -> None:
    from jobs.services.accounts.projects import project_member_add

    user.email = "alice@example.com"
    user.save()
    project_member_add(project=project, user=make_user("carol", email="carol@example.com"))
    make_user("mallory", email="mallory@example.com")  # not a member
    endpoint = subscribe(types=["fine_tuning.job.failed"])
    receiver.default_status = 500

    deliver(lambda: job_transition(job=make_job(), to=S.FAILED, error_code="oom"))
    endpoint.refresh_from_db()
    assert endpoint.enabled and endpoint.failing_since is not None  # the streak starts

    # Four days later it still fails: still enabled.
    WebhookEndpoint.objects.filter(pk=endpoint.pk).update(
        failing_since=timezone.now() - timedelta(days=4)
    )
    deliver(lambda: job_transition(job=make_job(), to=S.FAILED, error_code="oom"))
    assert fresh(endpoint).enabled and mailoutbox == []

    # Five days and a minute: this failure disables it.
    WebhookEndpoint.objects.filter(pk=endpoint.pk).update(
        failing_since=timezone.now() - timedelta(days=5, minutes=1)
    )
    pending = WebhookDelivery.objects.filter(status=D.PENDING).count()
    assert pending == 2
    deliver(lambda: job_transition(job=make_job(), to=S.FAILED, error_code="oom"))
    endpoint.refresh_from_db()
    assert not endpoint.enabled
    assert endpoint.disabled_reason.startswith("auto-disabled: every delivery failed for 5 days")
    assert len(mailoutbox) == 1
    mail = mailoutbox[0]
    assert sorted(mail.to) == ["alice@example.com", "carol@example.com"]
    assert endpoint.public_id in mail.subject and endpoint.disabled_reason in mail.body
    assert receiver.secrets[0] not in mail.body

    # Its pending deliveries are not sent any more; new events make none.
    sent_before = len(receiver.received)
    for d in WebhookDelivery.objects.filter(status=D.PENDING):
        WebhookDelivery.objects.filter(pk=d.pk).update(next_attempt_at=timezone.now())
        tasks.deliver_webhook(d.pk)
    assert len(receiver.received) == sent_before
    assert not WebhookDelivery.objects.filter(status=D.PENDING).exists()
    assert "disabled" in WebhookDelivery.objects.filter(status=D.FAILED).first().last_error
    assert deliver(lambda: job_transition(job=make_job(), to=S.FAILED, error_code="oom")) == []

    # Enabled again: the streak starts over.
    webhook_endpoints.endpoint_update(endpoint=endpoint, data={"enabled": True})
    endpoint.refresh_from_db()
    assert endpoint.enabled and endpoint.failing_since is None and endpoint.disabled_reason == ""


def test_a_success_ends_the_failure_streak(make_job, subscribe, receiver, deliver) -> None:
    endpoint = subscribe(types=["fine_tuning.job.failed"])
    WebhookEndpoint.objects.filter(pk=endpoint.pk).update(
        failing_since=timezone.now() - timedelta(days=4, hours=23)
    )
    deliver(lambda: job_transition(job=make_job(), to=S.FAILED, error_code="oom"))
    endpoint.refresh_from_db()
    assert endpoint.enabled and endpoint.failing_since is None


def test_redeliver_sends_again_under_the_same_webhook_id(
    make_job, subscribe, receiver, deliver, sent
) -> None:
    subscribe(types=["fine_tuning.job.failed"])
    [pk] = deliver(lambda: job_transition(job=make_job(), to=S.FAILED, error_code="oom"))
    delivery = WebhookDelivery.objects.select_related("endpoint").get(pk=pk)
    deliver(lambda: webhook_delivery.delivery_redeliver(delivery=delivery))
    assert len(receiver.received) == 2
    assert receiver.received[0].webhook_id == receiver.received[1].webhook_id
    assert receiver.received[0].body == receiver.received[1].body
    assert fresh(delivery).attempts == 2


def test_the_answer_is_read_to_one_kib_at_most(make_job, subscribe, receiver, deliver) -> None:
    subscribe(types=["fine_tuning.job.failed"])
    receiver.body = b"x" * 5000
    receiver.default_status = 200
    deliver(lambda: job_transition(job=make_job(), to=S.FAILED, error_code="oom"))
    attempt = WebhookAttempt.objects.get()
    assert attempt.status_code == 200
    assert attempt.response_excerpt == "x" * outbound_http.EXCERPT_BYTES


def test_a_stalled_receiver_is_cut_off_at_the_total_timeout() -> None:
    """The POST's time is bounded whatever the receiver does (here: it never answers)."""
    with receiving(stall_seconds=3, secrets=[]) as slow:
        target = outbound_http.parse_url(slow.url, allow_http=True)
        addresses = outbound_http.checked_addresses(
            target, outbound_http.parse_networks(["127.0.0.0/8"])
        )
        answer = outbound_http.post(target, addresses, b"{}", {}, total_timeout=1.0)
    assert answer.status_code is None
    assert "did not answer in time" in answer.error
    assert 900 <= answer.latency_ms < 2500


def test_the_body_is_stored_once_and_sent_unchanged(make_job, subscribe, receiver, deliver) -> None:
    subscribe(types=["fine_tuning.job.failed"])
    deliver(lambda: job_transition(job=make_job(), to=S.FAILED, error_code="oom"))
    delivery = WebhookDelivery.objects.get()
    assert receiver.received[0].body == delivery.body.encode()
    assert json.loads(delivery.body)["id"] == delivery.event_id
