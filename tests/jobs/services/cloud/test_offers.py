"""jobs.services.cloud.offers on the real database and Redis: priced offers fetched with a project's
key and cached per provider account, offers a provider refused remembered for a while, a key
checked with one cached call, and every target as a project sees it. The provider is the
scripted fake registered as a real priced target (tests/support/fakes/adapter.py); the HTTP layer over
it is tested in test_api_providers."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from jobs import tasks
from jobs.errors import InvalidRequest, NotFound, ProviderUnavailable
from jobs.models import Project
from jobs.services.accounts.projects import credential_create
from jobs.services.accounts.targets import MissingCredentials
from jobs.services.cloud import offers
from providers import registry
from providers.base import Handle
from providers.errors import InvalidCredentials, TransientProviderError
from tests.support.factories import ProjectFactory, offer_dict
from tests.support.fakes.adapter import FakeAdapter, register_fake
from trainhub.shared_redis import redis_client

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fresh_provider_state")]
SECRET = "vk_offers_secret_8a4c"


@pytest.fixture
def priced(settings) -> Iterator[FakeAdapter]:
    """A priced cloud needing a 'vastai' credential, standing in for the real Vast target
    (left out meanwhile, so no status check can reach the real API); no operator keys."""
    settings.TRAINHUB_PUBLIC_URL = "http://127.0.0.1:8000"
    settings.TRAINHUB_OPERATOR_API_KEYS = {}
    real = registry.get("vastai")
    registry.unregister("vastai")
    adapter = register_fake("priced-cloud", credential_kind="vastai", has_offers=True)
    adapter.add_offer("a-4090", 0.35, gpu="RTX 4090", vram_gb=24)
    adapter.add_offer("a-3090", 0.22, gpu="RTX 3090", vram_gb=24)
    adapter.add_offer("a-h100x8", 16.8, gpu="H100 SXM", vram_gb=80, count=8, available=False)
    adapter.add_offer("a-h100", 2.10, gpu="H100 SXM", vram_gb=80)
    yield adapter
    registry.unregister("priced-cloud")
    if real is not None:
        registry.register(real)


def keyed_project(api_key: str = SECRET) -> Project:
    project = ProjectFactory()
    credential_create(project=project, provider="vastai", name="main", secrets={"api_key": api_key})
    return project


def target(name: str = "priced-cloud") -> registry.Target:
    found = registry.get(name)
    assert found is not None
    return found


def offer_keys() -> list[str]:
    return [k.decode() for k in redis_client().scan_iter("trainhub:offers:priced-cloud:*")]


# --- a target's offers, cached per account ----------------------------------------------------


def test_a_target_without_a_price_list_has_no_offers(fake_cloud) -> None:
    assert offers.target_offers(project=ProjectFactory(), target=target("fake-cloud"), gpu={}) == []
    assert fake_cloud.secrets_seen == [] and fake_cloud.offer_queries == []


def test_offers_are_fetched_with_the_projects_key_then_served_from_the_cache(priced) -> None:
    project = keyed_project()
    gpu = {"count": 1, "min_vram_gb": 24}

    first = offers.target_offers(project=project, target=target(), gpu=gpu)
    again = offers.target_offers(project=project, target=target(), gpu=gpu)

    assert [o.offer_id for o in first] == ["a-3090", "a-4090", "a-h100", "a-h100x8"]
    assert again == first, "the cached offers are the same Offer values"
    assert priced.offer_queries == [gpu]
    assert priced.secrets_seen == [{"api_key": SECRET}]
    (key,) = offer_keys()
    assert SECRET not in key, "the cache key holds a hash of the key, never the key"
    assert 0 < redis_client().ttl(key) <= offers.OFFERS_TTL_SECONDS


def test_other_gpu_needs_are_another_question(priced) -> None:
    project = keyed_project()
    offers.target_offers(project=project, target=target(), gpu={"count": 1})
    offers.target_offers(project=project, target=target(), gpu={"count": 8})
    assert priced.offer_queries == [{"count": 1}, {"count": 8}]


def test_projects_on_one_provider_account_share_its_cache(priced, settings) -> None:
    settings.TRAINHUB_OPERATOR_API_KEYS = {"vastai": "vk_operator"}
    on_operator_key = [ProjectFactory(operator_credential_providers=["vastai"]) for _ in range(2)]
    for project in on_operator_key:
        offers.target_offers(project=project, target=target(), gpu={})
    assert len(priced.offer_queries) == 1

    offers.target_offers(project=keyed_project(), target=target(), gpu={})
    assert len(priced.offer_queries) == 2, "a project with its own key asks with it"
    assert len(offer_keys()) == 2


def test_a_provider_that_cannot_answer_raises_and_nothing_is_cached(
    priced, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = keyed_project()

    def unavailable(gpu):
        raise TransientProviderError("priced-cloud GET /bundles/ returned HTTP 503")

    with monkeypatch.context() as patch:
        patch.setattr(priced, "offers", unavailable)
        with pytest.raises(TransientProviderError):
            offers.target_offers(project=project, target=target(), gpu={})
    assert offer_keys() == []
    assert len(offers.target_offers(project=project, target=target(), gpu={})) == 4


def test_offers_without_a_key_raise_missing_credentials(priced) -> None:
    with pytest.raises(MissingCredentials):
        offers.target_offers(project=ProjectFactory(), target=target(), gpu={})
    assert priced.offer_queries == []


def test_offers_are_cached_briefly_per_account(clouds, make_job, project) -> None:
    cloud = clouds["cheap-cloud"]
    cloud.add_offer("c1", 5.0)
    job = make_job(target="cheap-cloud", max_price_per_hour=1)
    tasks.place_job(job.pk)
    tasks.place_job(job.pk)
    assert len(cloud.offer_queries) == 1
    target = registry.get("cheap-cloud")
    assert offers.target_offers(project=project, target=target, gpu={}) == cloud.offer_list
    ttl = max(redis_client().ttl(k) for k in redis_client().keys("trainhub:offers:cheap-cloud:*"))
    assert 0 < ttl <= offers.OFFERS_TTL_SECONDS


# --- refused offers ---------------------------------------------------------------------------


def test_a_refused_offer_is_remembered_with_its_reason_for_a_while(priced) -> None:
    refused, other = priced.offer_list[0], priced.offer_list[1]
    offers.offer_refused(refused, "no capacity: offer a-4090 has no machine free")

    assert offers.refused_reasons([refused, other]) == {
        ("priced-cloud", "a-4090"): "no capacity: offer a-4090 has no machine free"
    }
    ttl = redis_client().ttl("trainhub:offers:refused:priced-cloud:a-4090")
    assert 0 < ttl <= offers.REFUSED_TTL_SECONDS


def test_an_offer_stored_on_an_attempt_is_refused_the_same_way(priced) -> None:
    stored = offer_dict(target="priced-cloud", offer_id="a-3090")  # as on JobAttempt.offer
    offers.offer_refused(stored, "billed $0.40/h, above the cap " + "x" * 400)
    (reason,) = offers.refused_reasons(priced.offer_list).values()
    assert reason.startswith("billed $0.40/h") and len(reason) == 300


def test_no_offers_have_no_refusals() -> None:
    assert offers.refused_reasons([]) == {}


# --- checking a key ---------------------------------------------------------------------------


def test_a_working_key_is_checked_once_then_cached(priced, monkeypatch) -> None:
    calls: list[str] = []

    def list_instances() -> list[Handle]:
        calls.append("list")
        return []

    monkeypatch.setattr(priced, "list_instances", list_instances)
    project = keyed_project()
    assert offers.credential_check(project=project, target=target()) == ""
    assert offers.credential_check(project=project, target=target()) == ""
    assert calls == ["list"]
    key = next(redis_client().scan_iter("trainhub:offers:verified:priced-cloud:*"))
    assert 0 < redis_client().ttl(key) <= offers.VERIFY_TTL_SECONDS


def test_a_refused_key_is_reported_in_the_providers_words(priced, monkeypatch) -> None:
    def refuse() -> list[Handle]:
        raise InvalidCredentials("priced-cloud GET /instances returned HTTP 401: bad key")

    monkeypatch.setattr(priced, "list_instances", refuse)
    verdict = offers.credential_check(project=keyed_project(), target=target())
    assert verdict == "priced-cloud GET /instances returned HTTP 401: bad key"


def test_no_key_is_not_checked(priced) -> None:
    assert offers.credential_check(project=ProjectFactory(), target=target()) is None
    assert priced.secrets_seen == []


# --- every target as a project sees it --------------------------------------------------------


def test_every_target_is_listed_with_its_problem_and_its_key(priced, settings) -> None:
    settings.RUNPOD_ENDPOINT_ID = ""
    statuses = {s.target.name: s for s in offers.provider_statuses(project=keyed_project())}

    assert sorted(statuses) == registry.names()
    fake = statuses["priced-cloud"]
    assert (fake.problem, fake.credential_source, fake.credential_error) == ("", "project", "")
    own_fleet = statuses["local"]
    assert (own_fleet.problem, own_fleet.credential_source, own_fleet.credential_error) == (
        "",
        None,
        None,
    )
    serverless = statuses["runpod-serverless"]
    assert "RUNPOD_ENDPOINT_ID" in serverless.problem and serverless.credential_source is None


def test_statuses_without_verifying_make_no_provider_call(priced) -> None:
    (fake,) = [
        s
        for s in offers.provider_statuses(project=keyed_project(), verify=False)
        if s.target.name == "priced-cloud"
    ]
    assert (fake.credential_source, fake.credential_error) == ("project", None)
    assert priced.secrets_seen == []


# --- the offers API's answer ------------------------------------------------------------------


def test_offers_that_fit_come_available_first_then_cheapest_first(priced) -> None:
    found = offers.offers_for(
        project=keyed_project(), target_name="priced-cloud", gpu={"count": 1, "min_vram_gb": 40}
    )
    assert [(o.offer_id, o.available) for o in found] == [("a-h100", True), ("a-h100x8", False)]

    eight = offers.offers_for(project=keyed_project(), target_name="priced-cloud", gpu={"count": 8})
    assert [o.offer_id for o in eight] == ["a-h100x8"]


@pytest.mark.parametrize("name", ["no-such-cloud", "local", "fake-cloud"])
def test_only_priced_targets_have_offers(priced, fake_cloud, name) -> None:
    with pytest.raises(NotFound) as info:
        offers.offers_for(project=keyed_project(), target_name=name, gpu={})
    assert (info.value.code, info.value.param) == ("target_not_found", "target")
    assert "targets with offers:" in info.value.message and "priced-cloud" in info.value.message


def test_offers_of_a_target_the_project_cannot_use_say_why(priced) -> None:
    with pytest.raises(InvalidRequest) as info:
        offers.offers_for(project=ProjectFactory(), target_name="priced-cloud", gpu={})
    assert (info.value.code, info.value.param) == ("missing_credentials", "target")
    assert priced.offer_queries == []


def test_a_provider_error_is_unavailable_naming_the_provider_not_the_key(
    priced, monkeypatch
) -> None:
    def fail(gpu):
        raise TransientProviderError("priced-cloud POST /bundles/ returned HTTP 503")

    monkeypatch.setattr(priced, "offers", fail)
    with pytest.raises(ProviderUnavailable) as info:
        offers.offers_for(project=keyed_project(), target_name="priced-cloud", gpu={})
    assert info.value.code == "provider_error"
    assert info.value.message == (
        "priced-cloud did not answer for its offers: priced-cloud POST /bundles/ returned HTTP 503"
    )


# --- the question the provider is asked -------------------------------------------------------


@pytest.mark.parametrize(
    ("gpu", "question"),
    [
        ({}, {"count": 1}),
        ({"count": 0}, {"count": 1}),
        ({"count": 8, "name": "*H100*"}, {"count": 8}),
        ({"count": 1, "min_vram_gb": 7.9}, {"count": 1}),
        ({"count": 1, "min_vram_gb": 24}, {"count": 1, "min_vram_gb": 24}),
        ({"count": 1, "min_vram_gb": 31.99}, {"count": 1, "min_vram_gb": 24}),
        ({"count": 2, "min_vram_gb": 70}, {"count": 2, "min_vram_gb": 48}),
        ({"count": 1, "min_vram_gb": 4096}, {"count": 1, "min_vram_gb": 141}),
    ],
)
def test_the_provider_is_asked_about_the_machine_shape_only(gpu, question) -> None:
    assert offers.provider_question(gpu) == question


def test_gpu_names_and_vram_within_a_class_share_one_provider_call(priced) -> None:
    project = keyed_project()
    for name in ("*4090*", "*3090*", "*H100*", "no-such-gpu"):
        for vram in (24, 30, 31.5):
            offers.target_offers(
                project=project,
                target=target(),
                gpu={"count": 1, "name": name, "min_vram_gb": vram},
            )
    assert priced.offer_queries == [{"count": 1, "min_vram_gb": 24}]
    assert len(offer_keys()) == 1

    found = offers.offers_for(
        project=project, target_name="priced-cloud", gpu={"count": 1, "name": "*3090*"}
    )
    assert [o.offer_id for o in found] == ["a-3090"], "the exact needs filter the cached list"
