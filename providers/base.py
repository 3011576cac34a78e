"""The provider adapter contract. Verbs return at once; Celery tasks do the waiting.

Adapters take and return the frozen dataclasses below, never raw provider payloads.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol


class RemoteStatus(enum.StrEnum):
    PENDING = "pending"  # accepted, machine not ready yet
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    LOST = "lost"  # the provider no longer knows it, or it died under us


@dataclass(frozen=True)
class LaunchRequest:
    job_id: str
    attempt: int
    name: str  # trainhub-<job>-a<attempt>: how the reconciler recognises our machines
    max_runtime_seconds: int
    spec: dict[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class Handle:
    """What identifies a launched attempt at the provider."""

    instance_id: str
    name: str = ""


@dataclass(frozen=True)
class RemoteState:
    status: RemoteStatus
    message: str = ""
    error_code: str = ""  # an EndReason value when status is FAILED
    events: tuple[dict[str, object], ...] = ()


class ProviderAdapter(Protocol):
    """One cloud provider. ``cancel`` of a missing instance is success."""

    def launch(self, request: LaunchRequest) -> Handle: ...

    def poll(self, handles: Sequence[Handle]) -> dict[str, RemoteState]:
        """States keyed by ``Handle.instance_id``; batched where the provider can list."""
        ...

    def cancel(self, handle: Handle) -> None: ...

    def list_instances(self) -> list[Handle]: ...
