"""What an executor reports about its run: one vocabulary for the executor, the node's
supervisor and the control plane (Django-free, like all of gpu_worker). The values are the
strings on the wire (``status`` events, the serverless handler's output)."""

from __future__ import annotations

import enum


class Outcome(enum.StrEnum):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
