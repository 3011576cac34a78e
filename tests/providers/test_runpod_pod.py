"""The RunPod pods adapter (REST v2) against ``responses`` answers shaped like RunPod's
documented ones: the v2 Pod object (``ssh {proxy, direct}``, ``runtime`` null until RUNNING,
``cost`` in USD per hour), ``{"pods": [...]}`` listings, the ``{"gpus": [GpuType]}`` catalogue, RFC 9457 problems for 4xx, HTML pages from the edge for 5xx, and
429 with ``Retry-After`` in integer seconds."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

import pytest
import responses
from responses import matchers

from providers.base import CapacityType, Handle, LaunchRequest, Offer, RemoteStatus, SshAddress
from providers.errors import (
    InvalidCredentials,
    NoCapacity,
    PermanentProviderError,
    ProviderError,
    RateLimited,
    TransientProviderError,
)
from providers.http import ProviderHTTP, RetryPolicy
from providers.runpod_pod import RunpodPods, gpu_candidates, in_stock
from tests.providers import runpod_payloads
from tests.providers.contract import Sleeps
from tests.providers.runpod_payloads import H100, HTML_502, IMAGE

BASE = "https://api.runpod.io/v2"
KEY = "rpa_POD_KEY_7f3c9e1d"
NAME = "trainhub-ftjob-x-a2"
PUBKEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJx1trainhubattempt2 trainhub-ftjob-x-a2"
A100 = "NVIDIA A100 80GB PCIe"
L40S = "NVIDIA L40S"
CATALOG = [f"{H100}=80", f"{A100}=80", f"{L40S}=48"]


def adapter(
    sleep: Callable[[float], None] = lambda s: None,
    gpu_types: list[str] | None = None,
    cloud: str = "SECURE",
) -> RunpodPods:
    return RunpodPods(
        api_key=KEY,
        http=ProviderHTTP(provider="runpod-pod", base_url=BASE, sleep=sleep),
        image=IMAGE,
        gpu_types=CATALOG if gpu_types is None else gpu_types,
        cloud=cloud,
        cuda_versions=["12.8"],
        disk_gb=80,
    )


def request(gpu: dict[str, object] | None = None, offer: Offer | None = None) -> LaunchRequest:
    return LaunchRequest(
        job_id="ftjob-x",
        attempt=2,
        name=NAME,
        max_runtime_seconds=3600,
        gpu=gpu if gpu is not None else {"count": 1},
        ssh_public_key=PUBKEY,
        offer=offer,
    )


def pod(pod_id: str, status: str, name: str = NAME, gpu: str = H100) -> dict[str, Any]:
    return runpod_payloads.pod(pod_id, status, name=name, public_key=PUBKEY, gpu=gpu)


def problem(status: int, title: str, detail: str, **extra: object) -> dict[str, object]:
    """An RFC 9457 problem document, RunPod v2's error shape."""
    return {"title": title, "status": status, "detail": detail, **extra}


NO_CAPACITY = problem(
    400,
    "Bad Request",
    "There are no longer any instances available with the requested specifications.",
)


def raised(error: type[ProviderError], call: Callable[[], object]) -> ProviderError:
    """Run ``call``, expect ``error``, and check the key stayed out of what it says."""
    with pytest.raises(error) as info:
        call()
    assert KEY not in str(info.value) and KEY not in repr(info.value.args)
    return info.value


def lookup(*pods: dict[str, Any]) -> None:
    """The launch's look-before-create: ``GET /pods?name=<attempt name>``."""
    responses.get(
        f"{BASE}/pods",
        json={"pods": list(pods)},
        match=[matchers.query_param_matcher({"name": NAME})],
    )


def posts() -> list[Any]:
    return [c for c in responses.calls if c.request.method == "POST"]


def sent_gpus() -> list[str]:
    return [json.loads(c.request.body)["gpu"]["id"] for c in posts()]


# --- launch -------------------------------------------------------------------------------------


@pytest.mark.parametrize("status", ["PROVISIONING", "RUNNING", "EXITED"])
@responses.activate
def test_a_pod_of_this_attempt_that_exists_already_is_reused_without_a_post(status: str) -> None:
    lookup(pod("abc123xyz", status))
    handle = adapter().launch(request())
    assert handle == Handle(instance_id="abc123xyz", name=NAME)
    assert [c.request.method for c in responses.calls] == ["GET"], "no second pod is rented"


@responses.activate
def test_a_terminated_pod_of_the_same_name_or_another_pod_is_ignored_and_a_new_one_created() -> (
    None
):
    # The name filter is the v1 list's; the adapter also compares names itself, so a server
    # that ignores the filter and lists every pod cannot make it adopt someone else's pod.
    lookup(pod("old1", "TERMINATED"), pod("nb1", "RUNNING", name="my-notebook"))
    responses.post(f"{BASE}/pods", status=201, json=pod("new1", "PROVISIONING"))
    assert adapter().launch(request()) == Handle(instance_id="new1", name=NAME)
    assert len(posts()) == 1


@responses.activate
def test_the_create_body_is_exactly_what_runpod_v2_expects() -> None:
    lookup()
    responses.post(f"{BASE}/pods", status=201, json=pod("new1", "PROVISIONING"))
    adapter().launch(request({"count": 2, "min_vram_gb": 80}))
    (call,) = posts()
    assert call.request.url == f"{BASE}/pods"
    assert json.loads(call.request.body) == {
        "name": NAME,
        "image": IMAGE,
        "gpu": {"id": H100, "count": 2, "allowedCudaVersions": ["12.8"]},
        "cloud": "SECURE",  # explicit: clients disagree on what an absent cloud means
        "disk": 80,
        "ports": ["22/tcp"],
        "env": {"PUBLIC_KEY": PUBKEY},
    }
    assert call.request.headers["Authorization"] == f"Bearer {KEY}"
    assert call.request.headers["Content-Type"] == "application/json"
    assert all(c.request.headers["Authorization"] == f"Bearer {KEY}" for c in responses.calls)


@responses.activate
def test_a_400_moves_on_to_the_next_fitting_gpu_type() -> None:
    lookup()
    responses.post(f"{BASE}/pods", status=400, json=NO_CAPACITY)
    responses.post(f"{BASE}/pods", status=201, json=pod("new1", "PROVISIONING", gpu=A100))
    assert adapter().launch(request({"min_vram_gb": 80})).instance_id == "new1"
    assert sent_gpus() == [H100, A100]


@responses.activate
def test_every_fitting_type_refused_is_no_capacity_naming_each_type() -> None:
    lookup()
    responses.post(f"{BASE}/pods", status=400, json=NO_CAPACITY)
    error = raised(NoCapacity, lambda: adapter().launch(request({"min_vram_gb": 80})))
    assert sent_gpus() == [H100, A100], "L40S (48 GB) does not fit and is never asked for"
    assert H100 in error.message and A100 in error.message and L40S not in error.message
    assert "no longer any instances available" in error.message
    assert error.retryable


@pytest.mark.parametrize(
    ("status", "body", "error"),
    [
        (
            422,
            problem(
                422,
                "Unprocessable Entity",
                "Request validation failed.",
                errors=[{"detail": "unknown field", "pointer": "/gpu/minRamPerGpu"}],
            ),
            PermanentProviderError,
        ),
        (402, problem(402, "Payment Required", "insufficient balance"), PermanentProviderError),
        (403, problem(403, "Forbidden", "access denied"), InvalidCredentials),
    ],
)
@responses.activate
def test_refusals_no_other_gpu_can_cure_stop_after_one_post(
    status: int, body: dict[str, object], error: type[ProviderError]
) -> None:
    lookup()
    responses.post(f"{BASE}/pods", status=status, json=body)
    failure = raised(error, lambda: adapter().launch(request()))
    assert type(failure) is error and failure.status == status
    assert str(body["detail"]) in failure.message
    assert len(posts()) == 1, "the next GPU type is not tried"


def test_gpu_candidates_filter_by_vram_and_name_glob_in_catalogue_order() -> None:
    assert gpu_candidates({}, CATALOG) == [(H100, 80), (A100, 80), (L40S, 48)]
    assert gpu_candidates({"min_vram_gb": 48}, CATALOG) == [(H100, 80), (A100, 80), (L40S, 48)]
    assert gpu_candidates({"min_vram_gb": 49}, CATALOG) == [(H100, 80), (A100, 80)]
    assert gpu_candidates({"name": "*H100*"}, CATALOG) == [(H100, 80)]
    assert gpu_candidates({"name": "*l40s"}, CATALOG) == [(L40S, 48)], "case-insensitive"
    assert gpu_candidates({"name": "*A100*", "min_vram_gb": 40}, CATALOG) == [(A100, 80)]
    assert gpu_candidates({"name": "*H200*"}, CATALOG) == []
    assert gpu_candidates({"min_vram_gb": 141}, CATALOG) == []


@pytest.mark.parametrize("entry", [H100, "=80", f"{H100}=eighty", f"{H100}="])
def test_a_malformed_catalogue_entry_is_a_value_error(entry: str) -> None:
    with pytest.raises(ValueError, match="RUNPOD_POD_GPU_TYPES"):
        gpu_candidates({}, [f"{A100}=80", entry])


@responses.activate
def test_no_fitting_gpu_type_is_no_capacity_without_any_post() -> None:
    lookup()
    error = raised(NoCapacity, lambda: adapter().launch(request({"min_vram_gb": 141})))
    assert "RUNPOD_POD_GPU_TYPES" in error.message and "141" in error.message
    raised(NoCapacity, lambda: adapter().launch(request({"name": "*H200*"})))
    assert posts() == []


@responses.activate
def test_a_malformed_catalogue_fails_launch_before_any_post() -> None:
    lookup()
    with pytest.raises(ValueError, match="is not '<gpu id>=<VRAM GB>'"):
        adapter(gpu_types=[f"{H100}=80", "NVIDIA L40S"]).launch(request())
    assert posts() == []


@responses.activate
def test_a_502_to_the_create_is_never_repeated_and_the_retry_finds_the_pod() -> None:
    lookup()  # first launch: nothing yet
    lookup(pod("made1", "PROVISIONING"))  # second: the 502 came after RunPod created the pod
    responses.post(f"{BASE}/pods", status=502, body=HTML_502, content_type="text/html")
    error = raised(TransientProviderError, lambda: adapter().launch(request()))
    assert isinstance(error, TransientProviderError) and error.maybe_applied
    assert "502 Bad Gateway" in error.message and "<html>" not in error.message
    assert len(posts()) == 1

    assert adapter().launch(request()) == Handle(instance_id="made1", name=NAME)
    assert len(posts()) == 1, "no second pod"


# --- launch of a priced offer -------------------------------------------------------------------


def offer(gpu_id: str = A100, count: int = 2, target: str = "runpod-pod") -> Offer:
    return Offer(
        target=target,
        offer_id=gpu_id,
        gpu_name=gpu_id,
        gpu_count=count,
        vram_gb=80.0,
        price_per_hour=2.78,
        details={"name": "A100 PCIe", "cloud": "SECURE", "stock": "LOW", "data_centers": []},
    )


@responses.activate
def test_an_offer_is_created_on_exactly_its_gpu_type_and_count() -> None:
    lookup()
    responses.post(f"{BASE}/pods", status=201, json=pod("new1", "PROVISIONING", gpu=A100))
    # H100 is first in RUNPOD_POD_GPU_TYPES and fits too: the offer alone decides.
    handle = adapter().launch(request({"count": 2, "min_vram_gb": 80}, offer=offer()))
    assert handle == Handle(instance_id="new1", name=NAME)
    (call,) = posts()
    assert json.loads(call.request.body) == {
        "name": NAME,
        "image": IMAGE,
        "gpu": {"id": A100, "count": 2, "allowedCudaVersions": ["12.8"]},
        "cloud": "SECURE",
        "disk": 80,
        "ports": ["22/tcp"],
        "env": {"PUBLIC_KEY": PUBKEY},
    }


@responses.activate
def test_a_400_to_an_offer_is_no_capacity_naming_it_and_no_other_type_is_tried() -> None:
    lookup()
    responses.post(f"{BASE}/pods", status=400, json=NO_CAPACITY)
    error = raised(NoCapacity, lambda: adapter().launch(request({"count": 2}, offer=offer())))
    assert sent_gpus() == [A100], "not H100 nor L40S: another type is another price"
    assert A100 in error.message and "no longer any instances available" in error.message
    assert error.retryable and error.status == 400


@responses.activate
def test_a_refusal_no_capacity_explains_is_not_dressed_up_as_one() -> None:
    lookup()
    responses.post(f"{BASE}/pods", status=402, json=problem(402, "Payment Required", "balance"))
    error = raised(PermanentProviderError, lambda: adapter().launch(request(offer=offer())))
    assert type(error) is PermanentProviderError and error.status == 402
    assert len(posts()) == 1


@responses.activate
def test_a_pod_of_this_attempt_is_reused_before_any_offer_is_rented() -> None:
    lookup(pod("abc123xyz", "STARTING", gpu=A100))
    assert adapter().launch(request(offer=offer())) == Handle("abc123xyz", NAME)
    assert posts() == []


@responses.activate
def test_an_offer_of_another_target_is_refused_before_any_post() -> None:
    lookup()
    bad = offer(gpu_id="gpu_1x_h100_sxm5@us-east-1", target="lambda")
    error = raised(PermanentProviderError, lambda: adapter().launch(request(offer=bad)))
    assert "lambda" in error.message and "runpod-pod" in error.message
    assert posts() == []


# --- poll ---------------------------------------------------------------------------------------


@responses.activate
def test_one_list_call_answers_for_every_handle() -> None:
    responses.get(
        f"{BASE}/pods",
        json={
            "pods": [
                pod("p1", "RUNNING", name="trainhub-a-a1"),
                pod("p2", "STARTING", name="trainhub-b-a1"),
                pod("p3", "EXITED", name="trainhub-c-a1"),
                pod("nb", "RUNNING", name="my-notebook"),
            ]
        },
        match=[matchers.query_param_matcher({})],
    )
    handles = [Handle(f"p{i}", f"trainhub-{c}-a1") for i, c in zip((1, 2, 3), "abc", strict=True)]
    states = adapter().poll([*handles, Handle("gone", "trainhub-d-a1")])
    assert len(responses.calls) == 1
    assert {k: s.status for k, s in states.items()} == {
        "p1": RemoteStatus.RUNNING,
        "p2": RemoteStatus.PENDING,
        "p3": RemoteStatus.LOST,
        "gone": RemoteStatus.LOST,
    }


RUNNING_NO_SSH = {**pod("p1", "RUNNING"), "ssh": None}
RUNNING_PROXY_ONLY = {
    **pod("p1", "RUNNING"),
    "ssh": {**pod("p1", "RUNNING")["ssh"], "direct": None},
}


@pytest.mark.parametrize(
    ("listed", "status", "ssh"),
    [
        (pod("p1", "PROVISIONING"), RemoteStatus.PENDING, None),
        (pod("p1", "STARTING"), RemoteStatus.PENDING, None),
        (pod("p1", "RUNNING"), RemoteStatus.RUNNING, SshAddress("195.26.233.3", 34446, "root")),
        (RUNNING_NO_SSH, RemoteStatus.PENDING, None),
        (RUNNING_PROXY_ONLY, RemoteStatus.PENDING, None),  # the proxy cannot scp: not enough
        (pod("p1", "EXITED"), RemoteStatus.LOST, None),
        (pod("p1", "ERROR"), RemoteStatus.LOST, None),
        (pod("p1", "TERMINATED"), RemoteStatus.LOST, None),
        (pod("other", "RUNNING"), RemoteStatus.LOST, None),  # p1 is not listed
        ({**pod("p1", "RUNNING"), "status": "MIGRATING"}, RemoteStatus.PENDING, None),
    ],
    ids=[
        "provisioning",
        "starting",
        "running-direct",
        "running-ssh-null",
        "running-proxy-only",
        "exited",
        "error",
        "terminated",
        "missing",
        "unknown",
    ],
)
@responses.activate
def test_status_map(listed: dict[str, Any], status: RemoteStatus, ssh: SshAddress | None) -> None:
    responses.get(f"{BASE}/pods", json={"pods": [listed]})
    state = adapter().poll([Handle("p1", NAME)])["p1"]
    assert (state.status, state.ssh) == (status, ssh)
    assert state.message


@pytest.mark.parametrize(
    ("listed", "price"),
    [
        (pod("p1", "RUNNING"), 2.69),
        (pod("p1", "PROVISIONING"), 2.69),  # billed from the moment the pod is rented
        (pod("p1", "EXITED"), None),  # cost 0.0 once exited: nothing is billed for the GPU
        ({**pod("p1", "RUNNING"), "cost": 5.38}, 5.38),
        ({**pod("p1", "RUNNING"), "cost": None}, None),
        ({**pod("p1", "RUNNING"), "cost": "2.69"}, None),
        ({k: v for k, v in pod("p1", "RUNNING").items() if k != "cost"}, None),
        (pod("other", "RUNNING"), None),  # p1 is not listed
    ],
    ids=["running", "provisioning", "exited", "two-gpus", "null", "string", "absent", "missing"],
)
@responses.activate
def test_the_billed_rate_is_the_pods_cost(listed: dict[str, Any], price: float | None) -> None:
    responses.get(f"{BASE}/pods", json={"pods": [listed]})
    assert adapter().poll([Handle("p1", NAME)])["p1"].price_per_hour == price


# --- cancel -------------------------------------------------------------------------------------


@responses.activate
def test_cancel_deletes_the_pod() -> None:
    responses.delete(f"{BASE}/pods/p1", status=204)
    assert adapter().cancel(Handle("p1", NAME)) is None
    (call,) = responses.calls
    assert (call.request.method, call.request.url) == ("DELETE", f"{BASE}/pods/p1")
    assert call.request.headers["Authorization"] == f"Bearer {KEY}"


@responses.activate
def test_cancel_of_a_pod_runpod_does_not_know_is_success() -> None:
    responses.delete(
        f"{BASE}/pods/gone1", status=404, json=problem(404, "Not Found", "resource not found")
    )
    adapter().cancel(Handle("gone1", NAME))  # no error
    assert len(responses.calls) == 1


@responses.activate
def test_a_5xx_to_delete_is_retried_because_delete_is_idempotent(sleeps: Sleeps) -> None:
    responses.delete(f"{BASE}/pods/p1", status=500, body=HTML_502, content_type="text/html")
    responses.delete(f"{BASE}/pods/p1", status=204)
    adapter(sleep=sleeps).cancel(Handle("p1", NAME))
    assert len(responses.calls) == 2 and len(sleeps) == 1


# --- list_instances -----------------------------------------------------------------------------


@responses.activate
def test_list_instances_is_our_pods_that_still_exist() -> None:
    responses.get(
        f"{BASE}/pods",
        json={
            "pods": [
                pod("p1", "RUNNING", name="trainhub-ftjob-a-a1"),
                pod("p2", "TERMINATED", name="trainhub-ftjob-b-a1"),
                pod("p3", "EXITED", name="trainhub-ftjob-c-a3"),
                pod("p4", "PROVISIONING", name="trainhub-ftjob-d-a1"),
                pod("nb", "RUNNING", name="my-notebook"),
                pod("x", "RUNNING", name="not-trainhub-ftjob-e-a1"),
            ]
        },
    )
    assert adapter().list_instances() == [
        Handle("p1", "trainhub-ftjob-a-a1"),
        Handle("p3", "trainhub-ftjob-c-a3"),
        Handle("p4", "trainhub-ftjob-d-a1"),
    ]
    assert len(responses.calls) == 1


# --- offers -------------------------------------------------------------------------------------

RTX4090 = "NVIDIA GeForce RTX 4090"
H100_TYPE = runpod_payloads.gpu_type(H100, "H100 SXM", 80, secure=2.69, community=1.99)
A100_TYPE = runpod_payloads.gpu_type(
    A100, "A100 PCIe", 80, secure=1.39, community=1.19, availability="LOW", pool="AMPERE_80"
)
L40S_TYPE = runpod_payloads.gpu_type(
    L40S, "L40S", 48, secure=0.86, community=0.79, availability="NONE", pool="ADA_48_PRO"
)
# Cheapest of all, and not in RUNPOD_POD_GPU_TYPES: never offered.
RTX4090_TYPE = runpod_payloads.gpu_type(
    RTX4090, "RTX 4090", 24, secure=0.59, community=0.34, pool="ADA_24"
)
EVERY_TYPE = (RTX4090_TYPE, L40S_TYPE, H100_TYPE, A100_TYPE)


def listing(*gpus: dict[str, Any], cloud: str = "SECURE", count: int = 1) -> None:
    """``GET /catalog/gpus`` asked for pod availability in ``cloud`` at ``count`` GPUs, on the
    CUDA versions a launch allows."""
    params = {
        "include": "AVAILABILITY",
        "product": "POD",
        "cloud": cloud,
        "count": str(count),
        "cudaVersions": "12.8",
    }
    responses.get(
        f"{BASE}/catalog/gpus",
        json=runpod_payloads.catalog(*gpus),
        match=[matchers.query_param_matcher(params)],
    )


@responses.activate
def test_offers_are_the_configured_types_priced_for_the_cloud_cheapest_first() -> None:
    listing(*EVERY_TYPE)
    offers = adapter().offers({"count": 1})
    assert [o.offer_id for o in offers] == [L40S, A100, H100]
    assert offers[2] == Offer(
        target="runpod-pod",
        offer_id=H100,
        gpu_name=H100,  # what the job's glob matched; placement matches it again
        gpu_count=1,
        vram_gb=80.0,
        price_per_hour=2.69,
        spot_price_per_hour=None,
        available=True,
        region="",
        details={
            "name": "H100 SXM",
            "cloud": "SECURE",
            "pool": "HOPPER_80",
            "stock": "HIGH",
            "data_centers": ["US-TX-3"],
        },
    )
    assert (offers[1].price_per_hour, offers[1].available) == (1.39, True), "LOW is some stock"
    assert (offers[0].price_per_hour, offers[0].available) == (0.86, False), "NONE is listed"
    assert offers[0].details == {
        "name": "L40S",
        "cloud": "SECURE",
        "pool": "ADA_48_PRO",
        "stock": "NONE",
        "data_centers": [],
    }
    (call,) = responses.calls
    assert call.request.method == "GET"
    assert call.request.headers["Authorization"] == f"Bearer {KEY}"


@responses.activate
def test_offers_follow_the_jobs_needs_and_price_the_whole_pod() -> None:
    listing(*EVERY_TYPE, count=2)
    offers = adapter().offers({"count": 2, "min_vram_gb": 80})
    assert [(o.offer_id, o.gpu_count, o.price_per_hour) for o in offers] == [
        (A100, 2, 2.78),
        (H100, 2, 5.38),
    ]


@pytest.mark.parametrize("glob", ["*h100*", "NVIDIA H100*", "*80GB HBM3"])
@responses.activate
def test_offers_filter_by_gpu_name_glob_like_launch(glob: str) -> None:
    listing(*EVERY_TYPE)
    (only,) = adapter().offers({"name": glob, "count": 1})
    # gpu_name is the id the glob matched, so placement's second look at it agrees.
    assert (only.offer_id, only.gpu_name, only.details["name"]) == (H100, H100, "H100 SXM")


@responses.activate
def test_no_configured_type_fits_means_no_offers_and_no_call() -> None:
    assert adapter().offers({"min_vram_gb": 141, "count": 1}) == []
    assert adapter().offers({"name": "*H200*"}) == []
    assert len(responses.calls) == 0


@responses.activate
def test_community_cloud_prices_community_and_skips_what_it_does_not_sell() -> None:
    secure_only = runpod_payloads.gpu_type(H100, "H100 SXM", 80, secure=2.69, community=None)
    listing(secure_only, A100_TYPE, L40S_TYPE, cloud="COMMUNITY")
    offers = adapter(cloud="COMMUNITY").offers({"count": 1})
    assert [(o.offer_id, o.price_per_hour) for o in offers] == [(L40S, 0.79), (A100, 1.19)]
    assert {o.details["cloud"] for o in offers} == {"COMMUNITY"}


@responses.activate
def test_all_clouds_take_the_cheaper_cloud_that_has_stock() -> None:
    # List prices are the same in both answers; stock is asked per cloud.
    listing(H100_TYPE, A100_TYPE, L40S_TYPE, cloud="SECURE")
    community_a100 = runpod_payloads.gpu_type(
        A100, "A100 PCIe", 80, secure=1.39, community=1.19, availability="NONE"
    )
    listing(H100_TYPE, community_a100, L40S_TYPE, cloud="COMMUNITY")
    offers = {o.offer_id: o for o in adapter(cloud="ALL").offers({"count": 1})}
    assert len(responses.calls) == 2
    picked = {k: (o.details["cloud"], o.price_per_hour, o.available) for k, o in offers.items()}
    assert picked == {
        H100: ("COMMUNITY", 1.99, True),  # cheaper and in stock
        A100: ("SECURE", 1.39, True),  # community is cheaper but has none
        L40S: ("COMMUNITY", 0.79, False),  # none anywhere: the cheaper, unavailable
    }


@responses.activate
def test_types_unlisted_unpriced_or_too_small_for_the_count_are_left_out() -> None:
    unpriced = runpod_payloads.gpu_type(H100, "H100 SXM", 80, secure=None, community=1.99)
    small = runpod_payloads.gpu_type(A100, "A100 PCIe", 80, secure=1.39, community=1.19)
    small["maxCount"] = {"secure": 2, "community": 1}
    listing(unpriced, small, RTX4090_TYPE, count=4)  # L40S is not listed at all
    assert adapter().offers({"count": 4}) == []


@responses.activate
def test_a_catalogue_without_availability_or_memory_still_offers() -> None:
    # Availability is an expansion; a server that leaves it out says nothing about stock, so
    # the offer stays available and a full type is found out by the create's 400.
    bare = runpod_payloads.gpu_type(
        L40S, "L40S", None, secure=0.86, community=0.79, availability=None
    )
    listing(bare)
    (only,) = adapter().offers({"count": 1})
    assert (only.available, only.details["stock"], only.details["data_centers"]) == (True, None, [])
    assert only.vram_gb == 48.0, "the configured VRAM when the catalogue gives none"


@pytest.mark.parametrize(
    ("level", "available"),
    [
        ("HIGH", True),
        ("MEDIUM", True),
        ("LOW", True),
        ("NONE", False),
        ("None", False),
        (None, True),
        ("SOMETHING_NEW", True),
        (0, False),
        (3, True),
    ],
)
def test_stock_levels(level: object, available: bool) -> None:
    assert in_stock(level) is available


@responses.activate
def test_a_bad_key_on_the_catalogue_is_invalid_credentials() -> None:
    responses.get(
        f"{BASE}/catalog/gpus",
        status=401,
        json=problem(401, "Unauthorized", "invalid bearer token"),
    )
    raised(InvalidCredentials, lambda: adapter().offers({"count": 1}))
    assert len(responses.calls) == 1


# --- rate limits --------------------------------------------------------------------------------


@responses.activate
def test_a_429_is_waited_out_for_its_retry_after(sleeps: Sleeps) -> None:
    responses.get(
        f"{BASE}/pods",
        status=429,
        headers={"Retry-After": "2", "RateLimit-Policy": '"minute";q=60;w=60'},
        json=problem(429, "Too Many Requests", "rate limit exceeded for the minute window"),
    )
    responses.get(f"{BASE}/pods", json={"pods": [pod("p1", "RUNNING")]})
    state = adapter(sleep=sleeps).poll([Handle("p1", NAME)])["p1"]
    assert state.status is RemoteStatus.RUNNING
    assert len(responses.calls) == 2
    assert len(sleeps) == 1 and 2.0 <= sleeps[0] <= 2.3, "Retry-After plus a little jitter"


@responses.activate
def test_a_retry_after_past_the_policy_goes_back_to_the_caller(sleeps: Sleeps) -> None:
    wait = int(RetryPolicy().retry_after_max_seconds) + 60
    responses.get(
        f"{BASE}/pods",
        status=429,
        headers={"Retry-After": str(wait)},
        json=problem(429, "Too Many Requests", "rate limit exceeded for the hour window"),
    )
    error = raised(RateLimited, lambda: adapter(sleep=sleeps).poll([Handle("p1", NAME)]))
    assert isinstance(error, RateLimited) and error.retry_after == wait
    assert sleeps == [] and len(responses.calls) == 1


# --- spot (interruptible) pods ------------------------------------------------------------------


@responses.activate
def test_a_spot_launch_is_refused_before_anything_is_rented() -> None:
    """REST v2's CreatePodRequest has no interruptible field (and rejects unknown fields), so
    a pod cannot be rented as spot: refused as permanent, with no call made."""
    offer = Offer("runpod-pod", H100, H100, 1, 80.0, 2.69)
    spot = dataclasses.replace(request(offer=offer), capacity=CapacityType.SPOT)
    with pytest.raises(PermanentProviderError, match="interruptible") as info:
        adapter().launch(spot)
    assert not isinstance(info.value, NoCapacity), "no other GPU type would help"
    assert len(responses.calls) == 0


@responses.activate
def test_offers_carry_no_spot_price_since_the_catalogue_has_none() -> None:
    listing(*EVERY_TYPE)
    assert all(o.spot_price_per_hour is None for o in adapter().offers({"count": 1}))


def test_from_settings_keeps_one_set_of_rate_buckets_per_key(settings: Any) -> None:
    from providers import runpod_pod
    from providers.ratelimit import account_tag

    built = runpod_pod.from_settings({"api_key": KEY})
    limiter = built._http.limiter
    assert limiter.account == account_tag(KEY)  # type: ignore[union-attr]
