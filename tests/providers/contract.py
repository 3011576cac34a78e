"""What the provider contract test (test_contract.py) needs to know about an adapter: a
``Case`` per adapter, built from ``Exchange``s (one call and the provider's success answer).
Each provider's payload module defines its case; test_contract.py lists them in ``CASES``."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import responses

from providers.base import Handle, LaunchRequest, ProviderAdapter, RemoteStatus

KEY = "rpa_CONTRACT_KEY_9b2e4c7a51d3"  # distinctive: it must never appear in an error
Sleep = Callable[[float], None]
REQUEST = LaunchRequest(
    job_id="ftjob-x",
    attempt=2,
    name="trainhub-ftjob-x-a2",
    max_runtime_seconds=3600,
    spec={"version": 1, "job_id": "ftjob-x", "attempt": 2},
    gpu={"count": 1, "min_vram_gb": 40},
    ssh_public_key="ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIcontract trainhub-ftjob-x-a2",
)


@dataclass(frozen=True)
class Exchange:
    """One call an adapter makes, and the provider's success answer to it."""

    method: str
    url: str
    status: int = 200
    json: object = None  # None: no body (204)

    def answer(self) -> None:
        responses.add(self.method, self.url, status=self.status, json=self.json)

    def fail(self, status: int, **answer: Any) -> None:
        responses.add(self.method, self.url, status=status, **answer)

    def calls(self) -> list[Any]:
        return [
            c
            for c in responses.calls
            if c.request.method == self.method and c.request.url.split("?")[0] == self.url
        ]


@dataclass(frozen=True)
class Case:
    """What the contract needs to know about one adapter."""

    name: str
    base_url: str
    build: Callable[[str, Sleep], ProviderAdapter]  # (base URL, sleep) → adapter
    instance_id: str
    launch: Exchange
    cancel: Callable[[str], Exchange]  # instance id → its cancel call
    # (instance ids, raw provider status) → the calls one poll makes, answered with that status
    poll: Callable[[Sequence[str], str], list[Exchange]]
    status_map: Mapping[str, RemoteStatus]
    documented_statuses: frozenset[str]
    unauthorized: dict[str, object]  # the provider's 401 body
    not_found: dict[str, object]  # its 404 body for an id it does not know
    before_launch: tuple[Exchange, ...] = field(default=())  # calls a launch makes first
    request: LaunchRequest = REQUEST  # what launch is asked (targets with offers name one)

    def handle(self, instance_id: str = "") -> Handle:
        return Handle(instance_id=instance_id or self.instance_id, name=REQUEST.name)


class Sleeps(list[float]):
    """A ``sleep`` that records the waits instead of waiting (the ``sleeps`` fixture)."""

    def __call__(self, seconds: float) -> None:
        self.append(seconds)
