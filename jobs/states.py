"""Job statuses and the allowed transitions: pure data, no Django.

This is DESIGN's status table. ``jobs.services.jobs.job_transition`` is the only writer of a
job's status and consults nothing but this module.
"""

from __future__ import annotations

import enum


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


S = JobStatus
TERMINAL: frozenset[JobStatus] = frozenset({S.SUCCEEDED, S.FAILED, S.CANCELLED})
LIVE: frozenset[JobStatus] = frozenset(set(S) - TERMINAL)
# Statuses in which an attempt may be holding a machine.
ATTEMPT_ACTIVE: frozenset[JobStatus] = frozenset(
    {S.PROVISIONING, S.RUNNING, S.FINALIZING, S.CANCELLING}
)

# to-status -> the statuses it may be entered from
ALLOWED_FROM: dict[JobStatus, frozenset[JobStatus]] = {
    S.QUEUED: frozenset({S.VALIDATING_FILES, S.PROVISIONING, S.RUNNING, S.FAILED, S.CANCELLED}),
    S.PROVISIONING: frozenset({S.QUEUED}),
    S.RUNNING: frozenset({S.PROVISIONING}),
    S.FINALIZING: frozenset({S.RUNNING}),
    S.SUCCEEDED: frozenset({S.FINALIZING}),
    S.FAILED: LIVE,
    S.CANCELLING: LIVE - {S.CANCELLING},
    # validating_files holds no machine, so it can be cancelled at once.
    S.CANCELLED: frozenset({S.CANCELLING, S.VALIDATING_FILES}),
    S.VALIDATING_FILES: frozenset(),
}


def can_transition(src: JobStatus | str, dst: JobStatus | str) -> bool:
    return JobStatus(src) in ALLOWED_FROM[JobStatus(dst)]


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
    # lost: the job goes back to the queue while attempts remain
    WORKER_LOST = "worker_lost"
    LEASE_EXPIRED = "lease_expired"
    NO_CAPACITY = "no_capacity"
    PREEMPTED = "preempted"
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
    }
)
