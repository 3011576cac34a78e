"""The AWS EC2 adapter against moto's EC2 over real HTTP (the session's moto server, the one
the S3 tests use): offers from its instance type catalogue, launches, tags, key pairs,
security groups, polls, cancels and the reconciler's list. What moto cannot produce (a spot
interruption, a quota or capacity refusal) is injected by a thin proxy around the real client
that answers that one call the way EC2 does."""

from __future__ import annotations

import dataclasses
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from providers import aws, registry
from providers.aws.api import TAG_ATTEMPT, TAG_JOB, TAG_MANAGED, split_handle
from providers.base import CapacityType, Handle, LaunchRequest, Offer, RemoteStatus
from providers.errors import (
    InvalidCredentials,
    NoCapacity,
    PermanentProviderError,
    QuotaExceeded,
)

# A real key: EC2 (and moto) check the OpenSSH format on ImportKeyPair.
PUBKEY = (
    Ed25519PrivateKey.generate()
    .public_key()
    .public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    .decode()
    + " trainhub-aws-test"
)
TYPES = ["g5.xlarge", "g6e.xlarge", "p4d.24xlarge", "p5.48xlarge", "m5.large", "g5.2xlarge"]


class Proxy:
    """The real moto client, with calls counted and recorded, and chosen calls answered
    another way (``answers[method]``: a callable given the real client's method and kwargs)."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.answers: dict[str, Callable[..., Any]] = {}

    def __getattr__(self, method: str) -> Callable[..., Any]:
        target = getattr(self.real, method)

        def call(**kwargs: Any) -> Any:
            self.calls.append((method, kwargs))
            if method in self.answers:
                return self.answers[method](target, **kwargs)
            return target(**kwargs)

        return call

    def count(self, method: str) -> int:
        return sum(1 for m, _ in self.calls if m == method)


def refuse(code: str, message: str = "refused", status: int = 400) -> Callable[..., Any]:
    def answer(_real: Any, **_kwargs: Any) -> Any:
        raise ClientError(
            {
                "Error": {"Code": code, "Message": message},
                "ResponseMetadata": {"HTTPStatusCode": status},
            },
            "RunInstances",
        )

    return answer


@dataclasses.dataclass
class Ec2:
    endpoint: str
    proxies: dict[str, Proxy]
    cidr: str

    def client(self, region: str) -> Any:
        return boto3.client("ec2", region_name=region, endpoint_url=self.endpoint)

    def proxy(self, region: str) -> Proxy:
        if region not in self.proxies:
            self.proxies[region] = Proxy(self.client(region))
        return self.proxies[region]

    def adapter(self, **overrides: Any) -> aws.AwsEc2:
        params: dict[str, Any] = {
            "regions": ["us-east-1", "us-west-2"],
            "instance_types": TYPES,
            "ssh_cidr": self.cidr,
            "ami_id": "",
            "ami_name": "*",
            "ami_owner": "amazon",
            "disk_gb": 123,
            "client_factory": self.proxy,
        }
        params.update(overrides)
        return aws.AwsEc2(**params)

    def ami(self, region: str) -> str:
        images = self.client(region).describe_images(Owners=["amazon"])["Images"]
        return str(images[0]["ImageId"])

    def instance(self, handle: Handle) -> dict[str, Any]:
        region, instance_id = split_handle(handle.instance_id)
        answer = self.client(region).describe_instances(InstanceIds=[instance_id])
        return dict(answer["Reservations"][0]["Instances"][0])


@pytest.fixture
def ec2(s3_endpoint: str) -> Iterator[Ec2]:
    # A CIDR of its own per test: its security group is created by this test's first launch.
    n = uuid.uuid4().int
    yield Ec2(s3_endpoint, {}, f"198.{n % 200}.{n // 200 % 250}.0/24")


def offer(instance_type: str = "g5.xlarge", region: str = "us-east-1", **extra: Any) -> Offer:
    fields: dict[str, Any] = {
        "target": "aws",
        "offer_id": f"{instance_type}@{region}",
        "gpu_name": "A10G",
        "gpu_count": 1,
        "vram_gb": 24.0,
        "price_per_hour": 1.006,
        "spot_price_per_hour": 0.4,
        "region": region,
    }
    fields.update(extra)
    return Offer(**fields)


def request(**extra: Any) -> LaunchRequest:
    job = f"ftjob-{uuid.uuid4().hex[:12]}"
    fields: dict[str, Any] = {
        "job_id": job,
        "attempt": 2,
        "name": f"trainhub-{job}-a2",
        "max_runtime_seconds": 3600,
        "gpu": {"count": 1},
        "ssh_public_key": PUBKEY,
        "offer": offer(),
    }
    fields.update(extra)
    return LaunchRequest(**fields)


def tag_dict(resource: dict[str, Any]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in resource.get("Tags") or []}


# --- offers -------------------------------------------------------------------------------------


def test_offers_carry_gpu_facts_prices_and_spot_prices_per_type_and_region(ec2: Ec2) -> None:
    offers = ec2.adapter().offers({})
    by_id = {o.offer_id: o for o in offers}
    # m5.large has no GPU; every GPU type of the list is offered in both regions.
    assert set(by_id) == {
        f"{t}@{r}" for t in TYPES if t != "m5.large" for r in ("us-east-1", "us-west-2")
    }
    g5 = by_id["g5.xlarge@us-east-1"]
    assert (g5.target, g5.gpu_name, g5.gpu_count, g5.vram_gb) == ("aws", "A10G", 1, 24.0)
    assert g5.details["gpu_memory_mib"] == 22888, "what EC2 reports is kept beside the GB as sold"
    assert g5.price_per_hour == aws.ON_DEMAND_USD_PER_HOUR["g5.xlarge"]
    assert g5.spot_price_per_hour == pytest.approx(0.00001), "moto's spot price history"
    assert g5.available and g5.region == "us-east-1"
    p5 = by_id["p5.48xlarge@us-west-2"]
    assert (p5.gpu_name, p5.gpu_count, p5.vram_gb) == ("H100", 8, 80.0)
    assert [o.price_per_hour for o in offers] == sorted(o.price_per_hour for o in offers)


def test_offers_filter_on_the_gpu_needs_and_mark_types_a_region_does_not_sell(ec2: Ec2) -> None:
    adapter = ec2.adapter(regions=["eu-west-3"])  # sells g5 at moto, not g6e, p4d or p5
    offers = adapter.offers({"count": 8, "min_vram_gb": 40})
    assert {o.offer_id: o.available for o in offers} == {
        "p4d.24xlarge@eu-west-3": False,
        "p5.48xlarge@eu-west-3": False,
    }
    assert all(o.spot_price_per_hour is None for o in offers), "no spot price where not sold"
    assert {o.offer_id for o in adapter.offers({"name": "L40S", "count": 1})} == {
        "g6e.xlarge@eu-west-3"
    }


def test_operator_price_overrides_win_and_unpriced_types_are_not_offered(ec2: Ec2) -> None:
    adapter = ec2.adapter(
        regions=["us-east-1"],
        instance_types=["g5.xlarge", "g4dn.xlarge"],  # g4dn has no price in the table
        price_overrides={"g5.xlarge": 2.0, "g5.xlarge@us-east-1": 1.5},
    )
    assert [(o.offer_id, o.price_per_hour) for o in adapter.offers({})] == [
        ("g5.xlarge@us-east-1", 1.5)
    ]


# --- launch -------------------------------------------------------------------------------------


def test_launch_tags_the_instance_and_uses_a_key_pair_and_an_ssh_only_group(ec2: Ec2) -> None:
    req = request()
    handle = ec2.adapter().launch(req)
    region, instance_id = split_handle(handle.instance_id)
    assert (region, handle.name) == ("us-east-1", req.name) and instance_id.startswith("i-")
    instance = ec2.instance(handle)
    assert instance["InstanceType"] == "g5.xlarge" and instance["KeyName"] == req.name
    assert instance["ClientToken"] == aws.client_token(
        req.name, "g5.xlarge@us-east-1", CapacityType.ON_DEMAND
    )
    assert tag_dict(instance) == {
        "Name": req.name,
        TAG_MANAGED: "true",
        TAG_JOB: req.job_id,
        TAG_ATTEMPT: "2",
    }
    client = ec2.client("us-east-1")
    (volume,) = client.describe_volumes(
        Filters=[{"Name": "attachment.instance-id", "Values": [instance_id]}]
    )["Volumes"]
    assert volume["Size"] == 123 and tag_dict(volume)[TAG_MANAGED] == "true"
    (key,) = client.describe_key_pairs(KeyNames=[req.name])["KeyPairs"]
    assert tag_dict(key)["Name"] == req.name
    (group_ref,) = instance["SecurityGroups"]
    (group,) = client.describe_security_groups(GroupIds=[group_ref["GroupId"]])["SecurityGroups"]
    assert [
        (p["IpProtocol"], p["FromPort"], p["ToPort"], [r["CidrIp"] for r in p["IpRanges"]])
        for p in group["IpPermissions"]
    ] == [("tcp", 22, 22, [ec2.cidr])]
    ((_, sent),) = [c for c in ec2.proxy("us-east-1").calls if c[0] == "run_instances"]
    assert sent["InstanceInitiatedShutdownBehavior"] == "terminate"
    assert "shutdown -h +120" in sent["UserData"], "max runtime (60 min) + 1 h"
    assert "InstanceMarketOptions" not in sent


def test_launching_the_same_attempt_twice_rents_one_instance(ec2: Ec2) -> None:
    req = request()
    adapter = ec2.adapter()
    first = adapter.launch(req)
    again = ec2.adapter().launch(req)  # a new process: nothing remembered but EC2's state
    assert again == first
    listed = ec2.client("us-east-1").describe_instances(
        Filters=[{"Name": "tag:Name", "Values": [req.name]}]
    )["Reservations"]
    assert sum(len(r["Instances"]) for r in listed) == 1
    # The security group of the CIDR is made once and then found.
    assert ec2.proxy("us-east-1").count("create_security_group") == 1


def test_the_client_token_is_stable_per_attempt_offer_and_capacity() -> None:
    token = aws.client_token("trainhub-ftjob-x-a2", "g5.xlarge@us-east-1", CapacityType.ON_DEMAND)
    assert token == aws.client_token(
        "trainhub-ftjob-x-a2", "g5.xlarge@us-east-1", CapacityType.ON_DEMAND
    )
    assert len(token) <= 64 and token.isascii()
    others = {
        aws.client_token("trainhub-ftjob-x-a3", "g5.xlarge@us-east-1", CapacityType.ON_DEMAND),
        aws.client_token("trainhub-ftjob-x-a2", "g6.xlarge@us-east-1", CapacityType.ON_DEMAND),
        aws.client_token("trainhub-ftjob-x-a2", "g5.xlarge@us-east-1", CapacityType.SPOT),
    }
    assert token not in others and len(others) == 3


def test_a_spot_launch_asks_for_a_one_time_spot_instance_capped_at_on_demand(ec2: Ec2) -> None:
    req = request(capacity=CapacityType.SPOT)
    handle = ec2.adapter().launch(req)
    ((_, sent),) = [c for c in ec2.proxy("us-east-1").calls if c[0] == "run_instances"]
    assert sent["InstanceMarketOptions"] == {
        "MarketType": "spot",
        "SpotOptions": {
            "SpotInstanceType": "one-time",
            "InstanceInterruptionBehavior": "terminate",
            "MaxPrice": "1.0060",
        },
    }
    assert ec2.instance(handle)["InstanceLifecycle"] == "spot"


def test_spot_needs_an_offer_with_a_spot_price(ec2: Ec2) -> None:
    req = request(capacity=CapacityType.SPOT, offer=offer(spot_price_per_hour=None))
    with pytest.raises(PermanentProviderError, match="no spot price"):
        ec2.adapter().launch(req)
    assert ec2.proxy("us-east-1").calls == []


@pytest.mark.parametrize(
    "bad",
    [None, offer(target="lambda"), offer(offer_id="g5.xlarge")],
    ids=["no-offer", "other-target", "no-region"],
)
def test_launch_refuses_a_request_without_an_aws_offer(ec2: Ec2, bad: Offer | None) -> None:
    with pytest.raises(PermanentProviderError, match="AWS offer"):
        ec2.adapter().launch(request(offer=bad))


def test_an_ami_name_that_matches_nothing_says_which_setting_to_change(ec2: Ec2) -> None:
    adapter = ec2.adapter(ami_name=aws.DEFAULT_AMI_NAME)  # moto has no Deep Learning AMI
    with pytest.raises(PermanentProviderError, match="TRAINHUB_AWS_AMI_ID"):
        adapter.launch(request())


def test_an_ami_id_per_region_is_used(ec2: Ec2) -> None:
    ami = ec2.ami("us-west-2")
    adapter = ec2.adapter(ami_id=f"us-east-1=ami-00000000,us-west-2={ami}")
    handle = adapter.launch(request(offer=offer(region="us-west-2")))
    assert ec2.instance(handle)["ImageId"] == ami


# --- refusals: capacity is another offer, quota is the operator's -------------------------------


@pytest.mark.parametrize(
    "code",
    [
        "InsufficientInstanceCapacity",
        "SpotMaxPriceTooLow",
        "MaxSpotInstanceCountExceeded",
        "Unsupported",
    ],
)
def test_capacity_refusals_are_no_capacity_and_leave_no_key(ec2: Ec2, code: str) -> None:
    req = request()
    ec2.proxy("us-east-1").answers["run_instances"] = refuse(
        code, "We currently do not have sufficient capacity"
    )
    with pytest.raises(NoCapacity) as info:
        ec2.adapter().launch(req)
    assert info.value.code == code and "g5.xlarge in us-east-1" in info.value.message
    keys = ec2.client("us-east-1").describe_key_pairs(
        Filters=[{"Name": "key-name", "Values": [req.name]}]
    )["KeyPairs"]
    assert keys == []


@pytest.mark.parametrize("code", ["VcpuLimitExceeded", "InstanceLimitExceeded"])
def test_quota_refusals_are_quota_exceeded_not_no_capacity(ec2: Ec2, code: str) -> None:
    ec2.proxy("us-east-1").answers["run_instances"] = refuse(
        code, "You have requested more vCPU capacity than your current vCPU limit of 0 allows"
    )
    with pytest.raises(QuotaExceeded) as info:
        ec2.adapter().launch(request())
    assert not isinstance(info.value, NoCapacity) and not info.value.retryable
    assert "quota" in info.value.message and "Service Quotas" in info.value.message


def test_a_missing_iam_permission_is_invalid_credentials_with_a_hint(ec2: Ec2) -> None:
    ec2.proxy("us-east-1").answers["run_instances"] = refuse(
        "UnauthorizedOperation", "You are not authorized to perform this operation.", 403
    )
    with pytest.raises(InvalidCredentials, match="IAM policy"):
        ec2.adapter().launch(request())


# --- poll ---------------------------------------------------------------------------------------


def test_one_describe_instances_per_region_answers_every_handle(ec2: Ec2) -> None:
    adapter = ec2.adapter()
    east = [adapter.launch(request()) for _ in range(2)]
    west = adapter.launch(request(offer=offer(region="us-west-2")))
    for proxy in ec2.proxies.values():
        proxy.calls.clear()
    unknown = Handle("us-east-1/i-0123456789abcdef0", "trainhub-ftjob-gone-a1")
    states = adapter.poll([*east, west, unknown, Handle("not-ours", "")])
    assert Counter(m for p in ec2.proxies.values() for m, _ in p.calls) == {"describe_instances": 2}
    for region in ("us-east-1", "us-west-2"):
        ((_, sent),) = ec2.proxy(region).calls
        assert {"Name": f"tag:{TAG_MANAGED}", "Values": ["true"]} in sent["Filters"]
    for handle in [*east, west]:
        state = states[handle.instance_id]
        assert state.status in (RemoteStatus.PENDING, RemoteStatus.RUNNING)
        if state.status is RemoteStatus.RUNNING:
            assert state.ssh is not None and state.ssh.username == "ubuntu" and state.ssh.port == 22
            assert state.price_per_hour == aws.ON_DEMAND_USD_PER_HOUR["g5.xlarge"]
    assert unknown.instance_id not in states, "not listed: unknown this cycle, the lease decides"
    assert states["not-ours"].status is RemoteStatus.LOST


def test_a_spot_interruption_is_reported_as_preempted(ec2: Ec2) -> None:
    adapter = ec2.adapter()
    handle = adapter.launch(request(capacity=CapacityType.SPOT))
    region, instance_id = split_handle(handle.instance_id)
    ec2.client(region).terminate_instances(InstanceIds=[instance_id])

    def interrupted(real: Any, **kwargs: Any) -> Any:
        answer = real(**kwargs)
        for reservation in answer["Reservations"]:
            for instance in reservation["Instances"]:
                if instance["InstanceId"] == instance_id:  # as EC2 shows a reclaimed one
                    instance["StateReason"] = {
                        "Code": "Server.SpotInstanceTermination",
                        "Message": "Server.SpotInstanceTermination: Spot instance termination",
                    }
        return answer

    ec2.proxy(region).answers["describe_instances"] = interrupted
    state = adapter.poll([handle])[handle.instance_id]
    assert (state.status, state.error_code) == (RemoteStatus.FAILED, "preempted")


def test_an_instance_terminated_by_someone_else_is_lost(ec2: Ec2) -> None:
    adapter = ec2.adapter()
    handle = adapter.launch(request())
    region, instance_id = split_handle(handle.instance_id)
    ec2.client(region).terminate_instances(InstanceIds=[instance_id])
    state = adapter.poll([handle])[handle.instance_id]
    assert state.status is RemoteStatus.LOST and state.error_code == ""


@pytest.mark.parametrize(
    ("raw", "spot", "reason", "status", "code"),
    [
        ("pending", False, "", RemoteStatus.PENDING, ""),
        ("running", False, "", RemoteStatus.RUNNING, ""),
        ("shutting-down", True, "Server.SpotInstanceTermination", RemoteStatus.FAILED, "preempted"),
        ("stopped", True, "Server.SpotInstanceShutdown", RemoteStatus.FAILED, "preempted"),
        ("terminated", True, "Client.UserInitiatedShutdown", RemoteStatus.LOST, ""),
        ("terminated", False, "Server.SpotInstanceTermination", RemoteStatus.LOST, ""),
        ("stopping", False, "Client.UserInitiatedShutdown", RemoteStatus.LOST, ""),
    ],
)
def test_instance_states(
    raw: str, spot: bool, reason: str, status: RemoteStatus, code: str
) -> None:
    instance: dict[str, Any] = {
        "InstanceId": "i-1",
        "State": {"Name": raw},
        "PublicIpAddress": "203.0.113.7",
    }
    if spot:
        instance["InstanceLifecycle"] = "spot"
    if reason:
        instance["StateReason"] = {"Code": reason, "Message": reason}
    state = aws.instance_state(instance, ssh_user="ubuntu")
    assert (state.status, state.error_code) == (status, code)
    assert set(aws.STATUS_MAP) == {
        "pending",
        "running",
        "shutting-down",
        "terminated",
        "stopping",
        "stopped",
    }


def test_running_without_a_public_ip_is_still_pending() -> None:
    state = aws.instance_state({"State": {"Name": "running"}}, ssh_user="ubuntu")
    assert state.status is RemoteStatus.PENDING and state.ssh is None


# --- cancel and the reconciler's list -----------------------------------------------------------


def test_cancel_terminates_deletes_the_key_and_is_idempotent(ec2: Ec2) -> None:
    adapter = ec2.adapter()
    req = request()
    handle = adapter.launch(req)
    adapter.cancel(handle)
    assert ec2.instance(handle)["State"]["Name"] in ("shutting-down", "terminated")
    client = ec2.client("us-east-1")
    assert (
        client.describe_key_pairs(Filters=[{"Name": "key-name", "Values": [req.name]}])["KeyPairs"]
        == []
    )
    adapter.cancel(handle)  # again: harmless
    assert adapter.poll([handle])[handle.instance_id].status is RemoteStatus.LOST


def test_cancel_of_an_instance_ec2_does_not_know_is_success(ec2: Ec2) -> None:
    adapter = ec2.adapter()
    assert adapter.cancel(Handle("us-east-1/i-0123456789abcdef0", "trainhub-ftjob-gone-a1")) is None
    assert adapter.cancel(Handle("garbage", "")) is None
    assert ec2.proxy("us-east-1").count("terminate_instances") == 1


def test_list_instances_names_our_live_tagged_machines_in_every_region(ec2: Ec2) -> None:
    adapter = ec2.adapter()
    east = adapter.launch(request())
    west = adapter.launch(request(offer=offer(region="us-west-2")))
    ended = adapter.launch(request())
    adapter.cancel(ended)
    client = ec2.client("us-east-1")
    stranger = client.run_instances(
        ImageId=ec2.ami("us-east-1"), InstanceType="t3.micro", MinCount=1, MaxCount=1
    )
    listed = adapter.list_instances()
    ids = {h.instance_id for h in listed}
    assert {east.instance_id, west.instance_id} <= ids
    assert ended.instance_id not in ids
    assert f"us-east-1/{stranger['Instances'][0]['InstanceId']}" not in ids, "untagged: not ours"
    assert all(h.name.startswith("trainhub-") for h in listed)
    assert next(h for h in listed if h.instance_id == east.instance_id).name == east.name


# --- credentials and the registry ---------------------------------------------------------------


def test_the_aws_target_is_a_priced_ssh_machine_with_a_key_pair_credential(settings: Any) -> None:
    target = registry.get("aws")
    assert target is not None and target.drives_ssh and target.has_offers
    assert target.credential_kind == "aws"
    assert registry.CREDENTIAL_KINDS["aws"] == ("access_key_id", "secret_access_key")
    settings.TRAINHUB_AWS_SSH_CIDR = ""
    assert "TRAINHUB_AWS_SSH_CIDR" in target.misconfiguration()
    settings.TRAINHUB_AWS_SSH_CIDR = "203.0.113.0/24"
    assert target.misconfiguration() == ""


def test_from_settings_uses_the_project_key_else_the_chain_only_when_allowed(settings: Any) -> None:
    settings.TRAINHUB_AWS_SSH_CIDR = "203.0.113.0/24"
    adapter = aws.from_settings({"access_key_id": "AKIDPROJECT", "secret_access_key": "s3cret"})
    assert isinstance(adapter, aws.AwsEc2)
    settings.TRAINHUB_AWS_USE_DEFAULT_CHAIN = False
    with pytest.raises(InvalidCredentials, match="TRAINHUB_AWS_USE_DEFAULT_CHAIN"):
        aws.from_settings({"api_key": aws.OPERATOR_CHAIN})
    settings.TRAINHUB_AWS_USE_DEFAULT_CHAIN = True
    assert isinstance(aws.from_settings({"api_key": aws.OPERATOR_CHAIN}), aws.AwsEc2)
    with pytest.raises(InvalidCredentials):
        aws.from_settings({"api_key": "some-AWS_API_KEY-value"})


def test_a_region_that_fails_is_left_out_of_the_offers_while_another_answers(ec2: Ec2) -> None:
    ec2.proxy("us-west-2").answers["describe_instance_types"] = refuse(
        "OptInRequired", "You are not subscribed to this service.", 401
    )
    offers = ec2.adapter().offers({})
    assert offers and {o.region for o in offers} == {"us-east-1"}
    ec2.proxy("us-east-1").answers["describe_instance_types"] = refuse(
        "AuthFailure", "AWS was not able to validate the provided access credentials", 401
    )
    with pytest.raises(InvalidCredentials):
        ec2.adapter().offers({})


def test_a_cidr_setting_that_is_no_cidr_is_a_permanent_error_naming_it(ec2: Ec2) -> None:
    with pytest.raises(PermanentProviderError, match="TRAINHUB_AWS_SSH_CIDR"):
        ec2.adapter(ssh_cidr="the office").launch(request())
