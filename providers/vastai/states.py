"""Vast.ai instances (``GET /api/v1/instances/`` rows) as RemoteStates: the one status map."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from providers.base import RemoteState, RemoteStatus, SshAddress
from providers.vastai.api import number

# The EndReason an interrupted spot machine ends with (providers.base.CapacityType).
PREEMPTED = "preempted"

# ``actual_status``, the container's state. Vast sends null while the contract is being set up:
# ``instance_state`` reads null (and a missing field) as "".
STATUS_MAP: Mapping[str, RemoteStatus] = {
    "": RemoteStatus.PENDING,  # null: provisioning
    "created": RemoteStatus.PENDING,  # container created, not started (see the OCI check)
    "loading": RemoteStatus.PENDING,  # pulling the image, starting
    "rebooting": RemoteStatus.PENDING,
    "restarting": RemoteStatus.PENDING,  # not in Vast's docs; SkyPilot sees it
    "running": RemoteStatus.RUNNING,
    # We never stop or freeze an instance: stopped means outbid or interrupted, and frozen
    # something we did not ask for. Neither resumes on its own.
    "stopped": RemoteStatus.LOST,
    "frozen": RemoteStatus.LOST,
    # These never become running, and the instance bills its disk until destroyed.
    "exited": RemoteStatus.LOST,  # the container process exited unexpectedly
    "unknown": RemoteStatus.LOST,  # no heartbeat from the host
    "offline": RemoteStatus.LOST,  # the host disconnected
}


def instance_state(instance: Mapping[str, Any] | None) -> RemoteState:
    """An instance of ``GET /instances/`` (None: not listed) as a RemoteState."""
    if instance is None:
        return RemoteState(RemoteStatus.LOST, "Vast no longer lists this instance")
    raw = str(instance.get("actual_status") or "")
    price = number(instance.get("dph_total"))
    status_msg = str(instance.get("status_msg") or "").strip()
    states = {instance.get(k) for k in ("cur_state", "intended_status", "next_state")}
    if instance.get("is_bid") and (states == {"stopped"} or raw == "stopped"):
        # An interruptible instance Vast stopped: outbid, or its host took it back. We never
        # stop one ourselves, and it stays stopped (billing its disk) until it is destroyed.
        return RemoteState(
            RemoteStatus.FAILED,
            "preempted: Vast stopped this interruptible instance (outbid or its host took it "
            f"back; actual_status {raw or 'null'})",
            error_code=PREEMPTED,
            price_per_hour=price,
        )
    if states == {"stopped"}:
        return RemoteState(
            RemoteStatus.LOST,
            f"outbid or interrupted: Vast stopped the instance (actual_status {raw or 'null'})",
            price_per_hour=price,
        )
    if raw == "created" and _is_error(status_msg):
        # The container could not start (e.g. "OCI runtime create failed"): it never will.
        return RemoteState(
            RemoteStatus.LOST, f"the container failed to start: {status_msg}", price_per_hour=price
        )
    status = STATUS_MAP.get(raw, RemoteStatus.PENDING)
    if status is RemoteStatus.LOST:
        detail = f": {status_msg}" if status_msg else ""
        return RemoteState(status, f"the instance is {raw}{detail}", price_per_hour=price)
    if status is RemoteStatus.RUNNING:
        address = _ssh_address(instance)
        if address is not None:
            return RemoteState(status, "running", ssh=address, price_per_hour=price)
        return RemoteState(
            RemoteStatus.PENDING, "running, without a direct SSH port yet", price_per_hour=price
        )
    return RemoteState(status, raw or "provisioning", price_per_hour=price)


def _ssh_address(instance: Mapping[str, Any]) -> SshAddress | None:
    """``ssh_direct``: root at the host's public address, on the port mapped to 22."""
    host = str(instance.get("public_ipaddr") or "").strip()
    ports = instance.get("ports")
    bindings = ports.get("22/tcp") if isinstance(ports, dict) else None
    if not host or not isinstance(bindings, list) or not bindings:
        return None
    first = bindings[0]
    port = first.get("HostPort") if isinstance(first, dict) else None
    if port is None or not str(port).isdigit():
        return None
    return SshAddress(host=host, port=int(port), username="root")


def _is_error(status_msg: str) -> bool:
    text = status_msg.lower()
    return "error" in text or "failed" in text
