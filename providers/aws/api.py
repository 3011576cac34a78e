"""What the AWS adapter knows about EC2 itself: the target name, how trainhub tags and names
what it creates, the idempotency token of a launch, and how a handle names a region."""

from __future__ import annotations

import hashlib

from providers.base import CapacityType

TARGET = "aws"
SSH_PORT = 22
# Every instance, volume and key pair trainhub creates carries these tags; the reconciler and
# the poll find ours by TAG_MANAGED (the Name tag is the machine name, trainhub-<job>-a<n>).
TAG_MANAGED = "trainhub:managed"
TAG_JOB = "trainhub:job"
TAG_ATTEMPT = "trainhub:attempt"
MANAGED_FILTER = {"Name": f"tag:{TAG_MANAGED}", "Values": ["true"]}
# States of an instance that still bills (or may again): what the reconciler sweeps.
LIVE_STATES = ("pending", "running", "stopping", "stopped")
SPOT_PRODUCT = "Linux/UNIX"  # the spot price series of a Linux AMI in a VPC


def client_token(name: str, offer_id: str, capacity: CapacityType) -> str:
    """RunInstances' idempotency token for an attempt on one offer: EC2 answers a repeat with
    the instance the first call started. The offer and capacity are in it because a token
    reused with other parameters is refused (IdempotentParameterMismatch), and an attempt may
    try several offers in turn. At most 64 ASCII characters."""
    digest = hashlib.sha256(f"{name}|{offer_id}|{capacity.value}".encode()).hexdigest()
    return f"trainhub-{digest[:48]}"


def handle_id(region: str, instance_id: str) -> str:
    """An instance id alone does not say which regional endpoint knows it."""
    return f"{region}/{instance_id}"


def split_handle(value: str) -> tuple[str, str]:
    """(region, instance id) of a handle id; ('', '') when it is not one of ours."""
    region, sep, instance_id = value.partition("/")
    if not sep or not region or not instance_id.startswith("i-"):
        return "", ""
    return region, instance_id


def tags(name: str, job_id: str, attempt: int) -> list[dict[str, str]]:
    return [
        {"Key": "Name", "Value": name},
        {"Key": TAG_MANAGED, "Value": "true"},
        {"Key": TAG_JOB, "Value": job_id},
        {"Key": TAG_ATTEMPT, "Value": str(attempt)},
    ]


def tag_value(resource: object, key: str) -> str:
    """One tag of a described EC2 resource ('' when absent)."""
    items = resource.get("Tags") if isinstance(resource, dict) else None
    for tag in items or []:
        if isinstance(tag, dict) and tag.get("Key") == key:
            return str(tag.get("Value") or "")
    return ""
