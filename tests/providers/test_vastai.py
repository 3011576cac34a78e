"""The Vast.ai adapter against ``responses`` answers shaped like Vast's documented ones
(``tests.providers.vast_payloads``): offers from ``POST /bundles/``, rentals with
``PUT /asks/{id}/`` (on demand, and bids), the paged v1 ``GET /api/v1/instances/`` listing, ``{"success": false, "error",
"msg"}`` errors, and 429s without ``Retry-After``."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import responses
from responses import matchers

from providers import vastai
from providers.base import (
    CapacityType,
    Handle,
    LaunchRequest,
    Offer,
    RemoteStatus,
    SshAddress,
    gpu_name_matches,
)
from providers.errors import (
    InvalidCredentials,
    NoCapacity,
    PermanentProviderError,
    ProviderError,
    TransientProviderError,
)
from providers.http import ProviderHTTP
from providers.vastai import VastAI
from tests.providers import vast_payloads as vp
from tests.providers.contract import Sleeps
from tests.providers.runpod_payloads import HTML_502

BASE = vp.BASE
KEY = "vast_KEY_3a9f1c7e5b2d"
NAME = "trainhub-ftjob-x-a2"
PUBKEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJx1trainhubattempt2 trainhub-ftjob-x-a2"
INSTANCES = vp.LIST_URL
LIST_QUERY = {
    "select_filters": "{}",
    "order_by": '[{"col": "id", "dir": "asc"}]',
    "limit": "25",
}
ASK = f"{BASE}/asks/{vp.OFFER_ID}/"
NEW = 26070200


def adapter(sleep: Callable[[float], None] = lambda s: None, **options: Any) -> VastAI:
    return VastAI(
        api_key=KEY,
        http=ProviderHTTP(provider="vastai", base_url=BASE, sleep=sleep),
        image=vp.IMAGE,
        **options,
    )


def request(offer: Offer | None = None, public_key: str = PUBKEY) -> LaunchRequest:
    return LaunchRequest(
        job_id="ftjob-x",
        attempt=2,
        name=NAME,
        max_runtime_seconds=3600,
        gpu={"count": 1, "min_vram_gb": 24},
        ssh_public_key=public_key,
        offer=offer or vp.trainhub_offer(),
    )


def instance(instance_id: int, status: str | None = "running", **kw: Any) -> dict[str, Any]:
    kw.setdefault("label", NAME)
    return vp.instance(instance_id, status, public_key=PUBKEY, **kw)


def listed(*instances: dict[str, Any]) -> None:
    responses.get(INSTANCES, json=vp.listing(*instances))


def raised(error: type[ProviderError], call: Callable[[], object]) -> ProviderError:
    """Run ``call``, expect ``error``, and check the key stayed out of what it says."""
    with pytest.raises(error) as info:
        call()
    assert KEY not in f"{info.value} {info.value!r} {info.value.message}"
    return info.value


def sent(method: str, url: str | None = None) -> list[Any]:
    return [
        c
        for c in responses.calls
        if c.request.method == method and (url is None or c.request.url.split("?")[0] == url)
    ]


def called() -> list[tuple[str, str]]:
    """(method, URL without the query) of every call so far."""
    return [(c.request.method, c.request.url.split("?")[0]) for c in responses.calls]


def body_of(call: Any) -> Any:
    return json.loads(call.request.body)


# --- offers -------------------------------------------------------------------------------------


@responses.activate
def test_the_search_body_is_exactly_the_documented_filter() -> None:
    responses.post(f"{BASE}/bundles/", json={"offers": []})
    assert adapter().offers({"count": 2, "min_vram_gb": 40, "name": "*H100*"}) == []
    (call,) = responses.calls
    assert body_of(call) == {
        "rentable": {"eq": True},
        "rented": {"eq": False},
        "verified": {"eq": True},
        "external": {"eq": False},
        "direct_port_count": {"gte": 1},
        "reliability2": {"gte": 0.98},
        "cuda_max_good": {"gte": 12.8},
        "inet_down": {"gte": 200},
        "num_gpus": {"gte": 2},  # machines with more GPUs than asked fit too
        "gpu_ram": {"gte": 38146},  # MiB per GPU: 40 GB, rounded down
        "disk_space": {"gte": 80},
        "order": [["dph_total", "asc"]],
        "type": "ondemand",
        "limit": 64,
    }
    assert "gpu_name" not in body_of(call), "the name glob is matched here, not by Vast"
    assert call.request.headers["Authorization"] == f"Bearer {KEY}"


@responses.activate
def test_the_search_body_follows_the_adapter_options_and_defaults() -> None:
    responses.post(f"{BASE}/bundles/", json={"offers": []})
    tuned = adapter(
        disk_gb=200,
        min_reliability=0.95,
        min_cuda=12.4,
        min_inet_down_mbps=500,
        verified_only=False,
    )
    tuned.offers({})
    body = body_of(responses.calls[0])
    assert "verified" not in body and "gpu_ram" not in body
    assert body["num_gpus"] == {"gte": 1}, "one GPU or more unless the job asks for more"
    assert body["disk_space"] == {"gte": 200}
    assert body["reliability2"] == {"gte": 0.95}
    assert body["cuda_max_good"] == {"gte": 12.4}
    assert body["inet_down"] == {"gte": 500}


@responses.activate
def test_offers_are_parsed_into_trainhub_offers() -> None:
    ask = vp.offer(
        4242,
        gpu_name="H100 SXM",
        num_gpus=2,
        gpu_ram=81559,
        dph_total=4.1234,
        min_bid=2.5,
        machine_id=777,
        geolocation="Texas, US",
    )
    responses.post(f"{BASE}/bundles/", json={"offers": [ask]})
    (parsed,) = adapter().offers({"count": 2})
    assert parsed == Offer(
        target="vastai",
        offer_id="4242",
        gpu_name="H100 SXM",
        gpu_count=2,
        vram_gb=81559 * vastai.MIB_IN_GB,  # MiB as decimal GB
        price_per_hour=4.1234,
        spot_price_per_hour=2.625,  # the bid: min_bid plus 5 %
        available=True,
        region="Texas, US",
        machine_id="777",
        details={
            "reliability2": 0.9962,
            "cuda_max_good": 12.8,
            "inet_down": 904.7,
            "dph_base": ask["dph_base"],
            "verification": "verified",
            "direct_port_count": 100,
            "disk_space": 412.3,
        },
    )
    assert round(parsed.vram_gb, 1) == 85.5, 'an "80GB" card'


@pytest.mark.parametrize(
    ("card", "gpu_ram", "sold_gb"),
    [
        ("RTX 4090", 24564, 24),
        ("H100 SXM", 81559, 80),
        ("L40S", 46068, 48),
        ("A100 PCIE", 40960, 40),
    ],
)
@responses.activate
def test_a_card_passes_the_vram_filter_it_is_sold_for(
    card: str, gpu_ram: int, sold_gb: int
) -> None:
    """gpu_ram is MiB: a "48GB" L40S reports 46068, which a MB reading would turn away."""
    responses.post(
        f"{BASE}/bundles/", json={"offers": [vp.offer(1, gpu_name=card, gpu_ram=gpu_ram)]}
    )
    (found,) = adapter().offers({"count": 1, "min_vram_gb": sold_gb})
    assert body_of(responses.calls[0])["gpu_ram"]["gte"] <= gpu_ram, "Vast would list it"
    assert found.vram_gb >= sold_gb, "placement keeps it"


@responses.activate
def test_offers_come_back_cheapest_first_and_malformed_asks_are_skipped() -> None:
    responses.post(
        f"{BASE}/bundles/",
        json={
            "offers": [
                vp.offer(3, dph_total=0.52, min_bid=None),
                vp.offer(1, dph_total=0.31),
                {"gpu_name": "RTX 4090", "dph_total": 0.01},  # no id: not rentable by us
                "garbage",
                vp.offer(2, dph_total=0.40),
            ]
        },
    )
    offers = adapter().offers({})
    assert [o.offer_id for o in offers] == ["1", "2", "3"]
    assert offers[2].spot_price_per_hour is None, "no min_bid, no spot price"


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        ("*H100*", ["2"]),
        ("*h100*", ["2"]),
        ("RTX 4090", ["1"]),
        ("RTX_4090", ["1"]),  # the CLI's spelling
        ("rtx_40*", ["1"]),
        ("A100 PCIE", ["3"]),
        ("a100_pcie", ["3"]),
        ("*A100*", ["3"]),
        ("RTX*", ["1", "4"]),
        ("*H200*", []),
        ("", ["1", "4", "3", "2"]),
    ],
)
@responses.activate
def test_the_gpu_name_glob_is_matched_client_side(pattern: str, expected: list[str]) -> None:
    responses.post(
        f"{BASE}/bundles/",
        json={
            "offers": [
                vp.offer(1, gpu_name="RTX 4090", dph_total=0.35),
                vp.offer(2, gpu_name="H100 SXM", dph_total=2.40),
                vp.offer(3, gpu_name="A100 PCIE", dph_total=1.10),
                vp.offer(4, gpu_name="RTX 3090", dph_total=0.38),
            ]
        },
    )
    assert [o.offer_id for o in adapter().offers({"name": pattern})] == expected


def test_gpu_name_matches() -> None:
    assert gpu_name_matches("RTX_4090", "RTX 4090")
    assert gpu_name_matches("rtx 4090", "RTX 4090")
    assert gpu_name_matches("*SXM*", "H100 SXM")
    assert not gpu_name_matches("RTX 4090", "RTX 4090 D")
    assert not gpu_name_matches("H100", "H100 SXM"), "a glob, not a substring"


@pytest.mark.parametrize(
    ("name", "sent_names"),
    [
        ("RTX 4090", ["RTX 4090"]),
        ("RTX_4090", ["RTX 4090"]),  # the CLI spelling: Vast's names have spaces
        ("Tesla V100", ["Tesla V100", "TESLA V100"]),
        ("h100 sxm", ["h100 sxm", "H100 SXM"]),
    ],
)
@responses.activate
def test_a_gpu_name_without_wildcards_is_searched_by_vast(name: str, sent_names: list[str]) -> None:
    """Vast searches that card (``gpu_name in [...]``) instead of trainhub picking it out of
    the 64 cheapest asks of every card."""
    responses.post(f"{BASE}/bundles/", json={"offers": [vp.offer(1, gpu_name="RTX 4090")]})
    adapter().offers({"count": 1, "name": name})
    assert body_of(responses.calls[0])["gpu_name"] == {"in": sent_names}


@pytest.mark.parametrize("pattern", ["*H100*", "RTX 40?0", "A100 [SP]XM4", ""])
@responses.activate
def test_a_glob_or_no_name_is_not_sent_to_vast(pattern: str) -> None:
    responses.post(f"{BASE}/bundles/", json={"offers": []})
    adapter().offers({"count": 1, "name": pattern})
    assert "gpu_name" not in body_of(responses.calls[0])


@pytest.mark.parametrize(
    ("min_bid", "dph_total", "spot"),
    [
        (0.2113, 0.3547, 0.222),  # 0.2113 x 1.05 = 0.22187, rounded up to a tenth of a cent
        ("0.30", 0.5, 0.315),  # Vast may send figures as strings
        (0.2, 0.5, 0.21),  # not 0.211: 0.2 x 1.05 is not exact in floating point
        (0.34, 0.3547, None),  # the bid would not be cheaper than on demand
        (0, 0.3547, None),
        (None, 0.3547, None),
    ],
)
def test_the_spot_price_is_the_bid_trainhub_would_place(
    min_bid: object, dph_total: float, spot: float | None
) -> None:
    offer = vastai.offers.offer_from_ask(vp.offer(1, min_bid=min_bid, dph_total=dph_total))
    assert offer.spot_price_per_hour == spot
    assert offer.price_per_hour == dph_total


@responses.activate
def test_a_5xx_on_search_is_retried_because_a_search_rents_nothing(sleeps: Sleeps) -> None:
    responses.post(f"{BASE}/bundles/", status=502, body=HTML_502, content_type="text/html")
    responses.post(f"{BASE}/bundles/", json={"offers": [vp.offer()]})
    assert len(adapter(sleep=sleeps).offers({})) == 1
    assert len(responses.calls) == 2 and len(sleeps) == 1


# --- launch -------------------------------------------------------------------------------------


@pytest.mark.parametrize("status", [None, "loading", "running", "exited"])
@responses.activate
def test_an_instance_labelled_with_the_attempt_is_reused_without_a_put(status: str | None) -> None:
    listed(instance(111, "running", label="my-notebook"), instance(NEW, status))
    handle = adapter().launch(request())
    assert handle == Handle(instance_id=str(NEW), name=NAME)
    assert [c.request.method for c in responses.calls] == ["GET"], "no second machine is rented"


@responses.activate
def test_the_launch_looks_for_a_lost_create_by_label_on_the_v1_list() -> None:
    responses.get(
        INSTANCES,
        json=vp.listing(instance(NEW, "loading")),
        match=[
            matchers.query_param_matcher(
                {**LIST_QUERY, "select_filters": json.dumps({"label": {"in": [NAME]}})}
            )
        ],
    )
    assert adapter().launch(request()) == Handle(instance_id=str(NEW), name=NAME)
    assert called() == [("GET", INSTANCES)]


@responses.activate
def test_the_create_body_is_exactly_what_vast_expects_and_the_key_is_attached() -> None:
    listed(instance(111, "running", label="trainhub-other-job-a1"))
    responses.put(ASK, json=vp.created(NEW))
    responses.post(f"{BASE}/instances/{NEW}/ssh/", json={"success": True, "msg": "ok"})
    assert adapter().launch(request()) == Handle(instance_id=str(NEW), name=NAME)

    assert called() == [
        ("GET", INSTANCES),
        ("PUT", ASK),
        ("POST", f"{BASE}/instances/{NEW}/ssh/"),
    ]
    (put,) = sent("PUT")
    assert body_of(put) == {
        "client_id": "me",
        "image": vp.IMAGE,
        "disk": 80,
        "label": NAME,
        "runtype": "ssh_direct",
        "onstart": vastai.ONSTART,
        "env": {"TRAINHUB_SSH_PUBLIC_KEY": PUBKEY},
        "cancel_unavail": True,
    }
    assert "price" not in body_of(put), "on demand: a price would make it an interruptible bid"
    (attach,) = sent("POST")
    assert body_of(attach) == {"ssh_key": PUBKEY}
    assert all(c.request.headers["Authorization"] == f"Bearer {KEY}" for c in responses.calls)


@responses.activate
def test_a_spot_launch_bids_the_offers_spot_price_for_an_interruptible_instance() -> None:
    listed()
    responses.put(ASK, json=vp.created(NEW))
    responses.post(f"{BASE}/instances/{NEW}/ssh/", json={"success": True})
    offer = vastai.offers.offer_from_ask(vp.offer())
    spot = dataclasses.replace(request(offer), capacity=CapacityType.SPOT)
    assert adapter().launch(spot) == Handle(instance_id=str(NEW), name=NAME)
    (put,) = sent("PUT")
    body = body_of(put)
    assert body["price"] == 0.222 == offer.spot_price_per_hour  # USD/h for the machine
    assert {k: v for k, v in body.items() if k != "price"} == adapter().create_body(request())


@responses.activate
def test_a_spot_launch_on_an_offer_without_a_bid_price_rents_nothing() -> None:
    listed()
    offer = dataclasses.replace(vp.trainhub_offer(), spot_price_per_hour=None)
    spot = dataclasses.replace(request(offer), capacity=CapacityType.SPOT)
    error = raised(PermanentProviderError, lambda: adapter().launch(spot))
    assert "spot_price_per_hour" in error.message
    assert not sent("PUT")


def test_the_onstart_installs_the_key_once_with_safe_permissions(tmp_path: Path) -> None:
    """Run the real onstart (rooted at a scratch directory instead of /root) twice."""
    root = tmp_path / "root"
    script = vastai.ONSTART.replace("/root/", f"{root}/")
    assert script.count(f"{root}/") == vastai.ONSTART.count("/root/")
    env = {"PATH": os.environ["PATH"], "TRAINHUB_SSH_PUBLIC_KEY": PUBKEY}
    for _ in range(2):
        subprocess.run(["sh", "-c", script], env=env, check=True)
    keys = root / ".ssh" / "authorized_keys"
    assert keys.read_text() == PUBKEY + "\n", "appended once, on its own line"
    assert (root / ".ssh").stat().st_mode & 0o777 == 0o700
    assert keys.stat().st_mode & 0o777 == 0o600

    other = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIother other@host"
    subprocess.run(["sh", "-c", script], env={**env, "TRAINHUB_SSH_PUBLIC_KEY": other}, check=True)
    assert keys.read_text() == f"{PUBKEY}\n{other}\n", "keys already there are kept"
    subprocess.run(["sh", "-c", script], env={**env, "TRAINHUB_SSH_PUBLIC_KEY": ""}, check=True)
    assert keys.read_text() == f"{PUBKEY}\n{other}\n", "no key, no empty line"


@pytest.mark.parametrize(
    "attach",
    [
        {"status": 500, "body": HTML_502, "content_type": "text/html"},
        {"status": 400, "json": vp.error("invalid_args", "bad ssh key")},
        {"status": 403, "json": vp.error("not_authorized", "key lacks instance_write")},
        None,  # not answered: a dropped connection
    ],
    ids=["5xx", "400", "403", "connection"],
)
@responses.activate
def test_a_failed_key_attach_is_swallowed_and_the_id_still_returned(
    attach: dict[str, Any] | None, caplog: pytest.LogCaptureFixture
) -> None:
    listed()
    responses.put(ASK, json=vp.created(NEW))
    if attach is not None:
        responses.post(f"{BASE}/instances/{NEW}/ssh/", **attach)
    assert adapter().launch(request()).instance_id == str(NEW)
    assert len(sent("PUT")) == 1
    assert f"instance {NEW}: attaching the SSH key failed" in caplog.text
    assert KEY not in caplog.text


@responses.activate
def test_no_attach_without_a_key() -> None:
    listed()
    responses.put(ASK, json=vp.created(NEW))
    adapter().launch(request(public_key=""))
    assert sent("POST") == []


@responses.activate
def test_a_502_to_the_create_is_never_repeated_and_the_retry_finds_the_instance(
    sleeps: Sleeps,
) -> None:
    listed()  # first launch: nothing yet
    listed(instance(NEW, None))  # second: the 502 came after Vast rented the machine
    responses.put(ASK, status=502, body=HTML_502, content_type="text/html")
    error = raised(TransientProviderError, lambda: adapter(sleep=sleeps).launch(request()))
    assert isinstance(error, TransientProviderError) and error.maybe_applied
    assert len(sent("PUT")) == 1 and sleeps == []

    assert adapter().launch(request()) == Handle(instance_id=str(NEW), name=NAME)
    assert len(sent("PUT")) == 1, "no second machine"


@responses.activate
def test_a_429_to_the_create_is_waited_out_because_vast_did_not_act_on_it(sleeps: Sleeps) -> None:
    listed()
    responses.put(ASK, status=429, body="API requests too frequent: endpoint threshold=2.0")
    responses.put(ASK, json=vp.created(NEW))
    responses.post(f"{BASE}/instances/{NEW}/ssh/", json={"success": True})
    assert adapter(sleep=sleeps).launch(request()).instance_id == str(NEW)
    assert len(sent("PUT")) == 2 and len(sleeps) == 1, "no Retry-After: our own backoff"


@responses.activate
def test_a_refused_create_that_left_an_instance_destroys_it_then_raises() -> None:
    """PROVIDER_NOTES 6.3.1: an error body that still names ``new_contract``."""
    listed()
    responses.put(
        ASK, status=400, json=vp.error("invalid_price", "bid price too low", new_contract=NEW)
    )
    responses.delete(f"{BASE}/instances/{NEW}/", json={"success": True})
    # A bid below the ask's minimum now: no capacity at this price, so the next offer is tried.
    error = raised(NoCapacity, lambda: adapter().launch(request()))
    assert type(error) is NoCapacity and error.status == 400 and error.code == "invalid_price"
    assert "refused the bid as below its current minimum" in error.message
    assert "bid price too low" in error.message
    assert called() == [
        ("GET", INSTANCES),
        ("PUT", ASK),
        ("DELETE", f"{BASE}/instances/{NEW}/"),
    ]


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        (vp.error("invalid_args", "image is required", new_contract=NEW), PermanentProviderError),
        (vp.error("no_such_ask", "offer taken", new_contract=NEW), NoCapacity),
    ],
)
@responses.activate
def test_a_2xx_with_success_false_that_left_an_instance_destroys_it(
    answer: dict[str, Any], error: type[ProviderError]
) -> None:
    listed()
    responses.put(ASK, json=answer)
    responses.delete(f"{BASE}/instances/{NEW}/", json={"success": True})
    failure = raised(error, lambda: adapter().launch(request()))
    assert type(failure) is error and str(answer["msg"]) in failure.message
    assert len(sent("DELETE", f"{BASE}/instances/{NEW}/")) == 1
    assert sent("POST") == [], "no key attached to a failed create"


@responses.activate
def test_a_2xx_with_success_false_and_no_instance_destroys_nothing() -> None:
    listed()
    responses.put(ASK, json=vp.error("insufficient_credit", "add credit to rent"))
    error = raised(PermanentProviderError, lambda: adapter().launch(request()))
    assert error.code == "insufficient_credit" and "add credit to rent" in error.message
    assert sent("DELETE") == []


@responses.activate
def test_destroying_what_a_failed_create_left_waits_out_429s(sleeps: Sleeps) -> None:
    listed()
    responses.put(ASK, status=400, json=vp.error("invalid_price", "too low", new_contract=NEW))
    responses.delete(f"{BASE}/instances/{NEW}/", status=429, body="API requests too frequent")
    responses.delete(f"{BASE}/instances/{NEW}/", status=429, body="API requests too frequent")
    responses.delete(f"{BASE}/instances/{NEW}/", json={"success": True})
    raised(NoCapacity, lambda: adapter(sleep=sleeps).launch(request()))
    assert len(sent("DELETE")) == 3 and len(sleeps) == 2


@responses.activate
def test_a_left_instance_that_is_already_gone_is_fine() -> None:
    listed()
    responses.put(ASK, status=400, json=vp.error("invalid_price", "too low", new_contract=NEW))
    responses.delete(
        f"{BASE}/instances/{NEW}/",
        status=404,
        json=vp.error("no_such_instance", f"Instance {NEW} not found."),
    )
    error = raised(NoCapacity, lambda: adapter().launch(request()))
    assert "too low" in error.message


@responses.activate
def test_a_left_instance_that_cannot_be_destroyed_is_maybe_applied_so_the_retry_looks(
    sleeps: Sleeps,
) -> None:
    listed()
    responses.put(ASK, status=400, json=vp.error("invalid_price", "too low", new_contract=NEW))
    responses.delete(f"{BASE}/instances/{NEW}/", status=500, body=HTML_502)
    error = raised(TransientProviderError, lambda: adapter(sleep=sleeps).launch(request()))
    assert isinstance(error, TransientProviderError) and error.maybe_applied
    assert f"left instance {NEW}" in error.message
    assert len(sent("DELETE")) == 5, "DELETE is idempotent: retried before giving up"


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (404, vp.error("no_such_ask", "Offer 21614864 does not exist.")),
        (410, vp.error("no_such_ask", "Offer cannot start now (cancel_unavail).")),
        (404, {"detail": "Not found."}),
        (400, {"success": False, "msg": "no_such_ask"}),
    ],
    ids=["404", "410-cancel-unavail", "404-no-code", "400-code-in-msg"],
)
@responses.activate
def test_an_offer_that_is_gone_is_no_capacity_naming_it(
    status: int, body: dict[str, object]
) -> None:
    listed()
    responses.put(ASK, status=status, json=body)
    error = raised(NoCapacity, lambda: adapter().launch(request()))
    assert type(error) is NoCapacity and error.retryable
    assert f"offer {vp.OFFER_ID}" in error.message
    assert len(sent("PUT")) == 1 and sent("DELETE") == []


@pytest.mark.parametrize(
    ("status", "body", "error"),
    [
        (400, vp.error("invalid_args", "disk must be a number"), PermanentProviderError),
        (400, vp.error("no_ssh_key_for_vm", "add an ssh key first"), PermanentProviderError),
        (402, vp.error("insufficient_credit", "balance too low"), PermanentProviderError),
        (410, vp.error("deprecated_endpoint", "use /api/v1/asks/"), PermanentProviderError),
        (403, vp.error("not_authorized", "key lacks instance_write"), InvalidCredentials),
    ],
)
@responses.activate
def test_other_refusals_keep_their_class_and_message(
    status: int, body: dict[str, object], error: type[ProviderError]
) -> None:
    listed()
    responses.put(ASK, status=status, json=body)
    failure = raised(error, lambda: adapter().launch(request()))
    assert type(failure) is error and failure.status == status
    assert str(body["msg"]) in failure.message and failure.code == body["error"]
    assert len(sent("PUT")) == 1


@responses.activate
def test_a_success_without_an_instance_id_is_maybe_applied() -> None:
    listed()
    responses.put(ASK, json={"success": True})
    error = raised(TransientProviderError, lambda: adapter().launch(request()))
    assert isinstance(error, TransientProviderError) and error.maybe_applied


@responses.activate
def test_a_launch_without_an_offer_is_permanent_and_calls_nothing() -> None:
    no_offer = dataclasses.replace(request(), offer=None)
    error = raised(PermanentProviderError, lambda: adapter().launch(no_offer))
    assert "LaunchRequest.offer" in error.message and NAME in error.message
    foreign = dataclasses.replace(vp.trainhub_offer(), target="lambda")
    raised(PermanentProviderError, lambda: adapter().launch(request(foreign)))
    assert len(responses.calls) == 0


# --- poll ---------------------------------------------------------------------------------------

RUNNING_SSH = SshAddress(vp.PUBLIC_IP, int(vp.SSH_PORT), "root")


@pytest.mark.parametrize(
    ("actual", "status", "ssh"),
    [
        (None, RemoteStatus.PENDING, None),
        ("created", RemoteStatus.PENDING, None),
        ("loading", RemoteStatus.PENDING, None),
        ("rebooting", RemoteStatus.PENDING, None),
        ("restarting", RemoteStatus.PENDING, None),
        ("running", RemoteStatus.RUNNING, RUNNING_SSH),
        ("stopped", RemoteStatus.LOST, None),
        ("frozen", RemoteStatus.LOST, None),
        ("exited", RemoteStatus.LOST, None),
        ("unknown", RemoteStatus.LOST, None),
        ("offline", RemoteStatus.LOST, None),
        ("migrating", RemoteStatus.PENDING, None),  # not in the map: wait, the deadline decides
    ],
)
@responses.activate
def test_each_actual_status(actual: str | None, status: RemoteStatus, ssh: SshAddress) -> None:
    listed(instance(NEW, actual, dph_total=0.4012))
    state = adapter().poll([Handle(str(NEW), NAME)])[str(NEW)]
    assert (state.status, state.ssh) == (status, ssh)
    assert state.price_per_hour == 0.4012
    assert state.message


def test_the_status_map_covers_every_documented_status() -> None:
    assert set(vastai.STATUS_MAP) == vp.VAST_CASE.documented_statuses


@responses.activate
def test_stopped_everywhere_is_outbid_or_interrupted() -> None:
    listed(
        instance(
            NEW,
            "exited",
            intended_status="stopped",
            cur_state="stopped",
            next_state="stopped",
            status_msg="",
        )
    )
    state = adapter().poll([Handle(str(NEW), NAME)])[str(NEW)]
    assert state.status is RemoteStatus.LOST
    assert "outbid or interrupted" in state.message


@pytest.mark.parametrize(
    ("actual", "states"),
    [
        ("exited", {"intended_status": "stopped", "cur_state": "stopped", "next_state": "stopped"}),
        (
            "stopped",
            {"intended_status": "stopped", "cur_state": "stopped", "next_state": "stopped"},
        ),
        ("stopped", {}),  # the container shows it first
    ],
)
@responses.activate
def test_an_outbid_interruptible_instance_is_failed_preempted(
    actual: str, states: dict[str, str]
) -> None:
    listed(instance(NEW, actual, is_bid=True, dph_total=0.222, status_msg="", **states))
    state = adapter().poll([Handle(str(NEW), NAME)])[str(NEW)]
    assert state.status is RemoteStatus.FAILED
    assert state.error_code == "preempted"
    assert "preempted" in state.message and "interruptible" in state.message
    assert state.price_per_hour == 0.222


@responses.activate
def test_a_running_interruptible_instance_is_running() -> None:
    listed(instance(NEW, "running", is_bid=True))
    state = adapter().poll([Handle(str(NEW), NAME)])[str(NEW)]
    assert state.status is RemoteStatus.RUNNING and state.error_code == ""


@responses.activate
def test_a_stop_only_the_container_shows_is_lost_without_the_outbid_message() -> None:
    listed(instance(NEW, "stopped", status_msg="Container stopped"))
    state = adapter().poll([Handle(str(NEW), NAME)])[str(NEW)]
    assert state.status is RemoteStatus.LOST
    assert state.message == "the instance is stopped: Container stopped"


@responses.activate
def test_a_container_that_failed_to_be_created_is_lost_with_vasts_message() -> None:
    oci = (
        "Error response from daemon: failed to create task for container: failed to create "
        "shim task: OCI runtime create failed: runc create failed: unable to start container "
        "process: error during container init: nvidia-container-cli: requirement error: "
        "unsatisfied condition: cuda>=12.8"
    )
    listed(instance(NEW, "created", status_msg=oci))
    state = adapter().poll([Handle(str(NEW), NAME)])[str(NEW)]
    assert state.status is RemoteStatus.LOST
    assert "OCI runtime create failed" in state.message and "cuda>=12.8" in state.message


@pytest.mark.parametrize(
    "changes",
    [
        {"ports": {}},
        {"ports": None},
        {"ports": {"22/tcp": []}},
        {"ports": {"8080/tcp": [{"HostIp": "0.0.0.0", "HostPort": "41080"}]}},  # noqa: S104
        {"public_ipaddr": None},
        {"public_ipaddr": ""},
    ],
    ids=["empty", "null", "no-binding", "jupyter-only", "ip-null", "ip-empty"],
)
@responses.activate
def test_running_without_a_direct_ssh_address_is_pending(changes: dict[str, Any]) -> None:
    listed({**instance(NEW, "running"), **changes})
    state = adapter().poll([Handle(str(NEW), NAME)])[str(NEW)]
    assert (state.status, state.ssh) == (RemoteStatus.PENDING, None)
    assert "without a direct SSH port" in state.message


@responses.activate
def test_the_public_address_is_trimmed() -> None:
    # Vast's public_ipaddr has come with surrounding whitespace (dstack strips it).
    listed(instance(NEW, "running", public_ipaddr=f" {vp.PUBLIC_IP}\n"))
    state = adapter().poll([Handle(str(NEW), NAME)])[str(NEW)]
    assert state.ssh == RUNNING_SSH


@responses.activate
def test_one_list_call_answers_for_every_handle_and_a_missing_one_is_lost() -> None:
    listed(
        instance(1, "running", label="trainhub-a-a1"),
        instance(2, "loading", label="trainhub-b-a1"),
        instance(3, "offline", label="trainhub-c-a1"),
        instance(4, "running", label="my-notebook"),
    )
    handles = [Handle(str(i), f"trainhub-{c}-a1") for i, c in ((1, "a"), (2, "b"), (3, "c"))]
    states = adapter().poll([*handles, Handle("9", "trainhub-d-a1")])
    assert len(responses.calls) == 1
    assert {k: s.status for k, s in states.items()} == {
        "1": RemoteStatus.RUNNING,
        "2": RemoteStatus.PENDING,
        "3": RemoteStatus.LOST,
        "9": RemoteStatus.LOST,
    }
    assert states["9"].message == "Vast no longer lists this instance"
    assert states["9"].price_per_hour is None
    assert states["3"].message == "the instance is offline: host is offline"


@responses.activate
def test_polling_nothing_calls_nothing() -> None:
    assert adapter().poll([]) == {}
    assert len(responses.calls) == 0


@responses.activate
def test_instances_are_listed_from_v1_never_v0_whose_list_answers_410_to_new_accounts() -> None:
    # What Vast answers a post-2026-06-02 account on v0: never asked any more.
    responses.get(
        f"{BASE}/instances/",
        status=410,
        json=vp.error("deprecated_endpoint", "/api/v0/instances/ is deprecated."),
    )
    responses.get(
        INSTANCES,
        json=vp.listing(instance(NEW, "running")),
        match=[matchers.query_param_matcher(LIST_QUERY)],
    )
    states = adapter().poll([Handle(str(NEW), NAME)])
    assert states[str(NEW)].status is RemoteStatus.RUNNING
    assert called() == [("GET", INSTANCES)]
    assert responses.calls[0].request.headers["Authorization"] == f"Bearer {KEY}"


@responses.activate
def test_the_v1_list_is_paged_with_next_token_as_after_token_until_none_comes() -> None:
    rows = [instance(100 + n, "running", label=f"trainhub-ftjob-{n}-a1") for n in range(27)]
    responses.get(
        INSTANCES,
        json=vp.listing(*rows[:25], next_token="eyJpZCI6IDEyNH0=", total=27),
        match=[matchers.query_param_matcher(LIST_QUERY)],
    )
    responses.get(
        INSTANCES,
        json=vp.listing(*rows[25:], total=27),
        match=[matchers.query_param_matcher({**LIST_QUERY, "after_token": "eyJpZCI6IDEyNH0="})],
    )
    handles = adapter().list_instances()
    assert [h.instance_id for h in handles] == [str(100 + n) for n in range(27)]
    assert len(responses.calls) == 2
    states = adapter().poll([Handle("126", "trainhub-ftjob-26-a1")])
    assert states["126"].status is RemoteStatus.RUNNING, "a row of the second page is not LOST"


@responses.activate
def test_a_page_that_fails_fails_the_whole_list_so_nothing_looks_lost(sleeps: Sleeps) -> None:
    responses.get(
        INSTANCES,
        json=vp.listing(instance(1, "running"), next_token="t2"),
        match=[matchers.query_param_matcher(LIST_QUERY)],
    )
    responses.get(
        INSTANCES,
        status=502,
        body=HTML_502,
        match=[matchers.query_param_matcher({**LIST_QUERY, "after_token": "t2"})],
    )
    raised(TransientProviderError, lambda: adapter(sleeps).poll([Handle("1", NAME)]))


@responses.activate
def test_a_list_without_rows_is_transient_never_an_empty_account() -> None:
    responses.get(INSTANCES, json={"success": False, "msg": "try again"})
    raised(TransientProviderError, lambda: adapter().poll([Handle(str(NEW), NAME)]))


@responses.activate
def test_a_repeated_next_token_ends_the_paging() -> None:
    responses.get(INSTANCES, json=vp.listing(instance(1, "running"), next_token="same"))
    assert adapter().list_instances() == [Handle("1", NAME)]
    assert len(responses.calls) == 2  # the token came back again: not a third page


@responses.activate
def test_a_list_vast_refuses_as_gone_gets_an_actionable_error() -> None:
    responses.get(INSTANCES, status=404, json=vp.error("not_found", "no such route"))
    error = raised(PermanentProviderError, lambda: adapter().poll([Handle(str(NEW), NAME)]))
    assert type(error) is PermanentProviderError, "not InstanceNotFound: nothing is gone"
    assert "VAST_API_URL" in error.message


def test_the_v1_root_sits_beside_the_configured_v0_one() -> None:
    assert vastai.api.v1_url("https://console.vast.ai/api/v0/") == vp.V1
    with pytest.raises(ValueError, match="VAST_API_URL"):
        vastai.api.v1_url("https://proxy.example.test/vast")


# --- cancel -------------------------------------------------------------------------------------


@responses.activate
def test_cancel_destroys_the_instance_and_never_stops_it() -> None:
    responses.delete(f"{BASE}/instances/{NEW}/", json={"success": True})
    adapter().cancel(Handle(str(NEW), NAME))
    (call,) = responses.calls
    assert (call.request.method, call.request.url) == ("DELETE", f"{BASE}/instances/{NEW}/")
    assert sent("PUT") == [], "a stopped instance still bills its disk"


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (404, vp.error("no_such_instance", f"Instance {NEW} not found.")),
        (200, vp.error("no_such_instance", f"Instance {NEW} not found.")),
    ],
)
@responses.activate
def test_cancel_of_an_instance_vast_does_not_know_is_success(
    status: int, body: dict[str, object]
) -> None:
    responses.delete(f"{BASE}/instances/{NEW}/", status=status, json=body)
    adapter().cancel(Handle(str(NEW), NAME))
    assert len(responses.calls) == 1


@responses.activate
def test_a_destroy_vast_answers_unsuccessfully_is_transient() -> None:
    responses.delete(f"{BASE}/instances/{NEW}/", json=vp.error("busy", "try again later"))
    error = raised(TransientProviderError, lambda: adapter().cancel(Handle(str(NEW), NAME)))
    assert error.code == "busy" and "try again later" in error.message


@responses.activate
def test_a_5xx_to_destroy_is_retried_because_destroy_is_idempotent(sleeps: Sleeps) -> None:
    responses.delete(f"{BASE}/instances/{NEW}/", status=503, body=HTML_502)
    responses.delete(f"{BASE}/instances/{NEW}/", json={"success": True})
    adapter(sleep=sleeps).cancel(Handle(str(NEW), NAME))
    assert len(responses.calls) == 2 and len(sleeps) == 1


# --- list_instances -----------------------------------------------------------------------------


@responses.activate
def test_list_instances_is_ours_by_label_prefix() -> None:
    responses.get(
        INSTANCES,
        json=vp.listing(
            instance(1, "running", label="trainhub-ftjob-a-a1"),
            instance(2, "exited", label="trainhub-ftjob-b-a3"),
            instance(3, None, label="trainhub-ftjob-c-a1"),
            instance(4, "running", label="my-notebook"),
            instance(5, "running", label=None),
            instance(6, "running", label="not-trainhub-ftjob-e-a1"),
        ),
        match=[matchers.query_param_matcher(LIST_QUERY)],
    )
    assert adapter().list_instances() == [
        Handle("1", "trainhub-ftjob-a-a1"),
        Handle("2", "trainhub-ftjob-b-a3"),
        Handle("3", "trainhub-ftjob-c-a1"),
    ]
    assert len(responses.calls) == 1


# --- settings -----------------------------------------------------------------------------------


@responses.activate
def test_from_settings_builds_the_adapter_from_the_vast_settings(settings: Any) -> None:
    settings.VAST_API_URL = "https://vast.example.test/api/v0"
    settings.VAST_IMAGE = "ghcr.io/trainhub/executor:1.4.0-cu128"
    settings.VAST_DISK_GB = 120
    settings.VAST_MIN_RELIABILITY = 0.99
    settings.VAST_MIN_CUDA = 12.4
    settings.VAST_MIN_INET_DOWN_MBPS = 500
    settings.VAST_VERIFIED_ONLY = False
    built = vastai.from_settings({"api_key": KEY})
    body = built.search_body({})
    assert "verified" not in body
    assert (body["disk_space"], body["reliability2"], body["cuda_max_good"]) == (
        {"gte": 120},
        {"gte": 0.99},
        {"gte": 12.4},
    )
    assert body["inet_down"] == {"gte": 500}
    create = built.create_body(request())
    assert (create["image"], create["disk"]) == ("ghcr.io/trainhub/executor:1.4.0-cu128", 120)

    responses.delete("https://vast.example.test/api/v0/instances/5/", json={"success": True})
    built.cancel(Handle("5", NAME))  # through the shared limiter (Redis) to the setting's URL
    assert responses.calls[0].request.headers["Authorization"] == f"Bearer {KEY}"


def test_every_bucket_the_adapter_uses_is_limited() -> None:
    assert set(vastai.RATE_LIMITS) == {"search", "create", "attach", "list", "destroy"}
    assert all(calls == 1 for calls, _window in vastai.RATE_LIMITS.values())
