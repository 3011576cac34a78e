"""Targets a job may name: what kind of place each is, and the adapter and credential behind it.

A target's :class:`TargetKind` is the one answer to "is this the own fleet, and how does the
executor start there?": ``local`` is the operator's own GPU fleet (the node dispatcher, no
adapter); every cloud target registers an adapter factory.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

from providers.base import ProviderAdapter

AUTO_TARGET = "auto"
OWN_FLEET_TARGET = "local"


class TargetKind(enum.Enum):
    """Where an attempt runs, which decides who starts the executor and how it reports."""

    OWN_FLEET = "own_fleet"  # the operator's GPU nodes: the dispatcher sends it to a node queue
    SERVERLESS = "serverless"  # the provider's handler runs the spec given at launch
    SSH_MACHINE = "ssh_machine"  # a rented VM: the control plane drives the executor over SSH


@dataclass(frozen=True)
class Target:
    name: str
    description: str
    kind: TargetKind
    credential_kind: str | None = None  # None: needs no provider credential
    # Builds the adapter from the credential's secrets; every cloud kind has one.
    adapter_factory: Callable[[dict[str, str]], ProviderAdapter] | None = None
    # Attempts polled per cycle at most (one status call each where the API cannot list).
    poll_batch: int = 10_000
    # Why the target cannot be used as configured ('' when it can), checked at submit.
    misconfiguration: Callable[[], str] = lambda: ""
    # The adapter lists priced offers (providers.base.OfferSource): placement chooses one,
    # ``auto`` may use the target, and price caps are checked before a machine is rented.
    has_offers: bool = False
    # Where a spot machine of this target warns before it is taken back (the executor's
    # ``preemption_notice``: gpu_worker/preemption.py); None: no warning to watch for.
    spot_notice: str | None = None

    def __post_init__(self) -> None:
        if self.is_cloud != (self.adapter_factory is not None):
            raise ValueError(f"target {self.name}: a cloud target needs an adapter, the fleet none")

    @property
    def is_cloud(self) -> bool:
        """Rented from a provider (billed; the reconciler and the stop apply)."""
        return self.kind is not TargetKind.OWN_FLEET

    @property
    def drives_ssh(self) -> bool:
        """The control plane starts and watches the executor over SSH."""
        return self.kind is TargetKind.SSH_MACHINE


# Secret fields each credential kind stores (validated on create; values never returned).
CREDENTIAL_KINDS: dict[str, tuple[str, ...]] = {
    "runpod": ("api_key",),
    "lambda": ("api_key",),
    "vastai": ("api_key",),
    "aws": ("access_key_id", "secret_access_key"),
}


def _runpod_serverless(secrets: dict[str, str]) -> ProviderAdapter:
    from providers import runpod_serverless

    return runpod_serverless.from_settings(secrets)


def _runpod_pod(secrets: dict[str, str]) -> ProviderAdapter:
    from providers import runpod_pod

    return runpod_pod.from_settings(secrets)


def _lambda(secrets: dict[str, str]) -> ProviderAdapter:
    from providers import lambda_cloud

    return lambda_cloud.from_settings(secrets)


def _vastai(secrets: dict[str, str]) -> ProviderAdapter:
    from providers import vastai

    return vastai.from_settings(secrets)


def _aws(secrets: dict[str, str]) -> ProviderAdapter:
    from providers import aws

    return aws.from_settings(secrets)


def _needs_setting(name: str) -> Callable[[], str]:
    def check() -> str:
        from django.conf import settings

        return "" if getattr(settings, name, "") else f"the operator has not set {name}"

    return check


def _pod_cloud_problem() -> str:
    from django.conf import settings

    if settings.RUNPOD_POD_CLOUD not in ("SECURE", "COMMUNITY"):  # REST v2 creates take no ALL
        return f"RUNPOD_POD_CLOUD is {settings.RUNPOD_POD_CLOUD!r}, not SECURE or COMMUNITY"
    return ""


_TARGETS: dict[str, Target] = {
    OWN_FLEET_TARGET: Target(
        OWN_FLEET_TARGET,
        "The operator's own GPU nodes (Celery queue per node).",
        TargetKind.OWN_FLEET,
    ),
    "runpod-serverless": Target(
        "runpod-serverless",
        "RunPod serverless: one job per attempt on the operator's endpoint.",
        TargetKind.SERVERLESS,
        credential_kind="runpod",
        adapter_factory=_runpod_serverless,
        # 10 s of the status budget (1,800 calls per 10 s), one call per attempt.
        poll_batch=1800,
        misconfiguration=_needs_setting("RUNPOD_ENDPOINT_ID"),
    ),
    "runpod-pod": Target(
        "runpod-pod",
        "RunPod pods (REST v2), the executor driven over SSH.",
        TargetKind.SSH_MACHINE,
        credential_kind="runpod",
        adapter_factory=_runpod_pod,
        # One list call covers every pod; each running one costs an SSH round trip.
        poll_batch=200,
        misconfiguration=_pod_cloud_problem,
        has_offers=True,
    ),
    "lambda": Target(
        "lambda",
        "Lambda Cloud on-demand instances, the executor driven over SSH (user ubuntu).",
        TargetKind.SSH_MACHINE,
        credential_kind="lambda",
        adapter_factory=_lambda,
        poll_batch=200,  # one list call covers every instance
        has_offers=True,
    ),
    "vastai": Target(
        "vastai",
        "Vast.ai marketplace offers (direct SSH), the executor driven over SSH.",
        TargetKind.SSH_MACHINE,
        credential_kind="vastai",
        adapter_factory=_vastai,
        poll_batch=200,  # one list call covers every instance
        has_offers=True,
    ),
    "aws": Target(
        "aws",
        "AWS EC2 GPU instances (on-demand or spot), the executor driven over SSH (user ubuntu).",
        TargetKind.SSH_MACHINE,
        credential_kind="aws",
        adapter_factory=_aws,
        poll_batch=1000,  # one DescribeInstances per region covers every instance
        misconfiguration=_needs_setting("TRAINHUB_AWS_SSH_CIDR"),
        has_offers=True,
        spot_notice="aws",  # the instance metadata's spot/instance-action, 2 minutes ahead
    ),
}


def register(target: Target) -> None:
    _TARGETS[target.name] = target


def unregister(name: str) -> None:
    _TARGETS.pop(name, None)


def get(name: str) -> Target | None:
    return _TARGETS.get(name)


def names() -> list[str]:
    return sorted(_TARGETS)


def cloud(name: str) -> Target | None:
    """The cloud target called ``name``; None for the own fleet, ``auto`` or an unknown name."""
    target = _TARGETS.get(name)
    return target if target is not None and target.is_cloud else None


def is_own_fleet(name: str) -> bool:
    target = _TARGETS.get(name)
    return target is not None and target.kind is TargetKind.OWN_FLEET


def cloud_targets() -> list[Target]:
    return [t for t in _TARGETS.values() if t.is_cloud]


def priced_targets() -> list[Target]:
    """Cloud targets with a price list: where ``auto`` may place a job."""
    return [t for t in cloud_targets() if t.has_offers]
