"""What a launch needs to exist in a region before RunInstances: the AMI, the security group
that opens SSH to the control plane only, the attempt's key pair; and the look-up that finds
an instance an earlier try of the attempt started."""

from __future__ import annotations

import hashlib
import ipaddress
from typing import Any

from providers.aws.api import TAG_MANAGED, TARGET, tags
from providers.aws.client import call, instances
from providers.aws.errors import translate
from providers.base import LaunchRequest
from providers.errors import PermanentProviderError


def find_instance(ec2: Any, region: str, name: str) -> str:
    """The id of a live instance of this attempt in ``region`` ('' when none)."""
    for instance in instances(
        ec2,
        region,
        [
            {"Name": "tag:Name", "Values": [name]},
            {"Name": "instance-state-name", "Values": ["pending", "running"]},
        ],
    ):
        return str(instance["InstanceId"])
    return ""


def image(ec2: Any, region: str, *, ami_id: str, ami_name: str, ami_owner: str) -> tuple[str, str]:
    """(AMI id, root device name) for ``region``."""
    ami = ami_for(ami_id, region)
    if ami:
        images = call(ec2, "describe_images", region, ImageIds=[ami]).get("Images")
        where = f"AMI {ami} (TRAINHUB_AWS_AMI_ID)"
    else:
        images = call(
            ec2,
            "describe_images",
            region,
            Owners=[ami_owner],
            Filters=[
                {"Name": "name", "Values": [ami_name]},
                {"Name": "state", "Values": ["available"]},
                {"Name": "architecture", "Values": ["x86_64"]},
            ],
        ).get("Images")
        where = f"an AMI named {ami_name!r} owned by {ami_owner}"
    images = [i for i in images or [] if isinstance(i, dict) and i.get("ImageId")]
    if not images:
        raise PermanentProviderError(
            f"{where} does not exist in {region}: set TRAINHUB_AWS_AMI_ID (an id, or "
            "region=ami-… pairs) or TRAINHUB_AWS_AMI_NAME to an image of that region",
            provider=TARGET,
        )
    newest = max(images, key=lambda i: str(i.get("CreationDate") or ""))
    return str(newest["ImageId"]), str(newest.get("RootDeviceName") or "/dev/sda1")


def security_group(ec2: Any, region: str, cidr: str, port: int = 22) -> str:
    """The group (default VPC) that opens the SSH port to the control plane's CIDR only (one
    per CIDR and port: a changed setting gets a group of its own)."""
    try:
        network = ipaddress.ip_network(cidr, strict=False)
    except ValueError as exc:
        raise PermanentProviderError(
            f"TRAINHUB_AWS_SSH_CIDR {cidr!r} is not a CIDR ({exc}): set it to the control "
            "plane's egress address range, e.g. 203.0.113.7/32",
            provider=TARGET,
        ) from exc
    name = "trainhub-ssh-" + hashlib.sha256(f"{network}:{port}".encode()).hexdigest()[:12]
    found = call(
        ec2,
        "describe_security_groups",
        region,
        Filters=[{"Name": "group-name", "Values": [name]}],
    ).get("SecurityGroups")
    if found:
        return str(found[0]["GroupId"])
    try:
        group = str(
            ec2.create_security_group(
                GroupName=name,
                Description=f"trainhub: SSH from the control plane ({network}) only",
                TagSpecifications=[
                    {
                        "ResourceType": "security-group",
                        "Tags": [{"Key": TAG_MANAGED, "Value": "true"}],
                    }
                ],
            )["GroupId"]
        )
    except Exception as exc:
        error = translate(exc, action=f"CreateSecurityGroup in {region}")
        if error.code != "InvalidGroup.Duplicate":
            raise error from exc
        return security_group(ec2, region, cidr, port)  # a concurrent launch made it
    ranges = (
        {"Ipv6Ranges": [{"CidrIpv6": str(network), "Description": "trainhub control plane"}]}
        if network.version == 6
        else {"IpRanges": [{"CidrIp": str(network), "Description": "trainhub control plane"}]}
    )
    try:
        ec2.authorize_security_group_ingress(
            GroupId=group,
            IpPermissions=[{"IpProtocol": "tcp", "FromPort": port, "ToPort": port, **ranges}],
        )
    except Exception as exc:
        error = translate(exc, action=f"AuthorizeSecurityGroupIngress in {region}")
        if error.code != "InvalidPermission.Duplicate":
            raise error from exc
    return group


def import_key(ec2: Any, region: str, request: LaunchRequest) -> None:
    try:
        ec2.import_key_pair(
            KeyName=request.name,
            PublicKeyMaterial=request.ssh_public_key.encode(),
            TagSpecifications=[
                {
                    "ResourceType": "key-pair",
                    "Tags": tags(request.name, request.job_id, request.attempt),
                }
            ],
        )
    except Exception as exc:
        error = translate(exc, action=f"ImportKeyPair in {region}")
        if error.code != "InvalidKeyPair.Duplicate":  # an earlier try of the attempt
            raise error from exc


def ami_for(setting: str, region: str) -> str:
    """The AMI id ``TRAINHUB_AWS_AMI_ID`` names for ``region``: one id for every region, or
    ``region=ami-…`` pairs ('' when the region has none: the name pattern decides)."""
    entries = [e.strip() for e in setting.split(",") if e.strip()]
    for entry in entries:
        key, sep, value = entry.partition("=")
        if not sep:
            return key
        if key.strip() == region:
            return value.strip()
    return ""


def deadline_script(max_runtime_seconds: int) -> str:
    """User data: the machine powers itself off (and so terminates) an hour after the job's
    max runtime, whatever happens to the control plane."""
    minutes = max(60, max_runtime_seconds // 60 + 60)
    return f"#!/bin/sh\nshutdown -h +{minutes} 'trainhub: max runtime reached'\n"
