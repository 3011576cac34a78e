"""Lambda instances as RemoteStates: the one status map."""

from __future__ import annotations

from collections.abc import Mapping

from providers.base import RemoteState, RemoteStatus, SshAddress
from providers.lambda_cloud.api import SSH_PORT, SSH_USER, price

STATUS_MAP: Mapping[str, RemoteStatus] = {
    "booting": RemoteStatus.PENDING,
    "active": RemoteStatus.RUNNING,  # PENDING until it has an IP address
    # May recover; the control plane's readiness deadline and lease bound the wait.
    "unhealthy": RemoteStatus.PENDING,
    "terminating": RemoteStatus.LOST,  # unasked: someone terminated it (console, another tool)
    "terminated": RemoteStatus.LOST,
}


def instance_state(instance: object) -> RemoteState:
    """A Lambda instance object as a RemoteState."""
    if not isinstance(instance, dict):
        return RemoteState(RemoteStatus.PENDING, "Lambda sent no instance object")
    raw = str(instance.get("status", ""))
    status = STATUS_MAP.get(raw, RemoteStatus.PENDING)
    rate = price(instance.get("instance_type"))
    if status is RemoteStatus.LOST:
        return RemoteState(status, f"the instance is {raw}", price_per_hour=rate)
    ip = instance.get("ip")
    if status is RemoteStatus.RUNNING and ip:
        address = SshAddress(host=str(ip), port=SSH_PORT, username=SSH_USER)
        return RemoteState(status, "active", ssh=address, price_per_hour=rate)
    if raw == "active":
        return RemoteState(RemoteStatus.PENDING, "active, no IP address yet", price_per_hour=rate)
    if raw == "unhealthy":
        message = "Lambda reports the instance unhealthy"
    else:
        message = raw or "unknown Lambda instance status"
    return RemoteState(RemoteStatus.PENDING, message, price_per_hour=rate)
