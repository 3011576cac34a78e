"""EC2 instances as RemoteStates: the one status map, and how a spot interruption reads."""

from __future__ import annotations

from collections.abc import Mapping

from providers.aws.api import SSH_PORT
from providers.base import RemoteState, RemoteStatus, SshAddress

# An instance's ``State.Name``.
STATUS_MAP: Mapping[str, RemoteStatus] = {
    "pending": RemoteStatus.PENDING,
    "running": RemoteStatus.RUNNING,  # PENDING until it has a public IP address
    # Unasked (trainhub's own stop is confirmed by the poll that sees it): someone terminated
    # or stopped it (console, another tool, a health event, the max-runtime shutdown).
    "shutting-down": RemoteStatus.LOST,
    "terminated": RemoteStatus.LOST,
    "stopping": RemoteStatus.LOST,
    "stopped": RemoteStatus.LOST,
}

# ``StateReason.Code`` of an instance EC2 took back from the spot market.
SPOT_INTERRUPTION_CODES = frozenset(
    {"Server.SpotInstanceTermination", "Server.SpotInstanceShutdown"}
)


def instance_state(
    instance: object,
    *,
    ssh_user: str,
    ssh_port: int = SSH_PORT,
    price_per_hour: float | None = None,
) -> RemoteState:
    """A described EC2 instance as a RemoteState."""
    if not isinstance(instance, dict):
        return RemoteState(RemoteStatus.PENDING, "EC2 sent no instance object")
    raw = str((instance.get("State") or {}).get("Name") or "")
    status = STATUS_MAP.get(raw, RemoteStatus.PENDING)
    reason = instance.get("StateReason") or {}
    reason_code = str(reason.get("Code") or "") if isinstance(reason, dict) else ""
    if status is RemoteStatus.LOST:
        if instance.get("InstanceLifecycle") == "spot" and reason_code in SPOT_INTERRUPTION_CODES:
            return RemoteState(
                RemoteStatus.FAILED,
                f"EC2 interrupted the spot instance ({reason_code}): it is {raw}",
                error_code="preempted",
            )
        said = f" ({reason_code})" if reason_code else ""
        return RemoteState(status, f"the instance is {raw}{said}", price_per_hour=price_per_hour)
    ip = instance.get("PublicIpAddress")
    if status is RemoteStatus.RUNNING and ip:
        address = SshAddress(host=str(ip), port=ssh_port, username=ssh_user)
        return RemoteState(status, "running", ssh=address, price_per_hour=price_per_hour)
    if raw == "running":
        message = "running, no public IP address yet"
        return RemoteState(RemoteStatus.PENDING, message, price_per_hour=price_per_hour)
    return RemoteState(
        RemoteStatus.PENDING, raw or "unknown EC2 instance state", price_per_hour=price_per_hour
    )
