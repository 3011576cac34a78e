"""The Lambda Cloud adapter against ``responses`` answers shaped like Lambda's documented ones:
``{"data": ...}`` envelopes, ``{"error": {"code", "message", "suggestion"}}`` errors mapped by
code, ``GET /instance-types`` keyed by type name with the regions that have capacity, and 429
with ``Retry-After``."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import responses

from providers import lambda_cloud
from providers.base import Handle, LaunchRequest, Offer, RemoteState, RemoteStatus, SshAddress
from providers.errors import (
    InstanceNotFound,
    InvalidCredentials,
    NoCapacity,
    PermanentProviderError,
    ProviderError,
    QuotaExceeded,
    RateLimited,
    TransientProviderError,
)
from providers.http import ProviderHTTP
from providers.lambda_cloud import LambdaCloud, key_name, parse_gpu, translate
from providers.ratelimit import account_tag
from tests.providers import lambda_payloads as lp
from tests.providers.contract import Sleeps
from tests.providers.lambda_payloads import (
    A10,
    A100,
    A100_X8,
    B200_X2,
    BASE,
    CPU,
    GH200,
    H100,
    instance,
    instance_types,
    ssh_key,
)
from tests.providers.runpod_payloads import HTML_502

KEY = "secret_lambda-key_5c1e9a0b7d2f4e63"
NAME = "trainhub-ftjob-x-a2"
PUBKEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJx1trainhubattempt2 trainhub-ftjob-x-a2"
# Named from the key blob's hash, computed here independently of the adapter.
OUR_KEY = "trainhub-" + hashlib.sha256(PUBKEY.split()[1].encode()).hexdigest()[:16]
OFFER = Offer(
    target="lambda",
    offer_id="gpu_1x_h100_sxm5@us-west-1",
    gpu_name="H100 SXM5",
    gpu_count=1,
    vram_gb=80.0,
    price_per_hour=3.29,
    region="us-west-1",
)


def adapter(
    sleep: Callable[[float], None] = lambda s: None,
    instance_types: Sequence[str] = (),
    regions: Sequence[str] = (),
) -> LambdaCloud:
    return LambdaCloud(
        api_key=KEY,
        http=ProviderHTTP(provider="lambda", base_url=BASE, sleep=sleep),
        instance_types=instance_types,
        regions=regions,
    )


def request(offer: Offer | None = OFFER) -> LaunchRequest:
    return LaunchRequest(
        job_id="ftjob-x",
        attempt=2,
        name=NAME,
        max_runtime_seconds=3600,
        gpu={"count": 1, "min_vram_gb": 80},
        ssh_public_key=PUBKEY,
        offer=offer,
    )


def vm(instance_id: str, status: str, name: str | None = NAME, **kw: Any) -> dict[str, Any]:
    return instance(instance_id, status, name=name, key_names=kw.pop("keys", (OUR_KEY,)), **kw)


def raised(error: type[ProviderError], call: Callable[[], object]) -> ProviderError:
    """Run ``call``, expect ``error``, and check the key stayed out of what it says."""
    with pytest.raises(error) as info:
        call()
    assert KEY not in f"{info.value} {info.value!r} {info.value.message}"
    return info.value


def calls() -> list[tuple[str, str]]:
    return [(str(c.request.method), str(c.request.url).removeprefix(BASE)) for c in responses.calls]


def body(method: str, path: str) -> Any:
    (call,) = [
        c for c in responses.calls if (c.request.method, c.request.url) == (method, BASE + path)
    ]
    sent = call.request.body
    assert isinstance(sent, bytes | str)
    return json.loads(sent)


def listed(*instances: dict[str, Any]) -> None:
    responses.get(f"{BASE}/instances", json={"data": list(instances)})


def keys(*entries: dict[str, Any]) -> None:
    responses.get(f"{BASE}/ssh-keys", json={"data": list(entries)})


# --- offers -------------------------------------------------------------------------------------

CATALOG = instance_types(
    (A10, ["us-east-1", "us-west-1"]),
    (A100, ["us-east-1"]),
    (A100_X8, ["us-south-1"]),
    (H100, []),
    (GH200, ["us-south-1"]),
    (B200_X2, ["europe-central-1"]),
    (CPU, ["us-east-1"]),
)


@responses.activate
def test_offers_one_per_type_and_region_with_capacity_unavailable_types_once_cheapest_first() -> (
    None
):
    responses.get(f"{BASE}/instance-types", json=CATALOG)
    offers = adapter().offers({})
    assert [(o.offer_id, o.available, o.price_per_hour) for o in offers] == [
        ("gpu_1x_a10@us-east-1", True, 0.75),
        ("gpu_1x_a10@us-west-1", True, 0.75),
        ("gpu_1x_a100_sxm4@us-east-1", True, 1.29),
        ("gpu_1x_gh200@us-south-1", True, 1.49),
        ("gpu_1x_h100_sxm5", False, 3.29),  # no region has capacity: listed once, no region
        ("gpu_2x_b200_sxm6@europe-central-1", True, 9.98),
        ("gpu_8x_a100_80gb_sxm4@us-south-1", True, 14.32),
    ], "the CPU-only type is never offered"
    assert offers[2] == Offer(
        target="lambda",
        offer_id="gpu_1x_a100_sxm4@us-east-1",
        gpu_name="A100 SXM4",
        gpu_count=1,
        vram_gb=40.0,
        price_per_hour=1.29,
        spot_price_per_hour=None,
        available=True,
        region="us-east-1",
        details={
            "instance_type": "gpu_1x_a100_sxm4",
            "description": "1x A100 (40 GB SXM4)",
            "vcpus": 30,
            "memory_gib": 200,
            "storage_gib": 512,
        },
    )
    assert offers[4].region == "" and offers[6].gpu_count == 8
    (call,) = responses.calls
    assert call.request.headers["Authorization"] == f"Bearer {KEY}"


@pytest.mark.parametrize(
    ("descriptions", "parsed"),
    [
        (("A100 (40 GB SXM4)",), ("A100 SXM4", 40.0)),
        (("H100 (80 GB SXM5)",), ("H100 SXM5", 80.0)),
        (("GH200 (96 GB)",), ("GH200", 96.0)),
        (("B200 (180 GB SXM6)",), ("B200 SXM6", 180.0)),
        (("A10 (24 GB PCIe)",), ("A10 PCIe", 24.0)),
        (("RTX 6000 Ada (48 GB)",), ("RTX 6000 Ada", 48.0)),
        (("Tesla V100 (16 GB)",), ("Tesla V100", 16.0)),
        (("A100", "8x A100 (40 GB SXM4)"), ("A100 SXM4", 40.0)),  # older answers: no memory
        (("A100", "8x A100"), ("A100", 0.0)),
        (("", "1x A6000"), ("A6000", 0.0)),
    ],
)
def test_parse_gpu_reads_name_memory_and_form_factor(
    descriptions: tuple[str, ...], parsed: tuple[str, float]
) -> None:
    assert parse_gpu(*descriptions) == parsed


@responses.activate
def test_offers_follow_the_instance_type_and_region_allow_lists() -> None:
    responses.get(f"{BASE}/instance-types", json=CATALOG)
    offers = adapter(instance_types=["gpu_1x_*", "gpu_2x_*"], regions=["us-*"]).offers({})
    assert [(o.offer_id, o.available) for o in offers] == [
        ("gpu_1x_a10@us-east-1", True),
        ("gpu_1x_a10@us-west-1", True),
        ("gpu_1x_a100_sxm4@us-east-1", True),
        ("gpu_1x_gh200@us-south-1", True),
        ("gpu_1x_h100_sxm5", False),
        ("gpu_2x_b200_sxm6", False),  # capacity only in a region not allowed
    ]
    responses.get(f"{BASE}/instance-types", json=CATALOG)
    offers = adapter(regions=["us-east-1"]).offers({})
    assert {o.region for o in offers if o.available} == {"us-east-1"}


@pytest.mark.parametrize(
    ("gpu", "types"),
    [
        ({"count": 2}, ["gpu_2x_b200_sxm6", "gpu_8x_a100_80gb_sxm4"]),  # more GPUs fit too
        ({"count": 8}, ["gpu_8x_a100_80gb_sxm4"]),
        ({"count": 9}, []),
        (
            {"count": 1, "min_vram_gb": 80},
            ["gpu_1x_gh200", "gpu_1x_h100_sxm5", "gpu_2x_b200_sxm6", "gpu_8x_a100_80gb_sxm4"],
        ),
        ({"count": 1, "min_vram_gb": 96}, ["gpu_1x_gh200", "gpu_2x_b200_sxm6"]),
        ({"count": 1, "name": "*h100*"}, ["gpu_1x_h100_sxm5"]),  # case-insensitive
        ({"count": 1, "name": "A100*"}, ["gpu_1x_a100_sxm4", "gpu_8x_a100_80gb_sxm4"]),
        ({"count": 1, "name": "*PCIe"}, ["gpu_1x_a10"]),
        (
            {"count": 1, "name": "*SXM*", "min_vram_gb": 41},
            ["gpu_1x_h100_sxm5", "gpu_2x_b200_sxm6", "gpu_8x_a100_80gb_sxm4"],
        ),
    ],
)
@responses.activate
def test_offers_coarse_filter_by_the_jobs_gpu_needs(gpu: dict[str, Any], types: list[str]) -> None:
    responses.get(f"{BASE}/instance-types", json=CATALOG)
    offers = adapter().offers(gpu)
    assert sorted({str(o.details["instance_type"]) for o in offers}) == types


@pytest.mark.parametrize(("cents", "price"), [(75, 0.75), ("75", 0.75), (None, None)])
@responses.activate
def test_offers_read_the_price_as_int_or_string_and_skip_a_type_without_one(
    cents: object, price: float | None
) -> None:
    # The schema says integer; its own example quotes the cents as a string.
    responses.get(
        f"{BASE}/instance-types",
        json=instance_types(({**A10, "price_cents_per_hour": cents}, ["us-east-1"])),
    )
    assert [o.price_per_hour for o in adapter().offers({})] == ([price] if price else [])


@responses.activate
def test_offers_with_a_bad_key_are_invalid_credentials() -> None:
    responses.get(f"{BASE}/instance-types", status=401, json=lp.INVALID_KEY)
    error = raised(InvalidCredentials, lambda: adapter().offers({}))
    assert error.code == "global/invalid-api-key" and "invalid, expired" in error.message


@responses.activate
def test_offers_answer_without_data_is_transient() -> None:
    responses.get(f"{BASE}/instance-types", json={"instance_types": []})
    raised(TransientProviderError, lambda: adapter().offers({}))


# --- launch -------------------------------------------------------------------------------------


@pytest.mark.parametrize("status", ["booting", "active", "unhealthy", "terminating"])
@responses.activate
def test_an_instance_of_this_attempt_that_exists_is_reused_without_another_call(
    status: str,
) -> None:
    listed(vm("other1", "active", name="my-notebook"), vm("i-made", status))
    assert adapter().launch(request()) == Handle(instance_id="i-made", name=NAME)
    assert calls() == [("GET", "/instances")], "no key registered, no second machine"


@responses.activate
def test_a_launch_registers_the_missing_key_by_hash_and_sends_exactly_lambdas_body() -> None:
    listed(vm("old1", "terminated"), vm("nb1", "active", name="my-notebook", keys=("mac",)))
    keys(ssh_key("k-mac", "mac", "ssh-ed25519 AAAAC3mac user@mac"))
    responses.post(f"{BASE}/ssh-keys", json={"data": ssh_key("k-new", OUR_KEY, PUBKEY)})
    responses.post(f"{BASE}/instance-operations/launch", json={"data": {"instance_ids": ["i-new"]}})
    handle = adapter().launch(request())
    assert handle == Handle(instance_id="i-new", name=NAME)
    assert calls() == [
        ("GET", "/instances"),
        ("GET", "/ssh-keys"),
        ("POST", "/ssh-keys"),
        ("POST", "/instance-operations/launch"),
    ], "nothing after the launch: the caller stores the id first"
    assert body("POST", "/ssh-keys") == {"name": OUR_KEY, "public_key": PUBKEY}
    assert body("POST", "/instance-operations/launch") == {
        "region_name": "us-west-1",
        "instance_type_name": "gpu_1x_h100_sxm5",
        "ssh_key_names": [OUR_KEY],
        "quantity": 1,
        "name": NAME,
    }
    assert all(c.request.headers["Authorization"] == f"Bearer {KEY}" for c in responses.calls)


@responses.activate
def test_a_key_registered_already_is_not_posted_again() -> None:
    listed()
    keys(ssh_key("k-ours", OUR_KEY, PUBKEY))
    responses.post(f"{BASE}/instance-operations/launch", json={"data": {"instance_ids": ["i-1"]}})
    assert adapter().launch(request()).instance_id == "i-1"
    assert calls() == [
        ("GET", "/instances"),
        ("GET", "/ssh-keys"),
        ("POST", "/instance-operations/launch"),
    ]


def test_the_key_name_depends_on_the_key_not_its_comment() -> None:
    assert key_name(PUBKEY) == OUR_KEY
    assert key_name(PUBKEY.replace("trainhub-ftjob-x-a2", "another comment")) == OUR_KEY
    assert key_name("ssh-ed25519 AAAAC3other trainhub-ftjob-x-a2") != OUR_KEY
    assert len(OUR_KEY) <= 64  # Lambda's limit on key names


def _ready_to_launch() -> None:
    listed()
    keys(ssh_key("k-ours", OUR_KEY, PUBKEY))


class Buckets(list[str]):
    """A limiter that books nothing and records which bucket each call was booked in."""

    def acquire(self, bucket: str) -> None:
        self.append(bucket)


@responses.activate
def test_only_the_launch_call_is_booked_in_the_launch_bucket() -> None:
    _ready_to_launch()
    responses.post(f"{BASE}/instance-operations/launch", json={"data": {"instance_ids": ["i-1"]}})
    buckets = Buckets()
    http = ProviderHTTP(provider="lambda", base_url=BASE, limiter=buckets, sleep=lambda s: None)
    LambdaCloud(api_key=KEY, http=http).launch(request())
    assert buckets == ["default", "default", "launch"]


@responses.activate
def test_insufficient_capacity_is_no_capacity() -> None:
    _ready_to_launch()
    responses.post(f"{BASE}/instance-operations/launch", status=400, json=lp.NO_CAPACITY)
    error = raised(NoCapacity, lambda: adapter().launch(request()))
    assert error.code == "instance-operations/launch/insufficient-capacity"
    assert "Not enough capacity" in error.message and error.retryable
    assert calls()[-1] == ("POST", "/instance-operations/launch") and len(calls()) == 3


@responses.activate
def test_the_accounts_quota_is_its_own_permanent_error_not_no_capacity() -> None:
    """Another offer on the same account gets the same refusal (and costs a 12.5 s launch
    slot each): a launch must stop here, not try the next offer as it does on NoCapacity."""
    _ready_to_launch()
    responses.post(f"{BASE}/instance-operations/launch", status=400, json=lp.QUOTA)
    error = raised(QuotaExceeded, lambda: adapter().launch(request()))
    assert "account's quota" in error.message and error.code == "global/quota-exceeded"
    assert isinstance(error, PermanentProviderError) and not isinstance(error, NoCapacity)
    assert not error.retryable


@pytest.mark.parametrize("body", [lp.INVALID_KEY, lp.error("global/account-inactive", "Inactive")])
@responses.activate
def test_a_bad_or_inactive_account_is_invalid_credentials_before_anything_is_launched(
    body: dict[str, Any],
) -> None:
    responses.get(f"{BASE}/instances", status=403, json=body)
    raised(InvalidCredentials, lambda: adapter().launch(request()))
    assert calls() == [("GET", "/instances")]


@responses.activate
def test_an_inactive_account_is_invalid_credentials_whatever_the_status() -> None:
    _ready_to_launch()
    responses.post(
        f"{BASE}/instance-operations/launch",
        status=400,
        json=lp.error("global/account-inactive", "Your account is inactive."),
    )
    error = raised(InvalidCredentials, lambda: adapter().launch(request()))
    assert error.status == 400 and "inactive" in error.message


@responses.activate
def test_a_429_on_launch_is_waited_out_for_its_retry_after(sleeps: Sleeps) -> None:
    _ready_to_launch()
    responses.post(
        f"{BASE}/instance-operations/launch",
        status=429,
        headers={"Retry-After": "12"},
        json=lp.error("global/unknown", "Too many requests"),
    )
    responses.post(f"{BASE}/instance-operations/launch", json={"data": {"instance_ids": ["i-2"]}})
    assert adapter(sleep=sleeps).launch(request()).instance_id == "i-2"
    assert len(sleeps) == 1 and 12.0 <= sleeps[0] <= 13.3
    assert calls()[-2:] == [("POST", "/instance-operations/launch")] * 2


@responses.activate
def test_a_5xx_to_the_launch_is_maybe_applied_and_the_retry_finds_the_instance() -> None:
    _ready_to_launch()
    responses.post(f"{BASE}/instance-operations/launch", status=503, json=lp.UPSTREAM)
    error = raised(TransientProviderError, lambda: adapter().launch(request()))
    assert isinstance(error, TransientProviderError) and error.maybe_applied
    assert error.code == "provider/internal-unavailable"
    responses.replace(responses.GET, f"{BASE}/instances", json={"data": [vm("i-made", "booting")]})
    assert adapter().launch(request()) == Handle(instance_id="i-made", name=NAME)
    launches = [c for c in calls() if c[1] == "/instance-operations/launch"]
    assert len(launches) == 1, "no second machine"


@responses.activate
def test_an_upstream_refusal_is_transient_and_not_applied() -> None:
    _ready_to_launch()
    responses.post(f"{BASE}/instance-operations/launch", status=400, json=lp.UPSTREAM)
    error = raised(TransientProviderError, lambda: adapter().launch(request()))
    assert isinstance(error, TransientProviderError) and not error.maybe_applied


@responses.activate
def test_a_refused_launch_whose_key_was_deleted_meanwhile_is_transient() -> None:
    # A concurrent cancel's clean-up saw the fresh key unused and deleted it.
    listed()
    keys()  # before: missing, so registered
    responses.post(f"{BASE}/ssh-keys", json={"data": ssh_key("k-ours", OUR_KEY, PUBKEY)})
    invalid = lp.error("global/invalid-parameters", "Invalid SSH key name")
    responses.post(f"{BASE}/instance-operations/launch", status=400, json=invalid)
    keys()  # after: gone
    error = raised(TransientProviderError, lambda: adapter().launch(request()))
    assert isinstance(error, TransientProviderError) and not error.maybe_applied
    assert "Invalid SSH key name" in error.message and OUR_KEY in error.message


@responses.activate
def test_a_refused_launch_whose_key_is_still_there_stays_permanent() -> None:
    _ready_to_launch()
    invalid = lp.error("global/invalid-parameters", "Requested too many instances")
    responses.post(f"{BASE}/instance-operations/launch", status=400, json=invalid)
    error = raised(PermanentProviderError, lambda: adapter().launch(request()))
    assert type(error) is PermanentProviderError and "too many instances" in error.message


@responses.activate
def test_no_instance_id_back_is_no_capacity() -> None:
    _ready_to_launch()
    responses.post(f"{BASE}/instance-operations/launch", json={"data": {"instance_ids": []}})
    raised(NoCapacity, lambda: adapter().launch(request()))


@responses.activate
def test_a_launch_answer_without_data_may_have_rented_a_machine() -> None:
    _ready_to_launch()
    responses.post(f"{BASE}/instance-operations/launch", json={"instance_ids": ["i-1"]})
    error = raised(TransientProviderError, lambda: adapter().launch(request()))
    assert isinstance(error, TransientProviderError) and error.maybe_applied


@pytest.mark.parametrize(
    "offer",
    [
        None,
        dataclasses.replace(OFFER, offer_id="gpu_1x_h100_sxm5", available=False, region=""),
        dataclasses.replace(OFFER, target="vastai", offer_id="12345"),
    ],
    ids=["none", "no-region", "other-target"],
)
@responses.activate
def test_a_launch_needs_an_available_lambda_offer(offer: Offer | None) -> None:
    error = raised(PermanentProviderError, lambda: adapter().launch(request(offer)))
    assert "offer" in error.message and "<instance type>@<region>" in error.message
    assert calls() == []


# --- poll ---------------------------------------------------------------------------------------

RUNNING = SshAddress("198.51.100.23", 22, "ubuntu")


@pytest.mark.parametrize(
    ("listing", "status", "ssh", "says"),
    [
        (vm("i1", "booting"), RemoteStatus.PENDING, None, "booting"),
        (vm("i1", "active"), RemoteStatus.RUNNING, RUNNING, "active"),
        ({**vm("i1", "active"), "ip": None}, RemoteStatus.PENDING, None, "no IP"),
        (vm("i1", "unhealthy"), RemoteStatus.PENDING, None, "unhealthy"),
        (vm("i1", "terminating"), RemoteStatus.LOST, None, "terminating"),
        (vm("i1", "terminated"), RemoteStatus.LOST, None, "terminated"),
        ({**vm("i1", "active"), "status": "migrating"}, RemoteStatus.PENDING, None, "migrating"),
    ],
    ids=["booting", "active", "active-no-ip", "unhealthy", "terminating", "terminated", "unknown"],
)
@responses.activate
def test_poll_maps_each_status(
    listing: dict[str, Any], status: RemoteStatus, ssh: SshAddress | None, says: str
) -> None:
    listed(listing)
    state = adapter().poll([Handle("i1", NAME)])["i1"]
    assert (state.status, state.ssh) == (status, ssh)
    assert says in state.message
    assert state.price_per_hour == 1.29, "the instance type's rate, on every state"


@responses.activate
def test_one_list_call_answers_for_every_listed_handle_and_unlisted_ones_are_asked_by_id(
    sleeps: Sleeps,
) -> None:
    listed(vm("i1", "active", itype=H100), vm("i2", "booting"), vm("nb", "active", name="nb"))
    responses.get(f"{BASE}/instances/gone", status=404, json=lp.NOT_FOUND)
    responses.get(f"{BASE}/instances/new", json={"data": vm("new", "booting")})
    responses.get(f"{BASE}/instances/flaky", status=503, json=lp.UPSTREAM)
    handles = [Handle(i, NAME) for i in ("i1", "i2", "gone", "new", "flaky")]
    states = adapter(sleep=sleeps).poll(handles)
    assert {k: s.status for k, s in states.items()} == {
        "i1": RemoteStatus.RUNNING,
        "i2": RemoteStatus.PENDING,
        "gone": RemoteStatus.LOST,
        "new": RemoteStatus.PENDING,  # too new for the list: Lambda knows it by id
    }, "flaky is left out: unknown this cycle"
    assert states["i1"].price_per_hour == 3.29
    assert [c for c in calls() if c[1] == "/instances"] == [("GET", "/instances")]
    assert ("GET", "/instances/i1") not in calls()


@responses.activate
def test_poll_of_no_handles_calls_nothing() -> None:
    assert adapter().poll([]) == {}
    assert calls() == []


@responses.activate
def test_a_list_without_data_is_an_error_not_every_attempt_lost() -> None:
    responses.get(f"{BASE}/instances", json={"instances": []})
    raised(TransientProviderError, lambda: adapter().poll([Handle("i1", NAME)]))


def test_the_state_of_a_non_object_is_pending() -> None:
    assert lambda_cloud.instance_state(None) == RemoteState(
        RemoteStatus.PENDING, "Lambda sent no instance object"
    )


# --- cancel -------------------------------------------------------------------------------------


def _terminated(instance_id: str, status: int = 200, **answer: Any) -> None:
    if status == 200 and not answer:
        answer = {"json": {"data": {"terminated_instances": [vm(instance_id, "terminating")]}}}
    responses.post(f"{BASE}/instance-operations/terminate", status=status, **answer)


@responses.activate
def test_cancel_terminates_then_deletes_only_our_keys_no_instance_uses() -> None:
    ours = [f"trainhub-{c * 16}" for c in "abcd"]
    _terminated("i1")
    listed(
        vm("i1", "terminating", keys=(ours[0],)),  # the one just terminated: key still attached
        vm("i2", "active", keys=(ours[1],)),
        vm("i3", "terminated", keys=(ours[2],)),  # gone: its key is free
    )
    keys(
        *(ssh_key(f"k{i}", name, f"ssh-ed25519 AAAA{i}") for i, name in enumerate(ours)),
        ssh_key("k-laptop", "trainhub-laptop", "ssh-ed25519 AAAAlaptop"),  # not a name we make
        ssh_key("k-mac", "mac", "ssh-ed25519 AAAAmac"),
    )
    for i in (2, 3):
        responses.delete(f"{BASE}/ssh-keys/k{i}")
    adapter().cancel(Handle("i1", NAME))  # no error
    assert body("POST", "/instance-operations/terminate") == {"instance_ids": ["i1"]}
    assert calls() == [
        ("POST", "/instance-operations/terminate"),
        ("GET", "/instances"),
        ("GET", "/ssh-keys"),
        ("DELETE", "/ssh-keys/k2"),
        ("DELETE", "/ssh-keys/k3"),
    ]


@responses.activate
def test_a_key_in_use_is_kept_and_the_others_still_deleted() -> None:
    _terminated("i1")
    listed()
    keys(ssh_key("k1", "trainhub-" + "1" * 16, "a"), ssh_key("k2", "trainhub-" + "2" * 16, "b"))
    responses.delete(f"{BASE}/ssh-keys/k1", status=400, json=lp.KEY_IN_USE)
    responses.delete(f"{BASE}/ssh-keys/k2")
    adapter().cancel(Handle("i1", NAME))  # no error
    assert [c for c in calls() if c[0] == "DELETE"] == [
        ("DELETE", "/ssh-keys/k1"),
        ("DELETE", "/ssh-keys/k2"),
    ]


@pytest.mark.parametrize(
    ("status", "body"),
    [(404, lp.NOT_FOUND), (400, lp.NOT_FOUND)],
    ids=["404", "400-object-does-not-exist"],
)
@responses.activate
def test_cancel_of_an_instance_lambda_does_not_know_is_success(
    status: int, body: dict[str, Any]
) -> None:
    _terminated("gone1", status=status, json=body)
    adapter().cancel(Handle("gone1", NAME))  # no error
    assert calls() == [("POST", "/instance-operations/terminate")], "no clean-up: nothing ended"


@responses.activate
def test_a_clean_up_that_fails_never_fails_the_cancel(sleeps: Sleeps) -> None:
    _terminated("i1")
    responses.get(f"{BASE}/instances", status=429, headers={"Retry-After": "600"}, json={})
    adapter(sleep=sleeps).cancel(Handle("i1", NAME))  # no error
    assert calls() == [("POST", "/instance-operations/terminate"), ("GET", "/instances")]


@responses.activate
def test_a_5xx_to_terminate_is_retried_because_terminating_twice_is_harmless(
    sleeps: Sleeps,
) -> None:
    _terminated("i1", status=502, body=HTML_502, content_type="text/html")
    _terminated("i1")
    listed()
    keys()
    adapter(sleep=sleeps).cancel(Handle("i1", NAME))
    assert [c for c in calls() if c[1] == "/instance-operations/terminate"] == [
        ("POST", "/instance-operations/terminate")
    ] * 2
    assert len(sleeps) == 1


@responses.activate
def test_a_bad_key_on_terminate_is_invalid_credentials() -> None:
    _terminated("i1", status=401, json=lp.INVALID_KEY)
    raised(InvalidCredentials, lambda: adapter().cancel(Handle("i1", NAME)))
    assert calls() == [("POST", "/instance-operations/terminate")]


# --- list_instances -----------------------------------------------------------------------------


@responses.activate
def test_list_instances_is_our_instances_not_yet_being_terminated() -> None:
    listed(
        vm("i1", "active", name="trainhub-ftjob-a-a1"),
        vm("i2", "terminated", name="trainhub-ftjob-b-a1"),
        vm("i3", "terminating", name="trainhub-ftjob-c-a3"),
        vm("i4", "booting", name="trainhub-ftjob-d-a1"),
        vm("nb", "active", name="my-notebook"),
        vm("x", "active", name="not-trainhub-ftjob-e-a1"),
        vm("anon", "active", name=None),
    )
    assert adapter().list_instances() == [
        Handle("i1", "trainhub-ftjob-a-a1"),
        Handle("i4", "trainhub-ftjob-d-a1"),
    ]
    assert calls() == [("GET", "/instances")]


# --- error codes --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "status", "expected"),
    [
        ("instance-operations/launch/insufficient-capacity", 400, NoCapacity),
        ("global/quota-exceeded", 400, QuotaExceeded),
        ("global/invalid-api-key", 401, InvalidCredentials),
        ("global/account-inactive", 403, InvalidCredentials),
        ("global/object-does-not-exist", 400, InstanceNotFound),
        ("provider/internal-unavailable", 400, TransientProviderError),
        ("global/invalid-parameters", 400, PermanentProviderError),
        ("ssh-keys/key-in-use", 400, PermanentProviderError),
        ("global/unknown", 500, TransientProviderError),
    ],
)
def test_errors_are_mapped_by_lambdas_code(
    code: str, status: int, expected: type[ProviderError]
) -> None:
    original = (TransientProviderError if status >= 500 else PermanentProviderError)(
        f"lambda POST /x returned HTTP {status}: {code}",
        provider="lambda",
        status=status,
        code=code,
    )
    mapped = translate(original)
    assert type(mapped) is expected
    assert (mapped.status, mapped.code, mapped.provider) == (status, code, "lambda")


def test_an_upstream_5xx_or_429_keeps_maybe_applied_and_retry_after() -> None:
    original = TransientProviderError("x", maybe_applied=True, code="provider/internal-unavailable")
    assert translate(original) is original
    limited = RateLimited("x", retry_after=7.0, status=429, code="provider/internal-unavailable")
    assert translate(limited) is limited
    refused = PermanentProviderError("x", status=400, code="provider/internal-unavailable")
    mapped = translate(refused)
    assert isinstance(mapped, TransientProviderError) and not mapped.maybe_applied


# --- settings -----------------------------------------------------------------------------------


def test_from_settings_reads_the_lambda_settings_and_shares_the_limiter(settings: Any) -> None:
    settings.LAMBDA_API_URL = "https://lambda.proxy.example/api/v1/"
    settings.LAMBDA_INSTANCE_TYPES = ["gpu_1x_*"]
    settings.LAMBDA_REGIONS = ["us-*"]
    built = lambda_cloud.from_settings({"api_key": KEY})
    assert built._http.base_url == "https://lambda.proxy.example/api/v1"
    assert built._types == ["gpu_1x_*"] and built._regions == ["us-*"]
    limiter = built._http.limiter
    assert limiter is not None and limiter.limits == lambda_cloud.RATE_LIMITS  # type: ignore[attr-defined]
    # Lambda limits each API key: the buckets are the account's, named by a hash of its key.
    assert limiter.account == account_tag(KEY) and KEY not in limiter.account  # type: ignore[attr-defined]
    other = lambda_cloud.from_settings({"api_key": KEY + "-other-project"})._http.limiter
    assert other.account != limiter.account  # type: ignore[union-attr]


def test_the_rate_limits_stay_under_lambdas() -> None:
    calls_, window = lambda_cloud.RATE_LIMITS["default"]
    assert calls_ / window < 1.0, "about 1 request/s in general"
    calls_, window = lambda_cloud.RATE_LIMITS["launch"]
    assert window / calls_ >= 12.0, "1 launch per 12 s"
