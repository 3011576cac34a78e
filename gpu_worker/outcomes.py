"""What an executor run ends in, shared by the executor, the node's supervisor and the control
plane (which imports this Django-free module), so no side spells an outcome as a bare string.

``Outcome`` values are the ``data.status`` strings of a ``status`` event on the wire.
``StopMode`` is how a run is asked to stop: the ``mode`` of a node's stop request and the content
of the executor's cancel file. ``ExitCode`` is what ``python -m gpu_worker run`` exits with, read by a supervisor (the GPU
node's Celery task, the SSH wrapper) that cannot see the events:

=====  ==========================================================================
0      succeeded: the bundle was uploaded and reported
1      failed: any reason except timeout (the reason is in the last status event)
2      usage error (bad command line or unreadable/invalid spec file; argparse's own code)
3      cancelled: SIGTERM/SIGINT or the cancel file; nothing left behind (a pause: after
       uploading a checkpoint)
4      timeout: max_runtime_seconds ran out
=====  ==========================================================================
"""

from __future__ import annotations

import os
from enum import IntEnum, StrEnum
from pathlib import Path


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


class StopMode(StrEnum):
    """How a run is asked to stop. A pause stops like a cancel (same outcome and exit code),
    but saves a checkpoint first, so the job's next attempt resumes from there."""

    CANCEL = "cancel"
    PAUSE = "pause"

    @classmethod
    def of_file(cls, path: Path) -> StopMode | None:
        """The stop a cancel file asks for: None while it is absent; a pause when it holds
        exactly "pause"; a cancel for anything else (an empty file, as older nodes touch)."""
        try:
            text = path.read_text(encoding="utf-8", errors="replace").strip()
        except FileNotFoundError:
            return None
        except OSError:  # there but unreadable: a stop all the same
            return cls.CANCEL
        return cls.PAUSE if text == cls.PAUSE else cls.CANCEL

    def write_file(self, path: Path) -> None:
        """Write the cancel file whole (temporary file + rename): an executor that finds it
        half-written would take an empty file for a cancel."""
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(self.value if self is StopMode.PAUSE else "", encoding="utf-8")
        tmp.replace(path)
