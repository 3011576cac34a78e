"""A job's creator hears of its end: entering succeeded, failed or cancelled sends notify_job
on commit; the task stores one ``notification`` event per terminal entry (so it reaches live
watchers and the events list) and mails the creator through a real SMTP server on loopback
(aiosmtpd), retrying while the server is away."""

from __future__ import annotations

import email
import email.policy
import socket
from collections.abc import Iterator
from dataclasses import dataclass, field
from email.message import EmailMessage
from typing import Any

import pytest
from aiosmtpd.controller import Controller

from jobs import tasks
from jobs.models import JobEvent, TrainingJob
from jobs.services.core.jobs import job_cancel, job_retry
from jobs.services.core.status import job_transition
from jobs.services.outbound import notifications
from jobs.states import JobStatus as S
from trainhub_contract import celery_conf as cc


@dataclass
class Inbox:
    """What the SMTP server on loopback accepted."""

    messages: list[EmailMessage] = field(default_factory=list)
    recipients: list[list[str]] = field(default_factory=list)

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        message = email.message_from_bytes(envelope.content, policy=email.policy.default)
        assert isinstance(message, EmailMessage)
        self.messages.append(message)
        self.recipients.append(list(envelope.rcpt_tos))
        return "250 Message accepted for delivery"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def smtp(settings) -> Iterator[Inbox]:
    """A real SMTP server on 127.0.0.1, and Django's SMTP backend pointed at it."""
    inbox = Inbox()
    controller = Controller(inbox, hostname="127.0.0.1", port=_free_port())
    controller.start()
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", controller.port
    settings.EMAIL_USE_TLS = settings.EMAIL_USE_SSL = False
    settings.EMAIL_HOST_USER = settings.EMAIL_HOST_PASSWORD = ""
    settings.EMAIL_TIMEOUT = 5
    settings.DEFAULT_FROM_EMAIL = "trainhub <trainhub@example.test>"
    settings.TRAINHUB_PUBLIC_URL = "https://trainhub.example.test"
    yield inbox
    controller.stop()


@pytest.fixture
def alice(user):
    user.email = "alice@example.test"
    user.save(update_fields=["email"])
    return user


def _end(job: TrainingJob, to: S, sent, capture, **kwargs: Any) -> list[Any]:
    """Move ``job`` to a terminal status, committing; the notify_job messages it sent."""
    sent.clear()
    with capture(execute=True):
        job_transition(job=job, to=to, **kwargs)
    return sent.named(cc.NOTIFY_JOB)


def _notifications(job: TrainingJob) -> list[JobEvent]:
    return list(JobEvent.objects.filter(job=job, type="notification").order_by("number"))


def _body(message: EmailMessage) -> str:
    part = message.get_body(("plain",))
    assert part is not None
    return str(part.get_content())


def test_a_succeeded_job_mails_its_creator_once_even_when_the_task_runs_twice(
    alice, make_job, smtp: Inbox, sent, django_capture_on_commit_callbacks, api
) -> None:
    job = make_job(suffix="owls")
    TrainingJob.objects.filter(pk=job.pk).update(status=S.FINALIZING, cost="1.2345")
    job.refresh_from_db()
    (args,) = _end(job, S.SUCCEEDED, sent, django_capture_on_commit_callbacks)
    status_event = JobEvent.objects.get(job=job, type="status", data__status="succeeded")
    assert args == [job.pk, status_event.number]

    tasks.notify_job(*args)
    tasks.notify_job(*args)  # a duplicate message: nothing new

    (event,) = _notifications(job)
    model = f"ft:acme/tiny-llama:{job.project.slug}:owls:{job.public_id.removeprefix('ftjob-')}"
    assert event.data == {
        "status_event": status_event.number,
        "status": "succeeded",
        "channels": ["email"],
        "fine_tuned_model": model,
    }
    assert event.message == f"Fine-tuning job {job.public_id} succeeded."
    (message,) = smtp.messages
    assert smtp.recipients == [["alice@example.test"]]
    assert message["Subject"] == f"[trainhub] Fine-tuning job {job.public_id} succeeded"
    assert message["From"] == "trainhub <trainhub@example.test>"
    body = _body(message)
    for expected in (
        f"Job:      {job.public_id}",
        "Model:    acme/tiny-llama",
        "Status:   succeeded",
        f"Fine-tuned model: {model}",
        "Cost:     $1.2345",
        f"Link:     https://trainhub.example.test/v1/fine_tuning/jobs/{job.public_id}",
    ):
        assert expected in body
    assert "Error" not in body

    # The events list shows it as OpenAI's clients read events: a message of kind notification.
    listed = api.get(f"/v1/fine_tuning/jobs/{job.public_id}/events").json()["data"]
    (shown,) = [e for e in listed if e.get("kind") == "notification"]
    assert shown["type"] == "message" and shown["data"]["status"] == "succeeded"


def test_a_failed_jobs_mail_names_the_error(
    alice, make_job, smtp: Inbox, sent, django_capture_on_commit_callbacks
) -> None:
    job = make_job()
    (args,) = _end(
        job,
        S.FAILED,
        sent,
        django_capture_on_commit_callbacks,
        message="out of memory training with batch_size=8; lower batch_size",
        error_code="oom",
    )
    tasks.notify_job(*args)

    (message,) = smtp.messages
    assert message["Subject"] == f"[trainhub] Fine-tuning job {job.public_id} failed"
    body = _body(message)
    assert "Error:    oom: out of memory training with batch_size=8; lower batch_size" in body
    assert "Fine-tuned model" not in body
    (event,) = _notifications(job)
    assert event.level == "error"
    assert event.data["error"] == {
        "code": "oom",
        "message": "out of memory training with batch_size=8; lower batch_size",
    }


def test_no_mail_without_an_address_but_still_the_event(
    user, make_job, smtp: Inbox, sent, django_capture_on_commit_callbacks
) -> None:
    assert user.email == ""
    job = make_job()
    sent.clear()
    with django_capture_on_commit_callbacks(execute=True):
        job_cancel(job=job)  # queued, no attempt: cancelled at once
    (args,) = sent.named(cc.NOTIFY_JOB)
    tasks.notify_job(*args)

    assert smtp.messages == []
    (event,) = _notifications(job)
    assert event.data["status"] == "cancelled" and event.data["channels"] == []
    assert event.message == f"Fine-tuning job {job.public_id} was cancelled."


def test_each_terminal_entry_is_notified_once(
    alice, make_job, smtp: Inbox, sent, django_capture_on_commit_callbacks
) -> None:
    job = make_job()
    (first,) = _end(job, S.FAILED, sent, django_capture_on_commit_callbacks, error_code="oom")
    job_retry(job=job)
    job.refresh_from_db()
    (second,) = _end(job, S.FAILED, sent, django_capture_on_commit_callbacks, error_code="oom")
    for args in (first, second, first, second):
        tasks.notify_job(*args)
    assert [e.data["status_event"] for e in _notifications(job)] == [first[1], second[1]]
    assert len(smtp.messages) == 2


def test_only_terminal_statuses_send_the_message(
    alice, make_job, sent, django_capture_on_commit_callbacks
) -> None:
    job = make_job()  # queued
    sent.clear()
    with django_capture_on_commit_callbacks(execute=True):
        job_transition(job=job, to=S.PROVISIONING)
        job_transition(job=job, to=S.RUNNING)
        job_transition(job=job, to=S.CANCELLING)
    assert sent.named(cc.NOTIFY_JOB) == []
    # A status event that is not terminal is no reason to notify (a malformed message).
    running = JobEvent.objects.get(job=job, type="status", data__status="running")
    assert notifications.job_notify(job_pk=job.pk, status_event_number=running.number) is None
    assert _notifications(job) == []


def test_an_smtp_server_away_is_retried_and_the_event_stays_single(
    alice, make_job, smtp: Inbox, settings, sent, django_capture_on_commit_callbacks, caplog
) -> None:
    job = make_job()
    (args,) = _end(job, S.FAILED, sent, django_capture_on_commit_callbacks, error_code="oom")
    up = settings.EMAIL_PORT
    settings.EMAIL_PORT = _free_port()  # nobody listens: connection refused

    # Through Celery's own retries (apply runs them at once): every try fails, then it gives up.
    tasks.notify_job.apply(args=args)
    assert "given up after 7 tries" in caplog.text
    assert len(_notifications(job)) == 1 and smtp.messages == []

    settings.EMAIL_PORT = up  # the server is back: a retry mails, and stores nothing new
    tasks.notify_job.apply(args=args, retries=1, throw=True)
    assert len(smtp.messages) == 1 and len(_notifications(job)) == 1
    assert [notifications.retry_delay(n) for n in range(7)] == [30, 60, 120, 240, 480, 600, 600]


def test_a_refused_address_is_not_retried(
    alice, make_job, smtp: Inbox, sent, django_capture_on_commit_callbacks, caplog
) -> None:
    alice.email = "nobody@refused.test"
    alice.save(update_fields=["email"])

    async def refuse(server: Any, session: Any, envelope: Any, address: str, options: Any) -> str:
        return "550 no such user here"

    smtp.handle_RCPT = refuse  # type: ignore[attr-defined]
    job = make_job()
    sent.clear()
    with django_capture_on_commit_callbacks(execute=True):
        job_cancel(job=job)
    (args,) = sent.named(cc.NOTIFY_JOB)
    tasks.notify_job(*args)  # no EmailDeferred: refused for good
    assert "notification email refused" in caplog.text
    assert smtp.messages == [] and len(_notifications(job)) == 1


def test_the_task_is_registered_by_name_and_routed_to_default() -> None:
    from trainhub.celery import app

    task = app.tasks[cc.NOTIFY_JOB]
    assert task.ignore_result
    assert app.amqp.router.route({}, cc.NOTIFY_JOB)["queue"].name == cc.DEFAULT_QUEUE
