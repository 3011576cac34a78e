"""The providers API: which targets a project can use, whether its keys verify, and the priced
offers of a target. Scripted clouds stand in for providers (their real adapters are tested
against provider-shaped payloads in tests/providers)."""

from __future__ import annotations

import time

import pytest

from jobs.services.accounts.projects import credential_create
from jobs.services.cloud import offers
from providers import registry
from providers.errors import InvalidCredentials, TransientProviderError
from tests.support.api import assert_error, assert_list
from tests.support.fakes.adapter import FakeAdapter, register_fake

pytestmark = pytest.mark.usefixtures("fresh_provider_state")
URL = "/api/v1/providers/"
SECRET = "vk_provider_secret_5e1d"


@pytest.fixture
def priced(settings) -> FakeAdapter:
    """A priced cloud that needs a 'vastai' credential, standing in for the real Vast target
    (which is left out meanwhile: its key would be checked against the real API)."""
    settings.TRAINHUB_PUBLIC_URL = "http://127.0.0.1:8000"
    real = registry.get("vastai")
    registry.unregister("vastai")
    adapter = register_fake("priced-cloud", credential_kind="vastai", has_offers=True)
    adapter.add_offer("a-3090", 0.22, gpu="RTX 3090", vram_gb=24, region="US-CA")
    adapter.add_offer("a-4090", 0.35, gpu="RTX 4090", vram_gb=24, machine_id="m-17")
    adapter.add_offer("a-h100", 2.10, gpu="H100 SXM", vram_gb=80, count=1)
    adapter.add_offer("a-h100x8", 16.8, gpu="H100 SXM", vram_gb=80, count=8, available=False)
    yield adapter
    registry.unregister("priced-cloud")
    registry.register(real)


def entry(data: list[dict], target: str) -> dict:
    return next(p for p in data if p["id"] == target)


def test_every_target_is_listed_with_whether_the_project_can_use_it(api, priced) -> None:
    body = assert_list(api.get(URL))
    ids = [p["id"] for p in body]
    assert ids == sorted(registry.names())
    assert {"local", "lambda", "runpod-pod", "runpod-serverless", "priced-cloud"} <= set(ids)
    fake = entry(body, "priced-cloud")
    assert fake["usable"] is False and fake["has_offers"] is True
    assert "needs a 'vastai' credential" in fake["problem"]
    assert fake["credential"] == {"source": None, "verified": None, "error": None}
    assert entry(body, "local")["credential"] is None


def test_a_credential_is_verified_and_never_shown(api, project, priced) -> None:
    credential_create(project=project, provider="vastai", name="main", secrets={"api_key": SECRET})
    response = api.get(URL)
    fake = entry(assert_list(response), "priced-cloud")
    assert fake["usable"] is True and fake["problem"] is None
    assert fake["credential"] == {"source": "project", "verified": True, "error": None}
    assert priced.secrets_seen[-1] == {"api_key": SECRET}
    assert SECRET not in response.content.decode()


def test_a_key_the_provider_refuses_is_reported_per_provider(
    api, project, priced, monkeypatch
) -> None:
    credential_create(project=project, provider="vastai", name="main", secrets={"api_key": SECRET})

    def refuse():
        raise InvalidCredentials("priced-cloud GET /instances returned HTTP 401: bad key")

    monkeypatch.setattr(priced, "list_instances", refuse)
    body = assert_list(api.get(URL))
    assert entry(body, "priced-cloud")["credential"] == {
        "source": "project",
        "verified": False,
        "error": "priced-cloud GET /instances returned HTTP 401: bad key",
    }


def test_the_operators_key_counts_where_the_project_may_use_it(
    api, project, priced, settings
) -> None:
    settings.TRAINHUB_OPERATOR_API_KEYS = {"vastai": SECRET}
    project.operator_credential_providers = ["vastai"]
    project.save()
    fake = entry(assert_list(api.get(URL)), "priced-cloud")
    assert fake["credential"]["source"] == "operator" and fake["usable"] is True


# --- offers -------------------------------------------------------------------------------------


@pytest.fixture
def keyed(project, priced) -> FakeAdapter:
    credential_create(project=project, provider="vastai", name="main", secrets={"api_key": SECRET})
    return priced


def test_offers_fit_the_query_and_come_cheapest_first(api, keyed) -> None:
    body = assert_list(api.get(f"{URL}priced-cloud/offers/?min_vram_gb=24"))
    assert [o["offer_id"] for o in body] == ["a-3090", "a-4090", "a-h100", "a-h100x8"]
    first = body[0]
    assert first == {
        "object": "offer",
        "target": "priced-cloud",
        "offer_id": "a-3090",
        "gpu_name": "RTX 3090",
        "gpu_count": 1,
        "vram_gb": 24.0,
        "price_per_hour": 0.22,
        "spot_price_per_hour": None,
        "available": True,
        "region": "US-CA",
        "machine_id": "",
        "details": {},
    }
    assert keyed.offer_queries[-1] == {"count": 1, "min_vram_gb": 24.0}

    h100 = assert_list(api.get(f"{URL}priced-cloud/offers/?gpu=*h100*&count=2"))
    assert [(o["offer_id"], o["available"]) for o in h100] == [("a-h100x8", False)]


def test_offers_are_cached_briefly(api, keyed) -> None:
    api.get(f"{URL}priced-cloud/offers/")
    api.get(f"{URL}priced-cloud/offers/")
    assert len(keyed.offer_queries) == 1


@pytest.mark.parametrize(
    ("query", "param"),
    [
        ("count=two", "count"),
        ("min_vram_gb=big", "min_vram_gb"),
        ("count=-1", "gpu.count"),
        ("min_vram_gb=0", "gpu.min_vram_gb"),
    ],
)
def test_bad_offer_queries_are_400s_naming_the_parameter(api, keyed, query, param) -> None:
    assert_error(api.get(f"{URL}priced-cloud/offers/?{query}"), 400, param=param)


def test_offers_of_an_unknown_or_unpriced_target_are_404(api, keyed) -> None:
    assert_error(api.get(f"{URL}nope/offers/"), 404, code="target_not_found")
    body = assert_error(api.get(f"{URL}local/offers/"), 404, code="target_not_found")
    assert "priced-cloud" in body["message"]


def test_offers_without_a_credential_say_what_is_missing(api, priced) -> None:
    body = assert_error(api.get(f"{URL}priced-cloud/offers/"), 400, code="missing_credentials")
    assert "'vastai' credential" in body["message"]


def test_a_provider_error_is_a_502_naming_the_provider(api, keyed, monkeypatch) -> None:
    def fail(gpu):
        raise TransientProviderError("priced-cloud POST /bundles/ returned HTTP 503")

    monkeypatch.setattr(keyed, "offers", fail)
    body = assert_error(api.get(f"{URL}priced-cloud/offers/"), 502, code="provider_error")
    assert body["message"] == (
        "priced-cloud did not answer for its offers: priced-cloud POST /bundles/ returned HTTP 503"
    )
    assert SECRET not in str(body)


def test_providers_need_authentication(client) -> None:
    assert client.get(URL).status_code == 401


def test_an_unreachable_provider_does_not_hold_up_the_list(
    api, project, settings, monkeypatch
) -> None:
    """The real Lambda adapter, its API on a closed loopback port: refused connections are
    retried with backoff for seconds. The list answers within its wait, the key unchecked;
    the verdict, cached when the check ends, is shown by a later call."""
    settings.LAMBDA_API_URL = "http://127.0.0.1:9"
    monkeypatch.setattr(offers, "VERIFY_WAIT_SECONDS", 0.5)
    credential_create(project=project, provider="lambda", name="main", secrets={"api_key": SECRET})

    started = time.monotonic()
    first = entry(assert_list(api.get(URL)), "lambda")
    assert time.monotonic() - started < 3
    assert first["credential"] == {"source": "project", "verified": None, "error": None}

    deadline = time.monotonic() + 30
    while (later := entry(assert_list(api.get(URL)), "lambda"))["credential"]["verified"] is None:
        assert time.monotonic() < deadline, "the check never ended"
        time.sleep(0.5)
    assert later["credential"]["verified"] is False
    assert "no connection" in later["credential"]["error"]
