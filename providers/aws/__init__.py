"""AWS EC2 (``aws``): one GPU instance per attempt, the executor driven over SSH by the control
plane (``providers.ssh``) exactly as on Lambda and Vast. boto3 is the client (imported lazily);
every boto3 error is mapped to the provider error family (``errors``).

What the adapter relies on in EC2's API, as read in AWS's API reference and checked against
moto's server:

- Offers. EC2 has no price call of its own (the Pricing service is a separate bulk catalogue),
  so on-demand prices come from a table (``prices``, overridable by setting). Per configured
  region: ``DescribeInstanceTypes`` (filtered by type name, wildcards allowed) gives
  ``GpuInfo.Gpus[].{Name, Manufacturer, Count, MemoryInfo.SizeInMiB}``;
  ``DescribeInstanceTypeOfferings`` with ``LocationType=region`` says whether the region sells
  the type at all (it says nothing about capacity now: only a launch finds that out);
  ``DescribeSpotPriceHistory`` with ``StartTime=now`` gives the current spot price of each
  (type, zone): the offer carries the lowest. One offer per (type, region), ``offer_id``
  ``<type>@<region>``.
- Launch. ``RunInstances`` takes a ``ClientToken`` (up to 64 ASCII characters): a repeat with
  the same token and parameters answers with the instance the first call started, so a launch
  whose answer was lost is simply sent again; the same token with other parameters is refused
  (``IdempotentParameterMismatch``), which is why the token hashes the attempt's name with the
  offer and the capacity. Before it, the adapter looks for a live instance tagged with the
  attempt's name (a launch of an earlier try that went through). ``TagSpecifications`` tag the
  instance and its volumes at creation (no untagged window for the reconciler to miss); the
  attempt's public key is imported as a key pair named after the attempt (``ImportKeyPair``,
  tagged too) and deleted when the instance is terminated. One security group per region and
  CIDR (``trainhub-ssh-<hash>``, in the default VPC) opens the SSH port (22) to
  ``TRAINHUB_AWS_SSH_CIDR`` only. The AMI is ``TRAINHUB_AWS_AMI_ID`` (one id, or one per
  region), else the newest image named like ``TRAINHUB_AWS_AMI_NAME`` (an AWS Deep Learning
  AMI by default, whose login is ``ubuntu``); its root device gets ``TRAINHUB_AWS_DISK_GB`` of
  gp3, deleted with the instance. ``InstanceInitiatedShutdownBehavior=terminate`` and a user-data
  ``shutdown`` after the job's max runtime + 1 h bound what a forgotten machine can cost.
- Spot. ``InstanceMarketOptions={"MarketType": "spot", "SpotOptions": {"SpotInstanceType":
  "one-time", "InstanceInterruptionBehavior": "terminate", "MaxPrice": <on-demand price>}}``:
  EC2 bills the current spot price, never above MaxPrice. An interrupted instance goes to
  ``shutting-down``/``terminated`` with ``StateReason.Code`` ``Server.SpotInstanceTermination``
  (``Server.SpotInstanceShutdown`` for stop behaviour) and ``InstanceLifecycle`` ``spot``: the
  poll reports it FAILED with error code ``preempted``. (The two-minute notice shows only in
  the instance metadata and the spot request's status, ``marked-for-termination``, which would
  cost a call per region per poll; the executor's checkpoints cover the loss.)
- Errors. Capacity (``InsufficientInstanceCapacity``, ``SpotMaxPriceTooLow``,
  ``MaxSpotInstanceCountExceeded``, ``Unsupported`` …) is NoCapacity: the next offer is
  tried. The account's quota (``VcpuLimitExceeded``, ``InstanceLimitExceeded``) is
  ``QuotaExceeded``, a permanent error that tells the operator to raise it.
  ``RequestLimitExceeded`` is EC2's throttle. boto3's standard retry mode retries throttles
  and 5xx a few times itself, launches included: the ClientToken makes that safe.
- Poll. One ``DescribeInstances`` per region and cycle, filtered by the ``trainhub:managed``
  tag, answers for every handle of the region. EC2 is eventually consistent: an instance just
  launched may not be listed yet, and a terminated one stays listed for about an hour, so a
  handle that is not listed is left out (unknown this cycle) rather than called lost; the
  attempt's lease bounds that wait.
- Cancel. ``TerminateInstances`` (idempotent at EC2); an instance EC2 does not know is
  success. Then, best effort, the attempt's key pair is deleted (``DeleteKeyPair`` of a missing
  key succeeds).
- Reconciler. ``list_instances`` lists, per region, the tagged instances in a state that
  bills (pending, running, stopping, stopped).

Credentials: a project's ``aws`` credential (``access_key_id``, ``secret_access_key``), or,
where the operator allows it (``TRAINHUB_AWS_USE_DEFAULT_CHAIN``), boto3's default chain
(environment, profile, instance role), as the S3 storage backend does.
"""

from __future__ import annotations

import contextlib
import logging
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from providers.aws import client, resources
from providers.aws.api import (
    LIVE_STATES,
    MANAGED_FILTER,
    SPOT_PRODUCT,
    SSH_PORT,
    TAG_MANAGED,
    TARGET,
    client_token,
    handle_id,
    split_handle,
    tag_value,
    tags,
)
from providers.aws.errors import ERROR_CODES, translate
from providers.aws.offers import fitting, region_offers, spot_prices
from providers.aws.prices import ON_DEMAND_USD_PER_HOUR, on_demand_price
from providers.aws.states import SPOT_INTERRUPTION_CODES, STATUS_MAP, instance_state
from providers.base import (
    MACHINE_PREFIX,
    CapacityType,
    Handle,
    LaunchRequest,
    Offer,
    RemoteState,
    RemoteStatus,
)
from providers.errors import (
    InstanceNotFound,
    InvalidCredentials,
    NoCapacity,
    PermanentProviderError,
    ProviderError,
    RateLimited,
    TransientProviderError,
    vm_launch_target,
)

__all__ = [
    "DEFAULT_AMI_NAME",
    "ERROR_CODES",
    "ON_DEMAND_USD_PER_HOUR",
    "OPERATOR_CHAIN",
    "SPOT_INTERRUPTION_CODES",
    "SSH_PORT",
    "STATUS_MAP",
    "TAG_MANAGED",
    "TARGET",
    "AwsEc2",
    "client_token",
    "from_settings",
    "instance_state",
]

log = logging.getLogger(__name__)

# The AWS Deep Learning AMI (NVIDIA driver, CUDA, PyTorch) on Ubuntu 22.04; login ubuntu.
DEFAULT_AMI_NAME = "Deep Learning OSS Nvidia Driver AMI GPU PyTorch * (Ubuntu 22.04) *"
# What an operator credential of kind "aws" holds when the default chain is allowed: no key.
OPERATOR_CHAIN = "boto3-default-chain"
ClientFactory = Callable[[str], Any]  # region -> an EC2 client


class AwsEc2:
    """The adapter for one AWS account (a key pair, or boto3's default chain when both are
    empty). ``regions`` and ``instance_types`` say what is offered; ``client_factory`` (tests)
    replaces the boto3 client built for a region."""

    def __init__(
        self,
        *,
        access_key_id: str = "",
        secret_access_key: str = "",
        session_token: str = "",
        regions: Sequence[str],
        instance_types: Sequence[str],
        ssh_cidr: str,
        ami_id: str = "",
        ami_name: str = DEFAULT_AMI_NAME,
        ami_owner: str = "amazon",
        disk_gb: int = 200,
        ssh_user: str = "ubuntu",
        ssh_port: int = SSH_PORT,
        endpoint_url: str = "",
        price_overrides: Mapping[str, float] | None = None,
        max_attempts: int = 4,
        client_factory: ClientFactory | None = None,
    ) -> None:
        self._credentials = {
            "aws_access_key_id": access_key_id or None,
            "aws_secret_access_key": secret_access_key or None,
            "aws_session_token": session_token or None,
        }
        self._regions = list(regions)
        self._types = list(instance_types)
        self._cidr = ssh_cidr
        self._ami_id = ami_id
        self._ami_name = ami_name
        self._ami_owner = ami_owner
        self._disk_gb = disk_gb
        self._ssh_user = ssh_user
        self._ssh_port = ssh_port
        self._endpoint_url = endpoint_url or None
        self._prices = dict(price_overrides or {})
        self._max_attempts = max_attempts
        self._factory = client_factory
        self._clients: dict[str, Any] = {}
        self._session: Any = None

    # --- offers ---------------------------------------------------------------------------

    def offers(self, gpu: Mapping[str, object]) -> list[Offer]:
        """Every configured region's offers; a region whose calls fail is left out (and
        logged) while another answers, so one region not enabled for the account or briefly
        throttled does not hide the rest. When none answers, the first failure is raised."""
        out: list[Offer] = []
        failures: list[ProviderError] = []
        for region in self._regions:
            try:
                out += self._region_offers(region)
            except ProviderError as exc:
                log.warning("aws: no offers from %s this time: %s", region, exc)
                failures.append(exc)
        if failures and len(failures) == len(self._regions):
            raise failures[0]
        return fitting(out, gpu)

    def _region_offers(self, region: str) -> list[Offer]:
        ec2 = self._ec2(region)
        type_filter = [{"Name": "instance-type", "Values": self._types}]
        described = {
            str(t["InstanceType"]): t
            for t in client.pages(
                ec2, "describe_instance_types", "InstanceTypes", region, Filters=type_filter
            )
        }
        if not described:
            return []
        offered = {
            str(o["InstanceType"])
            for o in client.pages(
                ec2,
                "describe_instance_type_offerings",
                "InstanceTypeOfferings",
                region,
                LocationType="region",
                Filters=type_filter,
            )
        }
        history = client.pages(
            ec2,
            "describe_spot_price_history",
            "SpotPriceHistory",
            region,
            InstanceTypes=sorted(offered),
            ProductDescriptions=[SPOT_PRODUCT],
            StartTime=datetime.now(UTC),
        ) if offered else []  # fmt: skip
        return region_offers(
            region,
            types=described,
            offered=offered,
            spot=spot_prices(history),
            price_overrides=self._prices,
        )

    # --- launch ---------------------------------------------------------------------------

    def launch(self, request: LaunchRequest) -> Handle:
        offer, type_name, region = vm_launch_target(request, TARGET, "AWS")
        spot = request.capacity is CapacityType.SPOT
        if spot and offer.spot_price_per_hour is None:
            raise PermanentProviderError(
                f"{type_name} in {region} has no spot price: it cannot be rented as spot",
                provider=TARGET,
            )
        ec2 = self._ec2(region)
        existing = resources.find_instance(ec2, region, request.name)
        if existing:
            return Handle(instance_id=handle_id(region, existing), name=request.name)
        image_id, root_device = resources.image(
            ec2, region, ami_id=self._ami_id, ami_name=self._ami_name, ami_owner=self._ami_owner
        )
        group = resources.security_group(ec2, region, self._cidr, self._ssh_port)
        resources.import_key(ec2, region, request)
        own_tags = tags(request.name, request.job_id, request.attempt)
        params: dict[str, Any] = {
            "ImageId": image_id,
            "InstanceType": type_name,
            "MinCount": 1,
            "MaxCount": 1,
            "KeyName": request.name,
            "SecurityGroupIds": [group],
            "ClientToken": client_token(request.name, offer.offer_id, request.capacity),
            "BlockDeviceMappings": [
                {
                    "DeviceName": root_device,
                    "Ebs": {
                        "VolumeSize": self._disk_gb,
                        "VolumeType": "gp3",
                        "DeleteOnTermination": True,
                    },
                }
            ],
            "TagSpecifications": [
                {"ResourceType": "instance", "Tags": own_tags},
                {"ResourceType": "volume", "Tags": own_tags},
            ],
            "InstanceInitiatedShutdownBehavior": "terminate",
            "UserData": resources.deadline_script(request.max_runtime_seconds),
            "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled"},
        }
        if spot:
            params["InstanceMarketOptions"] = {
                "MarketType": "spot",
                "SpotOptions": {
                    "SpotInstanceType": "one-time",
                    "InstanceInterruptionBehavior": "terminate",
                    # Never above the on-demand price; EC2 bills the current spot price.
                    "MaxPrice": f"{offer.price_per_hour:.4f}",
                },
            }
        market = "spot" if spot else "on-demand"
        try:
            answer = ec2.run_instances(**params)
        except Exception as exc:
            error = translate(
                exc, action=f"RunInstances {market} {type_name} in {region}", launching=True
            )
            if not error.retryable or isinstance(error, NoCapacity):
                # Refused: no machine uses the key (a later try imports it again).
                with contextlib.suppress(ProviderError):
                    client.call(ec2, "delete_key_pair", region, KeyName=request.name)
            raise error from exc
        instances = answer.get("Instances") if isinstance(answer, dict) else None
        if not instances or not instances[0].get("InstanceId"):
            # An answer we cannot read may still have started a machine; the token finds it.
            raise TransientProviderError(
                f"aws RunInstances {type_name} in {region} answered without an instance id",
                provider=TARGET,
                maybe_applied=True,
            )
        return Handle(
            instance_id=handle_id(region, str(instances[0]["InstanceId"])), name=request.name
        )

    # --- poll -----------------------------------------------------------------------------

    def poll(self, handles: Sequence[Handle]) -> dict[str, RemoteState]:
        states: dict[str, RemoteState] = {}
        by_region: dict[str, list[Handle]] = defaultdict(list)
        for handle in handles:
            region, _ = split_handle(handle.instance_id)
            if not region:
                states[handle.instance_id] = RemoteState(
                    RemoteStatus.LOST, f"{handle.instance_id!r} names no EC2 region/instance"
                )
                continue
            by_region[region].append(handle)
        for region, group in by_region.items():
            try:
                listed = {
                    str(i["InstanceId"]): i
                    for i in client.instances(self._ec2(region), region, [MANAGED_FILTER])
                }
            except (TransientProviderError, RateLimited) as exc:
                log.info("aws: %s left unknown this cycle: %s", region, exc)
                continue
            for handle in group:
                instance = listed.get(split_handle(handle.instance_id)[1])
                if instance is None:
                    continue  # not listed yet (eventual consistency), or long gone: the lease decides
                states[handle.instance_id] = instance_state(
                    instance,
                    ssh_user=self._ssh_user,
                    ssh_port=self._ssh_port,
                    price_per_hour=self._billed_rate(region, instance),
                )
        return states

    def _billed_rate(self, region: str, instance: Mapping[str, Any]) -> float | None:
        """The on-demand rate from the price table; None for spot (its price moves)."""
        if instance.get("InstanceLifecycle") == "spot":
            return None
        return on_demand_price(str(instance.get("InstanceType") or ""), region, self._prices)

    # --- cancel ---------------------------------------------------------------------------

    def cancel(self, handle: Handle) -> None:
        region, instance_id = split_handle(handle.instance_id)
        if not region:
            return  # never an instance of ours: nothing bills
        ec2 = self._ec2(region)
        with contextlib.suppress(InstanceNotFound):  # terminated long ago: nothing bills
            client.call(ec2, "terminate_instances", region, InstanceIds=[instance_id])
        if handle.name.startswith(MACHINE_PREFIX):
            try:
                client.call(ec2, "delete_key_pair", region, KeyName=handle.name)
            except ProviderError as exc:  # best effort: the key alone costs nothing
                log.info("aws: key pair %s kept for now: %s", handle.name, exc)

    # --- list -----------------------------------------------------------------------------

    def list_instances(self) -> list[Handle]:
        out: list[Handle] = []
        live = {"Name": "instance-state-name", "Values": list(LIVE_STATES)}
        for region in self._regions:
            for instance in client.instances(self._ec2(region), region, [MANAGED_FILTER, live]):
                name = tag_value(instance, "Name")
                if name.startswith(MACHINE_PREFIX):
                    out.append(Handle(handle_id(region, str(instance["InstanceId"])), name))
        return out

    # --- boto3 ----------------------------------------------------------------------------

    def _ec2(self, region: str) -> Any:
        if region not in self._clients:
            if self._factory is not None:
                self._clients[region] = self._factory(region)
            else:
                if self._session is None:
                    self._session = client.session(self._credentials)
                self._clients[region] = client.boto_client(
                    self._session,
                    region,
                    endpoint_url=self._endpoint_url,
                    max_attempts=self._max_attempts,
                )
        return self._clients[region]


def from_settings(secrets: Mapping[str, str]) -> AwsEc2:
    from django.conf import settings

    key_id = secrets.get("access_key_id", "")
    secret = secrets.get("secret_access_key", "")
    if not (key_id and secret) and not (
        settings.TRAINHUB_AWS_USE_DEFAULT_CHAIN and secrets.get("api_key") == OPERATOR_CHAIN
    ):
        raise InvalidCredentials(
            "the 'aws' credential needs access_key_id and secret_access_key (the operator's "
            "own AWS identity is used only with TRAINHUB_AWS_USE_DEFAULT_CHAIN=1)",
            provider=TARGET,
        )
    return AwsEc2(
        access_key_id=key_id,
        secret_access_key=secret,
        session_token=secrets.get("session_token", ""),
        regions=settings.TRAINHUB_AWS_REGIONS,
        instance_types=settings.TRAINHUB_AWS_INSTANCE_TYPES,
        ssh_cidr=settings.TRAINHUB_AWS_SSH_CIDR,
        ami_id=settings.TRAINHUB_AWS_AMI_ID,
        ami_name=settings.TRAINHUB_AWS_AMI_NAME,
        ami_owner=settings.TRAINHUB_AWS_AMI_OWNER,
        disk_gb=settings.TRAINHUB_AWS_DISK_GB,
        ssh_user=settings.TRAINHUB_AWS_SSH_USER,
        ssh_port=settings.TRAINHUB_AWS_SSH_PORT,
        endpoint_url=settings.TRAINHUB_AWS_ENDPOINT_URL,
        price_overrides=settings.TRAINHUB_AWS_PRICES,
    )
