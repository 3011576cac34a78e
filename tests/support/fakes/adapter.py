"""A scripted ProviderAdapter for tests: records every call, returns the states a test sets.

Register it as a real registry target (``register_fake``) so services and tasks find it the
same way they find a provider, through ``providers.registry``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from providers import registry
from providers.base import Handle, LaunchRequest, Offer, RemoteState, RemoteStatus
from providers.errors import NoCapacity


@dataclass
class FakeAdapter:
    """One fake cloud. ``states`` maps instance id → what the next polls report; an id that
    is absent is LOST (the provider does not know it); ids in ``unknown`` are left out of
    ``poll`` (their status call failed this cycle)."""

    name: str = "fake-cloud"
    launches: list[LaunchRequest] = field(default_factory=list)
    polls: list[list[Handle]] = field(default_factory=list)
    cancels: list[Handle] = field(default_factory=list)
    states: dict[str, RemoteState] = field(default_factory=dict)
    unknown: set[str] = field(default_factory=set)
    names: dict[str, str] = field(default_factory=dict)  # instance id → machine name
    secrets_seen: list[dict[str, str]] = field(default_factory=list)
    launch_error: Exception | None = None
    # Targets with a price list: what offers() returns, the gpu needs it was asked with, and
    # the offer ids whose launch answers "no capacity".
    offer_list: list[Offer] = field(default_factory=list)
    offer_queries: list[dict[str, object]] = field(default_factory=list)
    full: set[str] = field(default_factory=set)
    # Runs inside launch(), before the handle is returned: a stand-in for whatever another
    # process does while the provider call is in flight.
    on_launch: Callable[[LaunchRequest], None] | None = None
    _ids: itertools.count = field(default_factory=lambda: itertools.count(1))

    # --- ProviderAdapter ---------------------------------------------------------------------

    def launch(self, request: LaunchRequest) -> Handle:
        self.launches.append(request)
        if self.on_launch is not None:
            self.on_launch(request)
        if self.launch_error is not None:
            raise self.launch_error
        if request.offer is not None and request.offer.offer_id in self.full:
            raise NoCapacity(
                f"offer {request.offer.offer_id} has no machine free", provider=self.name
            )
        instance_id = f"{self.name}-i{next(self._ids)}"
        self.states[instance_id] = RemoteState(RemoteStatus.PENDING, "starting")
        self.names[instance_id] = request.name
        return Handle(instance_id=instance_id, name=request.name)

    def poll(self, handles: Sequence[Handle]) -> dict[str, RemoteState]:
        self.polls.append(list(handles))
        return {
            h.instance_id: self.states.get(
                h.instance_id, RemoteState(RemoteStatus.LOST, "the provider does not know it")
            )
            for h in handles
            if h.instance_id not in self.unknown
        }

    def cancel(self, handle: Handle) -> None:
        self.cancels.append(handle)
        if handle.instance_id in self.states:  # cancel of a missing instance is success
            self.states[handle.instance_id] = RemoteState(RemoteStatus.CANCELLED, "terminated")

    def offers(self, gpu: Mapping[str, object]) -> list[Offer]:
        self.offer_queries.append(dict(gpu))
        return sorted(self.offer_list, key=lambda o: o.price_per_hour)

    def list_instances(self) -> list[Handle]:
        return [
            Handle(instance_id=i, name=self.names.get(i, ""))
            for i, s in self.states.items()
            if s.status in (RemoteStatus.PENDING, RemoteStatus.RUNNING)
        ]

    # --- test helpers --------------------------------------------------------------------------

    def add_offer(
        self,
        offer_id: str,
        price: float,
        *,
        gpu: str = "RTX 4090",
        count: int = 1,
        spot: float | None = None,
        **extra: object,
    ) -> Offer:
        """An offer at ``price`` on demand and, with ``spot``, that spot price too."""
        offer = Offer(
            target=self.name,
            offer_id=offer_id,
            gpu_name=gpu,
            gpu_count=count,
            vram_gb=float(extra.pop("vram_gb", 24)),  # type: ignore[arg-type]
            price_per_hour=price,
            spot_price_per_hour=spot,
            **extra,  # type: ignore[arg-type]
        )
        self.offer_list.append(offer)
        return offer

    def set_state(
        self, instance_id: str, status: RemoteStatus, message: str = "", **extra: object
    ) -> None:
        self.states[instance_id] = RemoteState(status, message, **extra)  # type: ignore[arg-type]

    def preempt(self, instance_id: str) -> None:
        """The provider takes a spot machine back: what adapters report for an interruption
        (providers.base.CapacityType)."""
        self.states[instance_id] = RemoteState(
            RemoteStatus.FAILED, "spot instance interrupted by the provider", "preempted"
        )

    @property
    def cancelled_ids(self) -> list[str]:
        return [h.instance_id for h in self.cancels]


def register_fake(
    name: str = "fake-cloud",
    *,
    credential_kind: str | None = None,
    poll_batch: int = 10_000,
    has_offers: bool = False,
    kind: registry.TargetKind = registry.TargetKind.SERVERLESS,
) -> FakeAdapter:
    """Register ``name`` as a cloud target backed by one shared FakeAdapter; returns it.
    The secrets each adapter was built with are kept in ``adapter.secrets_seen``.
    The caller unregisters it (``registry.unregister(name)``) in teardown."""
    adapter = FakeAdapter(name=name)

    def factory(secrets: dict[str, str]) -> FakeAdapter:
        adapter.secrets_seen.append(dict(secrets))
        return adapter

    registry.register(
        registry.Target(
            name=name,
            description="Scripted fake provider (tests only).",
            kind=kind,
            credential_kind=credential_kind,
            adapter_factory=factory,
            poll_batch=poll_batch,
            has_offers=has_offers,
        )
    )
    return adapter
