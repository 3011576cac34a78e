"""The provider adapter contract. Verbs return at once; Celery tasks do the waiting.

Adapters take and return the frozen dataclasses below, never raw provider payloads.
"""

from __future__ import annotations

import enum
import fnmatch
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


class CapacityType(enum.StrEnum):
    """How a machine is rented. Spot (AWS spot, Vast.ai interruptible bids, RunPod
    interruptible pods) costs ``Offer.spot_price_per_hour`` and may be taken back at any time:
    the adapter reports such an end as FAILED with ``error_code`` "preempted" (an EndReason)."""

    ON_DEMAND = "on_demand"
    SPOT = "spot"


@dataclass(frozen=True)
class SshAddress:
    """Where a VM-style machine accepts SSH (the executor is driven over it)."""

    host: str
    port: int
    username: str = "root"


@dataclass(frozen=True)
class Offer:
    """A machine a provider would rent now, at a price. ``offer_id`` is what ``launch`` needs
    to rent exactly this one (a Vast ask id, a Lambda ``<instance type>@<region>``)."""

    target: str  # the registry target that launches it
    offer_id: str
    gpu_name: str
    gpu_count: int
    vram_gb: float  # per GPU, decimal GB as sold
    price_per_hour: float  # on-demand USD per hour for the whole machine
    # Where the machine can be rented as spot (CapacityType.SPOT): its price (AWS: the current spot
    # price; Vast.ai: the bid trainhub would place; RunPod: the interruptible price). None: no spot.
    spot_price_per_hour: float | None = None
    available: bool = True  # False: listed, but the provider has no capacity for it now
    region: str = ""
    machine_id: str = ""  # the physical host where the provider exposes it (Vast)
    details: Mapping[str, object] = field(default_factory=dict)  # reliability, CUDA, vCPUs...


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
    # Rent exactly this offer (targets with offers; placement chose it). None: the adapter's
    # own choice (targets without a price list).
    offer: Offer | None = None
    # SPOT: rent ``offer`` at its spot price, interruptible (placement only asks where the
    # offer has a ``spot_price_per_hour``).
    capacity: CapacityType = CapacityType.ON_DEMAND


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
    price_per_hour: float | None = None  # the rate the provider bills, where it says


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


class OfferSource(Protocol):
    """Adapters of targets with a price list (``Target.has_offers``) also answer this."""

    def offers(self, gpu: Mapping[str, object]) -> list[Offer]:
        """What the provider would rent now for the job's ``gpu`` needs ({count, min_vram_gb,
        name glob}), available or not, cheapest first. A coarse filter: the control plane
        checks every offer against the needs again (jobs.placement) and says why it skips one."""
        ...


def gpu_name_matches(pattern: str, gpu_name: str) -> bool:
    """A job's GPU name glob against a provider's GPU name, case-insensitive and with spaces and
    underscores alike (providers write "RTX 4090", CLIs "RTX_4090")."""
    pattern, name = pattern.lower(), gpu_name.lower()
    names = {name, name.replace(" ", "_")}
    patterns = {pattern, pattern.replace("_", " "), pattern.replace(" ", "_")}
    return any(fnmatch.fnmatchcase(n, p) for n in names for p in patterns)


def offer_misfit(gpu: Mapping[str, object], offer: Offer) -> str | None:
    """Why ``offer`` cannot run a job with these ``gpu`` needs ({count, min_vram_gb, name}),
    or None. More GPUs than asked still fit (clouds sell fixed counts per machine)."""
    need = int(str(gpu.get("count") or 0))
    if need > offer.gpu_count:
        return f"has {offer.gpu_count} GPU(s), the job needs {need}"
    vram = gpu.get("min_vram_gb")
    if need and vram is not None and offer.vram_gb < float(str(vram)):
        return f"has {offer.vram_gb:g} GB per GPU, the job needs {float(str(vram)):g} GB"
    name = gpu.get("name")
    if need and name and not gpu_name_matches(str(name), offer.gpu_name):
        return f"has {offer.gpu_name}, the job needs {name}"
    return None
