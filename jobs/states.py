"""Job statuses, the allowed transitions and what a report about an attempt does: pure data,
no Django.

This is DESIGN's status table. ``jobs.services.core.status.job_transition`` is the only writer
of a job's status and consults nothing but this module; ``attempt_report`` (core.attempts) acts
on a report by :data:`REPORT_ACTIONS` alone.
"""

from __future__ import annotations

import enum

from trainhub_contract.outcomes import Outcome


class JobStatus(enum.StrEnum):
    VALIDATING_FILES = "validating_files"
    QUEUED = "queued"
    PROVISIONING = "provisioning"
    RUNNING = "running"
    FINALIZING = "finalizing"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"
    # Stopped by the user after saving a checkpoint; resume queues it again (OpenAI's pause).
    PAUSED = "paused"


S = JobStatus
TERMINAL: frozenset[JobStatus] = frozenset({S.SUCCEEDED, S.FAILED, S.CANCELLED})
# Paused counts as live: it counts against the project's concurrent-job limit (so resume never
# has to refuse for the limit, and pausing is no way around it) and it keeps its files in use.
LIVE: frozenset[JobStatus] = frozenset(set(S) - TERMINAL)
# Statuses in which an attempt may be holding a machine. Not paused: a paused job's last
# attempt may still be saving its checkpoint, but its machine is being stopped and no new one
# starts until resume.
ATTEMPT_ACTIVE: frozenset[JobStatus] = frozenset(
    {S.PROVISIONING, S.RUNNING, S.FINALIZING, S.CANCELLING}
)

# to-status -> the statuses it may be entered from
ALLOWED_FROM: dict[JobStatus, frozenset[JobStatus]] = {
    S.QUEUED: frozenset(
        {S.VALIDATING_FILES, S.PROVISIONING, S.RUNNING, S.FAILED, S.CANCELLED, S.PAUSED}
    ),
    S.PROVISIONING: frozenset({S.QUEUED}),
    S.RUNNING: frozenset({S.PROVISIONING}),
    # An attempt not yet training can be paused too: it is stopped before it starts.
    S.PAUSED: frozenset({S.PROVISIONING, S.RUNNING}),
    # paused: the run finished before the pause reached it; its adapter is kept.
    S.FINALIZING: frozenset({S.RUNNING, S.PAUSED}),
    S.SUCCEEDED: frozenset({S.FINALIZING}),
    S.FAILED: LIVE,
    S.CANCELLING: LIVE - {S.CANCELLING},
    # validating_files holds no machine, so it can be cancelled at once.
    S.CANCELLED: frozenset({S.CANCELLING, S.VALIDATING_FILES}),
    S.VALIDATING_FILES: frozenset(),
}


def can_transition(src: JobStatus | str, dst: JobStatus | str) -> bool:
    return JobStatus(src) in ALLOWED_FROM[JobStatus(dst)]


class ReportAction(enum.StrEnum):
    """What a report about a live attempt (its executor's, or its provider's for it) does."""

    START = "start"  # provisioning → running: training began
    FINALIZE = "finalize"  # → finalizing, and the reported bundle is ingested and verified
    END = "end"  # the attempt ends; its end reason decides where the job goes (attempt_end)
    IGNORE = "ignore"  # a repeat, or news the job has already moved past


# (reported outcome, job status) → what happens, for every place an attempt runs in: a node's
# reports, events read over SSH, and a provider's own states (polling turns them into reports).
REPORT_ACTIONS: dict[tuple[Outcome, JobStatus], ReportAction] = {
    **{(outcome, status): ReportAction.IGNORE for outcome in Outcome for status in S},
    (Outcome.RUNNING, S.PROVISIONING): ReportAction.START,
    (Outcome.SUCCEEDED, S.RUNNING): ReportAction.FINALIZE,
    # paused: the run finished before the pause reached it; its adapter is kept.
    (Outcome.SUCCEEDED, S.PAUSED): ReportAction.FINALIZE,
    # A run that failed or stopped ends its attempt, whatever the job's status.
    **{(Outcome.FAILED, status): ReportAction.END for status in S},
    **{(Outcome.CANCELLED, status): ReportAction.END for status in S},
}


class JobCapacity(enum.StrEnum):
    """How a job may rent cloud machines (``TrainingJob.capacity``); own nodes ignore it.
    ``providers.base.CapacityType`` is what one machine is rented as; ``ANY`` lets placement take
    the cheaper of the two, offer by offer."""

    ON_DEMAND = "on_demand"
    SPOT = "spot"
    ANY = "any"


class WaitCode(enum.StrEnum):
    """Why a queued job is not placed yet; the ``code`` of its waiting events."""

    NO_NODE_REGISTERED = "no_node_registered"
    NODES_OFFLINE = "nodes_offline"
    NODES_BUSY = "nodes_busy"
    NO_NODE_FITS = "no_node_fits"
    NO_OFFER = "no_offer"  # no cloud offer (nor, for ``auto``, an idle node) can take it


class EndReason(enum.StrEnum):
    """Why an attempt ended. Each reason knows where the job goes next."""

    SUCCEEDED = "succeeded"
    CANCELLED = "cancelled"
    # stopped by a pause (after saving a checkpoint where the executor could): the job waits
    # for resume, and this attempt does not count against max_attempts
    PAUSED = "paused"
    # lost: the job goes back to the queue while attempts remain
    WORKER_LOST = "worker_lost"
    LEASE_EXPIRED = "lease_expired"
    NO_CAPACITY = "no_capacity"
    PREEMPTED = "preempted"
    # heartbeats went on, progress did not (a hang): stopped and resumed from its checkpoint
    STALLED = "stalled"
    # the provider bills more than the job's max_price_per_hour: stopped, another offer is tried
    PRICE_CAP_EXCEEDED = "price_cap_exceeded"
    # permanent: the job fails
    INVALID_DATASET = "invalid_dataset"
    INVALID_MODEL = "invalid_model"
    OOM = "oom"
    TIMEOUT = "timeout"
    DOWNLOAD_FAILED = "download_failed"
    UPLOAD_FAILED = "upload_failed"
    ARTIFACT_CORRUPT = "artifact_corrupt"
    PROVIDER_ERROR = "provider_error"
    INTERNAL_ERROR = "internal_error"

    @property
    def retryable(self) -> bool:
        return self in RETRYABLE


RETRYABLE: frozenset[EndReason] = frozenset(
    {
        EndReason.WORKER_LOST,
        EndReason.LEASE_EXPIRED,
        EndReason.NO_CAPACITY,
        EndReason.PREEMPTED,
        EndReason.PRICE_CAP_EXCEEDED,
        EndReason.STALLED,
    }
)
