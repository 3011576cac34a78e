"""What an executor run ends in, shared by the executor, the node's supervisor and the control
plane (which imports this Django-free module), so no side spells an outcome as a bare string.

``Outcome`` values are the ``data.status`` strings of a ``status`` event on the wire.
``ExitCode`` is what ``python -m gpu_worker run`` exits with, read by a supervisor (the GPU
node's Celery task, the SSH wrapper) that cannot see the events:

=====  ==========================================================================
0      succeeded: the bundle was uploaded and reported
1      failed: any reason except timeout (the reason is in the last status event)
2      usage error (bad command line or unreadable/invalid spec file; argparse's own code)
3      cancelled: SIGTERM/SIGINT or the cancel file; nothing left behind
4      timeout: max_runtime_seconds ran out
=====  ==========================================================================
"""

from __future__ import annotations

from enum import IntEnum, StrEnum


class Outcome(StrEnum):
    """An executor's status as reported in a ``status`` event."""

    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


class ExitCode(IntEnum):
    """The executor process's exit code."""

    SUCCEEDED = 0
    FAILED = 1
    USAGE = 2
    CANCELLED = 3
    TIMEOUT = 4

    @classmethod
    def reported(cls) -> frozenset[ExitCode]:
        """The codes of an executor that sent its own final status event (USAGE exits before
        it can report: the spec was refused)."""
        return frozenset({cls.SUCCEEDED, cls.FAILED, cls.CANCELLED, cls.TIMEOUT})
