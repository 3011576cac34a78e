"""Typed executor failures, and the exit code a run's outcome gives the process.

Reasons are the string values of ``jobs.states.EndReason`` (the control plane's enum; this
package cannot import Django code, so the values are repeated here and a test keeps them in
step). A failed ``status`` event carries the reason as ``data.code``.

Outcomes and exit codes by name: ``trainhub_contract.outcomes``.
"""

from __future__ import annotations

from trainhub_contract.outcomes import ExitCode, Outcome

INVALID_DATASET = "invalid_dataset"
INVALID_MODEL = "invalid_model"
OOM = "oom"
TIMEOUT = "timeout"
DOWNLOAD_FAILED = "download_failed"
UPLOAD_FAILED = "upload_failed"
INTERNAL_ERROR = "internal_error"
CANCELLED = "cancelled"
# The provider reclaims the machine (a spot interruption notice): retried by the control plane.
PREEMPTED = "preempted"

REASONS = frozenset(
    {
        INVALID_DATASET,
        INVALID_MODEL,
        OOM,
        TIMEOUT,
        DOWNLOAD_FAILED,
        UPLOAD_FAILED,
        INTERNAL_ERROR,
        PREEMPTED,
    }
)


class ExecutorError(Exception):
    """A failure with a reason the control plane understands and a message a user can act on."""

    def __init__(self, reason: str, message: str) -> None:
        if reason not in REASONS:
            raise ValueError(f"unknown executor failure reason {reason!r}")
        super().__init__(message)
        self.reason = reason
        self.message = message

    def __str__(self) -> str:
        return f"{self.reason}: {self.message}"


class Cancelled(BaseException):
    """Raised inside the executor when a stop was requested; run() turns it into a result.

    A BaseException (like KeyboardInterrupt), so library code's ``except Exception`` cannot
    swallow it when a second SIGTERM raises it from the signal handler."""


class Preempted(BaseException):
    """Raised inside the executor once a preemption stop took effect (after its checkpoint);
    run() turns it into a ``failed`` result with reason ``preempted``. A BaseException for the
    same reason as :class:`Cancelled`."""


def exit_code(outcome: Outcome, reason: str = "") -> ExitCode:
    """The process exit code for a run's outcome (a timeout and a preemption are failures with
    codes of their own)."""
    if outcome is Outcome.SUCCEEDED:
        return ExitCode.SUCCEEDED
    if outcome is Outcome.CANCELLED:
        return ExitCode.CANCELLED
    return {TIMEOUT: ExitCode.TIMEOUT, PREEMPTED: ExitCode.PREEMPTED}.get(reason, ExitCode.FAILED)
