"""Telling a job's creator that the job ended: a ``notification`` event and an email.

``job_transition`` sends ``notify_job(job, status event number)`` on commit whenever a job enters
succeeded, failed or cancelled; the task calls :func:`job_notify`. The event is stored once per
terminal entry (its data names the status event it is about, checked under the job's row lock),
so a repeated or retried task stores nothing new, and it reaches live watchers like every event
(events.event_append). The email goes to ``TrainingJob.created_by.email`` with Django's email
framework (SMTP from settings; without EMAIL_HOST nothing is sent). A transient SMTP failure
raises :class:`EmailDeferred` for the task to retry with a bounded backoff; a retry sends the
email again but never stores a second event.

The mail holds the job id, model, status, error, fine-tuned model, cost and, when
TRAINHUB_PUBLIC_URL is set, a link to the job in the API: nothing secret (no keys, no URLs
with signatures, no metadata).
"""

from __future__ import annotations

import logging
import smtplib
from dataclasses import dataclass
from typing import cast

from django.conf import settings
from django.core.mail import send_mail
from django.db import transaction

from jobs.models import JobEvent, TrainingJob
from jobs.services.core.events import event_append
from jobs.states import TERMINAL

log = logging.getLogger(__name__)

NOTIFICATION = "notification"  # the event type
EMAIL_RETRIES = 6  # tries after the first: 30 s, 1, 2, 4, 8 min, then 10 min
_RETRY_FIRST_SECONDS = 30
_RETRY_MAX_SECONDS = 600


class EmailDeferred(Exception):
    """The SMTP server could not take the mail now (connection, timeout, 4xx): try again."""


@dataclass(frozen=True)
class Notified:
    event: JobEvent
    created: bool  # False: this terminal entry was notified before (a repeated task)
    emailed: bool


def retry_delay(retries: int) -> int:
    """Seconds before retry number ``retries + 1`` of a deferred email."""
    return min(_RETRY_MAX_SECONDS, _RETRY_FIRST_SECONDS * cast(int, 2**retries))


def job_notify(*, job_pk: int, status_event_number: int, retrying: bool = False) -> Notified | None:
    """Notify the creator of ``job_pk`` about the terminal status event numbered so.

    Stores the ``notification`` event unless this terminal entry has one, then emails the
    creator, if they have an address, when the event is new or ``retrying`` (a retry after
    :class:`EmailDeferred`: the event was stored, the mail was not sent). Returns None when
    there is nothing to notify about (the job was deleted, or the event is not a terminal
    status). Raises EmailDeferred on a transient SMTP failure; a permanent one (the address
    refused) is logged and not retried.
    """
    with transaction.atomic():
        job = (
            TrainingJob.objects.select_for_update(of=("self",))
            .select_related("created_by", "project")
            .filter(pk=job_pk)
            .first()
        )
        status_event = JobEvent.objects.filter(
            job_id=job_pk, number=status_event_number, type="status"
        ).first()
        status = (status_event.data or {}).get("status") if status_event else None
        if job is None or status_event is None or status not in TERMINAL:
            return None
        event = JobEvent.objects.filter(
            job_id=job_pk, type=NOTIFICATION, data__status_event=status_event_number
        ).first()
        created = event is None
        recipient = _recipient(job)
        if event is None:
            event = event_append(
                job=job,
                type=NOTIFICATION,
                level="error" if status == "failed" else "info",
                message=_summary(job, status_event),
                data=_event_data(job, status_event, email=bool(recipient)),
            )
    if not recipient or not (created or retrying):
        return Notified(event, created, emailed=False)
    _email(job, status_event, recipient)
    return Notified(event, created, emailed=True)


def _recipient(job: TrainingJob) -> str:
    user = job.created_by
    return (getattr(user, "email", "") or "").strip() if user is not None else ""


def _error(status_event: JobEvent) -> tuple[str, str] | None:
    data = status_event.data or {}
    if data.get("status") != "failed":
        return None
    return str(data.get("code") or "internal_error"), status_event.message


def _verb(status_event: JobEvent) -> str:
    status = str(status_event.data["status"])
    return "was cancelled" if status == "cancelled" else status


def _summary(job: TrainingJob, status_event: JobEvent) -> str:
    error = _error(status_event)
    if error:
        return f"Fine-tuning job {job.public_id} failed ({error[0]}): {error[1]}"
    return f"Fine-tuning job {job.public_id} {_verb(status_event)}."


def _event_data(job: TrainingJob, status_event: JobEvent, *, email: bool) -> dict[str, object]:
    status = status_event.data["status"]
    data: dict[str, object] = {
        "status_event": status_event.number,
        "status": status,
        "channels": ["email"] if email else [],
    }
    if status == "succeeded":
        data["fine_tuned_model"] = job.fine_tuned_model_name
    if error := _error(status_event):
        data["error"] = {"code": error[0], "message": error[1][:1000]}
    return data


def _body(job: TrainingJob, status_event: JobEvent) -> str:
    status = status_event.data["status"]
    lines = [
        f"Your fine-tuning job {job.public_id} {_verb(status_event)}.",
        "",
        f"Job:      {job.public_id}",
        f"Model:    {job.model}",
        f"Status:   {status}",
    ]
    if error := _error(status_event):
        lines.append(f"Error:    {error[0]}: {error[1][:2000]}")
    if status == "succeeded":
        lines.append(f"Fine-tuned model: {job.fine_tuned_model_name}")
    if job.cost is not None:
        lines.append(f"Cost:     ${job.cost:.4f}")
    if base := settings.TRAINHUB_PUBLIC_URL:
        lines.append(f"Link:     {base.rstrip('/')}/v1/fine_tuning/jobs/{job.public_id}")
    lines += ["", f"Project: {job.project.slug}. You get this mail because you created the job."]
    return "\n".join(lines) + "\n"


def _email(job: TrainingJob, status_event: JobEvent, recipient: str) -> None:
    subject = f"[trainhub] Fine-tuning job {job.public_id} {_verb(status_event)}"
    try:
        send_mail(subject, _body(job, status_event), None, [recipient], fail_silently=False)
    except smtplib.SMTPRecipientsRefused as exc:
        codes = [code for code, _ in exc.recipients.values()]
        if all(code >= 500 for code in codes):  # permanent: sending again gets the same answer
            log.warning("job %s: notification email refused: %s", job.public_id, codes)
            return
        raise EmailDeferred(f"recipient deferred: SMTP {codes}") from exc
    except smtplib.SMTPResponseException as exc:
        if exc.smtp_code >= 500:
            log.warning("job %s: notification email refused: %s", job.public_id, exc.smtp_code)
            return
        raise EmailDeferred(f"SMTP {exc.smtp_code}: {exc.smtp_error!r}") from exc
    except (smtplib.SMTPException, OSError) as exc:  # disconnects, refused connections, timeouts
        raise EmailDeferred(f"{type(exc).__name__}: {exc}") from exc
