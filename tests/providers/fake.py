"""A scripted ProviderAdapter for tests: records every call, returns the states a test sets.

Register it as a real registry target (``register_fake``) so services and tasks find it the
same way they find a provider, through ``providers.registry``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from providers import registry
from providers.base import Handle, LaunchRequest, RemoteState, RemoteStatus


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

    def list_instances(self) -> list[Handle]:
        return [
            Handle(instance_id=i, name=self.names.get(i, ""))
            for i, s in self.states.items()
            if s.status in (RemoteStatus.PENDING, RemoteStatus.RUNNING)
        ]

    # --- test helpers --------------------------------------------------------------------------

    def set_state(
        self, instance_id: str, status: RemoteStatus, message: str = "", **extra: object
    ) -> None:
        self.states[instance_id] = RemoteState(status, message, **extra)  # type: ignore[arg-type]

    @property
    def cancelled_ids(self) -> list[str]:
        return [h.instance_id for h in self.cancels]


def register_fake(
    name: str = "fake-cloud", *, credential_kind: str | None = None, poll_batch: int = 10_000
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
            credential_kind=credential_kind,
            adapter_factory=factory,
            poll_batch=poll_batch,
        )
    )
    return adapter
