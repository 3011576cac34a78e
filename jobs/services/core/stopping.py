"""Stopping cloud machines, in two phases: ask the provider, then wait for a poll to show the
machine gone (the job stays ``cancelling`` until then). Every attempt end asks for the stop of
the job's machines that nothing runs on any more; an unconfirmed stop is sent again.

A paused job's machine is stopped like a cancelled one's, except where the executor can be
asked to checkpoint first: an SSH-driven machine it was started on pauses in place
(:func:`pauses_in_place`: polling writes "pause" into its cancel file and collects its last
events) and is terminated once its attempt ends, or after ``PAUSE_GRACE_SECONDS`` at most.

The runners (jobs.services.runners) of the rented places send these stops; ``registry.cloud``
here only finds the provider that holds a machine."""

from __future__ import annotations

import logging
from datetime import timedelta

from django.db.models import Q
from django.utils import timezone

from jobs.models import JobAttempt, TrainingJob
from jobs.services.accounts.targets import MissingCredentials, adapter_for
from jobs.services.core.attempts import attempt_end, machine_handle, machine_name
from jobs.services.outbox import messages
from jobs.states import TERMINAL, EndReason, JobStatus
from providers import registry
from providers.base import ProviderAdapter, RemoteState, RemoteStatus
from providers.errors import ProviderError

log = logging.getLogger(__name__)
S = JobStatus
ALIVE = (RemoteStatus.PENDING, RemoteStatus.RUNNING)
# A stop the provider has not confirmed by then is sent again.
STOP_RESEND_SECONDS = 60
# How long a paused SSH-driven machine may take to upload its checkpoint before it is
# terminated all the same (it bills meanwhile).
PAUSE_GRACE_SECONDS = 600


def pauses_in_place(attempt: JobAttempt) -> bool:
    """Whether a paused job's live attempt on a rented machine is left running to save its
    checkpoint: the control plane started its executor (claimed: on an SSH-driven machine;
    a serverless run is never claimed, its handler cannot be signalled) and the pause's grace
    has not run out."""
    asked = attempt.pause_requested_at
    return (
        attempt.claimed_at is not None
        and asked is not None
        and timezone.now() - asked < timedelta(seconds=PAUSE_GRACE_SECONDS)
    )


def job_stop_machines(*, job_pk: int) -> None:
    """Stop the job's cloud machines, whatever the outcome (a finished attempt's machine must
    stop billing too). The live attempt is stopped only once the job is cancelling, paused
    (unless it pauses in place) or over: while the job runs, it is a newer attempt than the
    lost one whose end sent this stop. A stop that fails is sent again by this task (and, at
    worst, by the reconciler)."""
    job = TrainingJob.objects.select_related("project").get(pk=job_pk)
    attempts = job.attempts.exclude(provider_instance_id="").filter(
        Q(ended_at__isnull=True) | Q(stop_requested_at__isnull=True)
    )
    failed = False
    for attempt in attempts.select_related("job"):
        if attempt.ended_at is None and not _stops_live_attempt(job, attempt):
            continue
        target = registry.cloud(attempt.target)
        if target is None:
            continue
        try:
            adapter = adapter_for(target, job.project)
        except MissingCredentials as exc:
            log.error("cannot stop %s: %s", machine_name(attempt), exc)
            continue
        failed |= not request_stop(adapter, attempt)
    if failed:
        messages.send_stop_machines(job_pk, countdown=STOP_RESEND_SECONDS)


def _stops_live_attempt(job: TrainingJob, attempt: JobAttempt) -> bool:
    if job.status == S.PAUSED:
        return not pauses_in_place(attempt)
    return job.status in (S.CANCELLING, *TERMINAL)


def confirm_stop(adapter: ProviderAdapter, attempt: JobAttempt, state: RemoteState) -> bool:
    """Second phase of a stop: the attempt ends once the provider shows the machine gone."""
    if state.status not in ALIVE:
        attempt_end(attempt=attempt, reason=EndReason.CANCELLED, message="stopped at the provider")
        return False
    sent = attempt.stop_requested_at
    if sent is None or timezone.now() - sent > timedelta(seconds=STOP_RESEND_SECONDS):
        request_stop(adapter, attempt)
    return True


def request_stop(adapter: ProviderAdapter, attempt: JobAttempt) -> bool:
    try:
        adapter.cancel(machine_handle(attempt))
    except ProviderError as exc:
        log.warning("stop of %s failed (sent again later): %s", machine_name(attempt), exc)
        return False
    JobAttempt.objects.filter(pk=attempt.pk).update(
        stop_requested_at=timezone.now(), next_poll_at=timezone.now()
    )
    return True
