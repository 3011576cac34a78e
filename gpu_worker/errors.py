"""Typed executor failures and the process exit codes.

Reasons are the string values of ``jobs.states.EndReason`` (the control plane's enum; this
package cannot import Django code, so the values are repeated here and a test keeps them in
step). A failed ``status`` event carries the reason as ``data.code``.

Exit codes of ``python -m gpu_worker run`` (what a supervisor such as the GPU node's Celery task
or an SSH wrapper reads when it cannot see the events):

=====  ==========================================================================
0      succeeded: the bundle was uploaded and reported
1      failed: any reason except timeout (the reason is in the last status event)
2      usage error (bad command line or unreadable/invalid spec file; argparse's own code)
3      cancelled: SIGTERM/SIGINT or the cancel file; nothing left behind
4      timeout: max_runtime_seconds ran out
=====  ==========================================================================
"""

from __future__ import annotations

INVALID_DATASET = "invalid_dataset"
INVALID_MODEL = "invalid_model"
OOM = "oom"
TIMEOUT = "timeout"
DOWNLOAD_FAILED = "download_failed"
UPLOAD_FAILED = "upload_failed"
INTERNAL_ERROR = "internal_error"
CANCELLED = "cancelled"

REASONS = frozenset(
    {INVALID_DATASET, INVALID_MODEL, OOM, TIMEOUT, DOWNLOAD_FAILED, UPLOAD_FAILED, INTERNAL_ERROR}
)

EXIT_SUCCEEDED = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_CANCELLED = 3
EXIT_TIMEOUT = 4


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


def exit_code(status: str, reason: str = "") -> int:
    """The process exit code for a run result."""
    if status == "succeeded":
        return EXIT_SUCCEEDED
    if status == "cancelled":
        return EXIT_CANCELLED
    return EXIT_TIMEOUT if reason == TIMEOUT else EXIT_FAILED
