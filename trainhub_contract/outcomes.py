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
5      preempted: the provider announced it reclaims the machine (a spot interruption
       notice, gpu_worker.preemption); a checkpoint of the last finished step was uploaded
       first where there was one to save. The status event is ``failed`` with code
       ``preempted``, which the control plane retries (the job goes back to ``queued``)
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
    PREEMPTED = 5

    @classmethod
    def reported(cls) -> frozenset[ExitCode]:
        """The codes of an executor that sent its own final status event (USAGE exits before
        it can report: the spec was refused)."""
        return frozenset({cls.SUCCEEDED, cls.FAILED, cls.CANCELLED, cls.TIMEOUT, cls.PREEMPTED})


class StopMode(StrEnum):
    """How a run is asked to stop. A pause stops like a cancel (same outcome and exit code),
    but saves a checkpoint first, so the job's next attempt resumes from there. A preemption
    saves the checkpoint the same way but ends ``failed`` with reason ``preempted`` (exit 5),
    which the control plane retries: asked by the executor's own preemption watcher
    (gpu_worker.preemption), or by a cancel file holding "preempt" (a launcher that learns of
    the provider's warning another way)."""

    CANCEL = "cancel"
    PAUSE = "pause"
    PREEMPT = "preempt"

    @property
    def saves_checkpoint(self) -> bool:
        """Whether the run uploads a checkpoint of its last finished step before it stops."""
        return self is not StopMode.CANCEL

    @classmethod
    def of_file(cls, path: Path) -> StopMode | None:
        """The stop a cancel file asks for: None while it is absent; a pause or a preemption
        when it holds exactly "pause" or "preempt"; a cancel for anything else (an empty file,
        as older nodes touch)."""
        try:
            text = path.read_text(encoding="utf-8", errors="replace").strip()
        except FileNotFoundError:
            return None
        except OSError:  # there but unreadable: a stop all the same
            return cls.CANCEL
        return cls(text) if text in (cls.PAUSE, cls.PREEMPT) else cls.CANCEL

    def write_file(self, path: Path) -> None:
        """Write the cancel file whole (temporary file + rename): an executor that finds it
        half-written would take an empty file for a cancel."""
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text("" if self is StopMode.CANCEL else self.value, encoding="utf-8")
        tmp.replace(path)
