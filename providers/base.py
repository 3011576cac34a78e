"""The provider adapter contract. Verbs return at once; Celery tasks do the waiting.

Adapters take and return the frozen dataclasses below, never raw provider payloads.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

# Every rented machine is named trainhub-<job>-a<attempt>: how the reconciler recognises ours.
MACHINE_PREFIX = "trainhub-"


class RemoteStatus(enum.StrEnum):
    PENDING = "pending"  # accepted, machine not ready yet
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    LOST = "lost"  # the provider no longer knows it, or it died under us


@dataclass(frozen=True)
class SshAddress:
    """Where a VM-style machine accepts SSH (the executor is driven over it)."""

    host: str
    port: int
    username: str = "root"


@dataclass(frozen=True)
class LaunchRequest:
    job_id: str
    attempt: int
    name: str  # trainhub-<job>-a<attempt>: how the reconciler recognises our machines
    max_runtime_seconds: int
    spec: dict[str, object] = field(default_factory=dict)  # handler-style providers run it
    gpu: Mapping[str, object] = field(default_factory=dict)  # the job's {count, min_vram_gb, name}
    ssh_public_key: str = ""  # VM-style providers: the key the machine must accept
    webhook_url: str = ""  # where the provider may report completion ('' = poll only)


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
    ssh: SshAddress | None = None  # VM-style machines, once they accept SSH


class ProviderAdapter(Protocol):
    """One cloud provider. ``cancel`` of a missing instance is success."""

    def launch(self, request: LaunchRequest) -> Handle: ...

    def poll(self, handles: Sequence[Handle]) -> dict[str, RemoteState]:
        """States keyed by ``Handle.instance_id``; batched where the provider can list. A
        machine the provider no longer knows is LOST; a handle left out is unknown this cycle
        (its call failed) and is asked about again next cycle."""
        ...

    def cancel(self, handle: Handle) -> None: ...

    def list_instances(self) -> list[Handle]:
        """Every machine of ours the account still has (names start with ``trainhub-``)."""
        ...
