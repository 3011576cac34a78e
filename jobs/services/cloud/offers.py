"""Priced offers of the cloud targets that list them, as a project sees them.

Offers are fetched with the project's key and cached in Redis for ``OFFERS_TTL_SECONDS``
(shared by every process: the API and each placement pass would otherwise call the provider
each time); the cache key holds a hash of the key, never the key. The provider is asked one
question per machine shape (``provider_question``), never the client's exact filter, so varying
a GPU name or a VRAM figure costs no provider call: callers filter the cached list (every one
checks ``offer_misfit`` against the exact needs). An offer a provider refused
(no capacity, gone, billed over the cap) is remembered for ``REFUSED_TTL_SECONDS`` so placement
tries another instead of the same one again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from collections.abc import Mapping
from concurrent import futures
from dataclasses import dataclass
from typing import Any

from jobs.errors import InvalidRequest, NotFound, ProviderUnavailable
from jobs.models import Project
from jobs.services.accounts.targets import (
    MissingCredentials,
    adapter_for,
    credential_source,
    target_problem,
    target_secrets,
)
from providers import registry
from providers.base import Offer, offer_misfit
from providers.errors import ProviderError
from trainhub.shared_redis import redis_client

log = logging.getLogger(__name__)
OFFERS_TTL_SECONDS = 30
VERIFY_TTL_SECONDS = 60
VERIFY_WAIT_SECONDS = 5.0  # how long the providers list waits for the key checks
_CHECKERS: futures.ThreadPoolExecutor | None = None  # started on first use (not at import)
REFUSED_TTL_SECONDS = 600
_PREFIX = "trainhub:offers"
# VRAM classes the provider is asked about (GB per GPU): a need is rounded down to one, so the
# answer holds every offer that may fit. Vast filters memory before its 64-offer limit, so an
# 80 GB need must not be answered from the cheapest small cards; a class per common card size
# keeps that while bounding the questions per account.
VRAM_CLASSES_GB = (8, 12, 16, 24, 32, 40, 48, 80, 141)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def provider_account(secrets: Mapping[str, str]) -> str:
    """Which provider account calls with ``secrets`` go to, as a hash (the cache is per
    account: two projects sharing the operator's key see the same offers; the reconciler
    tells whose machines it lists by it)."""
    return hashlib.sha256(json.dumps(dict(secrets), sort_keys=True).encode()).hexdigest()[:20]


def provider_question(gpu: Mapping[str, Any]) -> dict[str, Any]:
    """What the provider is asked for ``gpu`` needs: the machine's GPU count (providers sell and
    price fixed counts; 0 asks as 1, as every adapter does) and the VRAM class below the need.
    The GPU name is left out: adapters only ever filtered it on their side of the answer."""
    question: dict[str, Any] = {"count": max(1, int(gpu.get("count") or 0))}
    vram = gpu.get("min_vram_gb")
    below = [c for c in VRAM_CLASSES_GB if vram and c <= float(vram)]
    if below:
        question["min_vram_gb"] = below[-1]
    return question


def target_offers(
    *, project: Project, target: registry.Target, gpu: Mapping[str, Any]
) -> list[Offer]:
    """The target's offers for the machine shape of these GPU needs (cached; the caller checks
    each against the exact needs with ``offer_misfit``). Raises ProviderError when the provider
    cannot say, MissingCredentials when the project has no key for it."""
    if not target.has_offers:
        return []
    secrets = target_secrets(target, project)
    question = provider_question(gpu)
    shape = json.dumps(question, sort_keys=True)
    key = f"{_PREFIX}:{target.name}:{provider_account(secrets)}:{shape}"
    cached = redis_client().get(key)
    if cached is not None:
        return [Offer(**o) for o in json.loads(cached)]
    adapter: Any = adapter_for(target, project, secrets)
    offers = list(adapter.offers(question))
    payload = json.dumps([dataclasses.asdict(o) for o in offers])
    redis_client().set(key, payload, ex=OFFERS_TTL_SECONDS)
    return offers


def offer_refused(offer: Offer | Mapping[str, Any], reason: str) -> None:
    """Remember that ``offer`` was refused, so placement skips it for a while."""
    target, offer_id = _offer_key(offer)
    redis_client().set(
        f"{_PREFIX}:refused:{target}:{offer_id}", reason[:300], ex=REFUSED_TTL_SECONDS
    )


def refused_reasons(offers: list[Offer]) -> dict[tuple[str, str], str]:
    """(target, offer id) → why it was refused lately, for those of ``offers`` that were."""
    if not offers:
        return {}
    keys = [_offer_key(o) for o in offers]
    values = redis_client().mget([f"{_PREFIX}:refused:{t}:{i}" for t, i in keys])
    return {k: _text(v) for k, v in zip(keys, values, strict=True) if v is not None}


def _offer_key(offer: Offer | Mapping[str, Any]) -> tuple[str, str]:
    if isinstance(offer, Offer):
        return offer.target, offer.offer_id
    return str(offer.get("target", "")), str(offer.get("offer_id", ""))


def credential_check(*, project: Project, target: registry.Target) -> str | None:
    """'' when the target's key works (one cheap authenticated call, cached), else what the
    provider said; None when there is no key to check."""
    try:
        secrets = target_secrets(target, project)
    except MissingCredentials:
        return None
    return _verify(target, project, secrets)


def _verify(target: registry.Target, project: Project, secrets: dict[str, str]) -> str:
    """The cached verdict on ``secrets`` for ``target``, asking the provider if there is none.
    Touches no database (it runs on the checker threads too)."""
    key = f"{_PREFIX}:verified:{target.name}:{provider_account(secrets)}"
    cached = redis_client().get(key)
    if cached is not None:
        return _text(cached)
    try:
        adapter_for(target, project, secrets).list_instances()
        verdict = ""
    except ProviderError as exc:
        verdict = exc.message or type(exc).__name__
    redis_client().set(key, verdict, ex=VERIFY_TTL_SECONDS)
    return verdict


@dataclass(frozen=True)
class ProviderStatus:
    """One target as a project sees it (the providers API)."""

    target: registry.Target
    problem: str  # why the project cannot use it ('' when it can)
    credential_source: str | None  # 'project', 'operator' or None
    credential_error: str | None  # '' verified, the provider's answer, None unchecked


def provider_statuses(*, project: Project, verify: bool = True) -> list[ProviderStatus]:
    """Every registered target, whether the project can use it and whether its key works
    (checked with one cheap call per target, cached; a provider error is said, not hidden)."""
    rows, checks = [], {}
    for name in registry.names():
        target = registry.get(name)
        if target is None:
            continue
        problem = target_problem(project=project, target=target)
        kind = target.credential_kind
        source = credential_source(project=project, kind=kind) if kind else None
        rows.append((target, problem[1] if problem else "", source))
        # A target the operator has not configured has no adapter to ask (and says so).
        if verify and source is not None and target.is_cloud and not target.misconfiguration():
            secrets = target_secrets(target, project)  # read here: the checkers use no database
            checks[name] = _checkers().submit(_verify, target, project, secrets)
    # Each provider is asked at once, and the answer waits VERIFY_WAIT_SECONDS at most: a
    # provider that is slow or unreachable (retried with backoff) shows as not checked yet,
    # and its verdict, cached when it comes, is shown by a later call.
    futures.wait(checks.values(), timeout=VERIFY_WAIT_SECONDS)
    return [
        ProviderStatus(target, problem, source, _done(checks.get(target.name)))
        for target, problem, source in rows
    ]


def _checkers() -> futures.ThreadPoolExecutor:
    global _CHECKERS
    if _CHECKERS is None:
        _CHECKERS = futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="key-check")
    return _CHECKERS


def _done(check: futures.Future[str] | None) -> str | None:
    if check is None or not check.done():
        return None
    try:
        return check.result()
    except Exception:  # a bug in an adapter: say so in the log, show the key as not checked
        log.exception("checking a provider key failed")
        return None


def offers_for(*, project: Project, target_name: str, gpu: Mapping[str, Any]) -> list[Offer]:
    """The offers of one target that fit ``gpu``, cheapest first, for the offers API."""
    target = registry.get(target_name)
    if target is None or not target.has_offers:
        priced = [t.name for t in registry.priced_targets()]
        raise NotFound(
            f"No priced target {target_name!r}; targets with offers: {', '.join(priced)}.",
            code="target_not_found",
            param="target",
        )
    problem = target_problem(project=project, target=target)
    if problem is not None:
        raise InvalidRequest(problem[1], code=problem[0], param="target")
    try:
        found = target_offers(project=project, target=target, gpu=gpu)
    except ProviderError as exc:
        raise ProviderUnavailable(
            f"{target.name} did not answer for its offers: {exc.message}", code="provider_error"
        ) from None
    fitting = [o for o in found if offer_misfit(gpu, o) is None]
    return sorted(fitting, key=lambda o: (not o.available, o.price_per_hour))
