"""Targets a job may name, and the adapter and credential kind behind each.

``local`` is the operator's own GPU fleet: jobs reach it through the node dispatcher, not a
cloud adapter. Cloud targets register an adapter factory here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from providers.base import ProviderAdapter

AUTO_TARGET = "auto"


@dataclass(frozen=True)
class Target:
    name: str
    description: str
    credential_kind: str | None = None  # None: needs no provider credential
    adapter_factory: Callable[[dict[str, str]], ProviderAdapter] | None = None


# Secret fields each credential kind stores (validated on create; values never returned).
CREDENTIAL_KINDS: dict[str, tuple[str, ...]] = {
    "runpod": ("api_key",),
    "lambda": ("api_key",),
    "vastai": ("api_key",),
}

_TARGETS: dict[str, Target] = {
    "local": Target("local", "The operator's own GPU nodes (Celery queue per node)."),
}


def register(target: Target) -> None:
    _TARGETS[target.name] = target


def unregister(name: str) -> None:
    _TARGETS.pop(name, None)


def get(name: str) -> Target | None:
    return _TARGETS.get(name)


def names() -> list[str]:
    return sorted(_TARGETS)


def cloud_targets() -> list[Target]:
    return [t for t in _TARGETS.values() if t.adapter_factory is not None]
