"""Vast.ai (``vastai``): a marketplace of single machines ("asks"), one rented per attempt and
driven over direct SSH by the control plane (``providers.ssh``). REST at ``console.vast.ai``,
Bearer auth: v0 (``/api/v0``) for everything but the instance list, which is v1.

What Vast's current API says (docs.vast.ai API reference and the vast-cli source, read
2026-11): the v0 list ``GET /api/v0/instances/`` is deprecated, and accounts created after
2026-06-02 get 410 from it. Its replacement ``GET /api/v1/instances/`` pages: at most 25 rows
a page, ``order_by`` and ``select_filters`` as JSON query arguments, the answer's
``next_token`` passed back as ``after_token`` until none comes; without ``select_cols`` each
row is the full instance object the v0 list gave. A search filter is ``{field: {op: value}}``
with ``eq, neq, gt, gte, lt, lte, in, notin``. Renting an ask with a ``price`` (USD per hour
for the whole machine) makes the instance interruptible: a bid, which must be at least the
ask's ``min_bid``; when a higher bid (or the host's own job) takes the machine back, Vast stops
the instance (``cur_state``, ``intended_status`` and ``next_state`` all "stopped") and it stays
stopped, billing its disk, until destroyed. A bid that is already too low may create the
instance stopped and answer with an error that still names it.

- offers: ``POST /bundles/`` with a filter body (rentable, unrented, verified, direct SSH
  ports, reliability, CUDA, bandwidth, at least the job's GPU count, VRAM, disk), cheapest
  first. A job GPU name without wildcards is sent as ``gpu_name in [...]`` (its spelling and
  upper case, underscores as spaces), so Vast searches that card rather than trainhub picking
  it out of the 64 cheapest asks of every card; a glob is matched here only. An ask's
  ``spot_price_per_hour`` is the bid trainhub would place: ``min_bid`` plus ``api.BID_MARGIN``
  (5 %), rounded up to a tenth of a cent; None where that is not below on demand. ``min_bid``
  is read as the whole machine's $/h, the unit of the create's and the change-bid's ``price``
  (UNCERTAIN for multi-GPU asks: a host sets its minimum per GPU). A bid Vast finds too low
  is refused with ``invalid_price`` (the minimum moved since the listing): whatever it left is
  destroyed and the offer counts as having no capacity, so the next one is tried.
- launch: rents exactly ``request.offer``. The instance list first: an instance labelled with
  the attempt's name is a create whose answer was lost, and is reused. Otherwise
  ``PUT /asks/{offer}/``, sent once (it rents a machine; Vast has no idempotency key, the label
  is ours); with ``request.capacity`` SPOT it carries ``price``, the offer's spot price (an
  interruptible instance). The ssh runtypes replace the image entrypoint, so the attempt's key
  is installed by ``onstart``; it is also attached with ``POST /instances/{id}/ssh/`` as a best
  effort. A create that failed yet names a ``new_contract`` left an instance behind (a bid too
  low creates it stopped): that instance is destroyed before the error is raised.
- poll: one paged list for every handle. An interruptible instance (``is_bid``) that Vast
  stopped is FAILED with ``error_code`` "preempted". Stopped, frozen, exited, unknown and
  offline on demand are LOST: we never stop or freeze an instance, and none of them turns into
  running while the disk keeps billing. Running with ``ports["22/tcp"]`` carries the SSH
  address.
- cancel: ``DELETE /instances/{id}/`` (destroy). Never stop: a stopped instance bills its
  disk. 404 is success.

This module is the adapter (the calls and their order); what it reads and sends is beside it:
``api`` (limits, units, the bid), ``offers`` (asks as Offers), ``states`` (the status map) and
``refusals`` (Vast's error answers).
"""

from __future__ import annotations

import copy
import json
import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

from providers.base import (
    MACHINE_PREFIX,
    CapacityType,
    Handle,
    LaunchRequest,
    Offer,
    RemoteState,
    gpu_name_matches,
)
from providers.errors import (
    InstanceNotFound,
    PermanentProviderError,
    ProviderError,
    TransientProviderError,
)
from providers.http import ProviderHTTP
from providers.ratelimit import shared_limiter
from providers.vastai.api import (
    DEFAULT_URL,
    MIB_IN_GB,
    RATE_LIMITS,
    SEARCH_LIMIT,
    TARGET,
    V1_PAGE_LIMIT,
    v1_url,
)
from providers.vastai.offers import exact_gpu_names, gpu_count, offer_from_ask
from providers.vastai.refusals import GONE_CODES, create_failure, error_code, refusal, said
from providers.vastai.states import STATUS_MAP, instance_state

__all__ = [
    "DEFAULT_URL",
    "MIB_IN_GB",
    "ONSTART",
    "RATE_LIMITS",
    "SEARCH_LIMIT",
    "STATUS_MAP",
    "TARGET",
    "V1_PAGE_LIMIT",
    "VastAI",
    "from_settings",
    "instance_state",
]

logger = logging.getLogger(__name__)
# Appends the attempt's key (passed in env, so no quoting) once to root's authorized_keys.
ONSTART = " && ".join(
    (
        "mkdir -p /root/.ssh",
        "chmod 700 /root/.ssh",
        "touch /root/.ssh/authorized_keys",
        '{ [ -z "$TRAINHUB_SSH_PUBLIC_KEY" ]'
        ' || grep -qxF "$TRAINHUB_SSH_PUBLIC_KEY" /root/.ssh/authorized_keys'
        " || printf '%s\\n' \"$TRAINHUB_SSH_PUBLIC_KEY\" >> /root/.ssh/authorized_keys; }",
        "chmod 600 /root/.ssh/authorized_keys",
    )
)


class VastAI:
    """The adapter for one Vast.ai API key."""

    def __init__(
        self,
        *,
        api_key: str,
        http: ProviderHTTP,
        image: str,
        disk_gb: int = 80,
        min_reliability: float = 0.98,
        min_cuda: float = 12.8,
        min_inet_down_mbps: int = 200,
        verified_only: bool = True,
    ) -> None:
        self._key = api_key
        self._http = http
        # The same client (limiter, retries, timeouts, sessions) at the v1 root.
        self._http_v1 = copy.copy(http)
        self._http_v1.base_url = v1_url(http.base_url)
        self._image = image
        self._disk_gb = disk_gb
        self._min_reliability = min_reliability
        self._min_cuda = min_cuda
        self._min_inet_down = min_inet_down_mbps
        self._verified_only = verified_only

    # --- offers -----------------------------------------------------------------------------

    def offers(self, gpu: Mapping[str, object]) -> list[Offer]:
        body = self._http.call(
            "POST",
            "/bundles/",
            key=self._key,
            json=self.search_body(gpu),
            idempotent=True,  # a search rents nothing: a 5xx may be retried
            bucket="search",
        )
        raw = body.get("offers") if isinstance(body, dict) else None
        pattern = str(gpu.get("name") or "")
        out = [
            offer_from_ask(ask)
            for ask in raw or []
            if isinstance(ask, dict)
            and ask.get("id") is not None
            and (not pattern or gpu_name_matches(pattern, str(ask.get("gpu_name", ""))))
        ]
        return sorted(out, key=lambda o: o.price_per_hour)

    def search_body(self, gpu: Mapping[str, object]) -> dict[str, Any]:
        """The ``POST /bundles/`` filter for the job's ``gpu`` needs."""
        query: dict[str, Any] = {
            "rentable": {"eq": True},
            "rented": {"eq": False},
            "external": {"eq": False},
            "direct_port_count": {"gte": 1},  # ssh_direct needs a port on the host
            "reliability2": {"gte": self._min_reliability},
            "cuda_max_good": {"gte": self._min_cuda},
            "inet_down": {"gte": self._min_inet_down},
            # Clouds sell fixed counts per machine: more GPUs than asked still fit (placement
            # re-checks, and sorts by price).
            "num_gpus": {"gte": gpu_count(gpu)},
            "disk_space": {"gte": self._disk_gb},  # we are billed for the disk we ask for
        }
        if self._verified_only:
            query["verified"] = {"eq": True}
        names = exact_gpu_names(str(gpu.get("name") or ""))
        if names:
            query["gpu_name"] = {"in": names}
        if gpu.get("min_vram_gb"):
            # MiB per GPU, rounded down: placement checks the exact figure again.
            query["gpu_ram"] = {"gte": math.floor(float(str(gpu["min_vram_gb"])) / MIB_IN_GB)}
        query.update(order=[["dph_total", "asc"]], type="ondemand", limit=SEARCH_LIMIT)
        return query

    # --- launch -----------------------------------------------------------------------------

    def launch(self, request: LaunchRequest) -> Handle:
        offer = request.offer
        if offer is None:
            raise PermanentProviderError(
                f"{request.name}: a Vast.ai launch rents one marketplace offer, and none was "
                "chosen (LaunchRequest.offer is empty); place the job on an offer first",
                provider=TARGET,
            )
        if offer.target != TARGET:
            raise PermanentProviderError(
                f"{request.name}: offer {offer.offer_id} belongs to target {offer.target!r}, "
                f"not {TARGET!r}",
                provider=TARGET,
            )
        existing = self._find(request.name)
        if existing is not None:
            return Handle(instance_id=str(existing["id"]), name=request.name)
        instance_id = self._create(offer.offer_id, request)
        self._attach_key(instance_id, request.ssh_public_key)
        return Handle(instance_id=instance_id, name=request.name)

    def create_body(self, request: LaunchRequest) -> dict[str, Any]:
        """The ``PUT /asks/{offer}/`` body: a container with direct SSH, on demand, or
        interruptible at the offer's spot price (a bid) when ``request.capacity`` is SPOT."""
        body: dict[str, Any] = {
            "client_id": "me",
            "image": self._image,
            "disk": self._disk_gb,
            "label": request.name,  # how a lost create and the reconciler find it again
            "runtype": "ssh_direct",
            "onstart": ONSTART,
            "env": {"TRAINHUB_SSH_PUBLIC_KEY": request.ssh_public_key},
            # Fail now rather than leave an instance waiting for the machine to free up.
            "cancel_unavail": True,
        }
        if request.capacity is CapacityType.SPOT:
            price = request.offer.spot_price_per_hour if request.offer else None
            if price is None:
                raise PermanentProviderError(
                    f"{request.name}: spot capacity was asked on a Vast.ai offer without a bid "
                    "price (Offer.spot_price_per_hour); place it on demand or on another offer",
                    provider=TARGET,
                )
            body["price"] = price  # a bid, USD per hour for the machine: interruptible
        return body

    def _create(self, offer_id: str, request: LaunchRequest) -> str:
        what = f"Vast.ai offer {offer_id}"
        try:
            answer = self._http.call(
                "PUT",
                f"/asks/{offer_id}/",
                key=self._key,
                json=self.create_body(request),
                idempotent=False,  # PUT, but it rents a machine: never sent twice
                bucket="create",
            )
        except ProviderError as exc:
            self._destroy_left_behind(exc.body, what)
            raise create_failure(exc, offer_id) from None
        body = answer if isinstance(answer, dict) else {}
        new_contract = body.get("new_contract")
        if body.get("success") is False:
            self._destroy_left_behind(body, what)
            raise refusal(body, offer_id)
        if new_contract is None:
            # Vast may have rented something it did not name: the retry looks by label.
            raise TransientProviderError(
                f"{what}: the create answered without an instance id ({str(answer)[:200]})",
                provider=TARGET,
                maybe_applied=True,
            )
        return str(new_contract)

    def _destroy_left_behind(self, body: object, what: str) -> None:
        """A failed create that still names ``new_contract`` made an instance (e.g. stopped,
        outbid at birth): destroy it, or it bills its disk with nobody to see it."""
        left = body.get("new_contract") if isinstance(body, dict) else None
        if left is None:
            return
        logger.warning("%s: the create failed but left instance %s; destroying it", what, left)
        try:
            self._destroy(str(left))
        except ProviderError as exc:
            # Still there: the caller's retry finds it by label, polls it LOST and cancels it.
            raise TransientProviderError(
                f"{what}: the create failed and left instance {left}, which could not be "
                f"destroyed yet ({exc.message})",
                provider=TARGET,
                maybe_applied=True,
            ) from None

    def _attach_key(self, instance_id: str, public_key: str) -> None:
        """Best effort: the onstart installs the key too, and the id must reach the caller
        (who persists it) whatever happens here."""
        if not public_key:
            return
        try:
            self._http.call(
                "POST",
                f"/instances/{instance_id}/ssh/",
                key=self._key,
                json={"ssh_key": public_key},
                bucket="attach",
            )
        except ProviderError as exc:
            logger.warning(
                "Vast.ai instance %s: attaching the SSH key failed (%s); relying on onstart",
                instance_id,
                exc.message,
            )

    # --- poll, cancel, list -----------------------------------------------------------------

    def poll(self, handles: Sequence[Handle]) -> dict[str, RemoteState]:
        if not handles:
            return {}
        instances = {str(i["id"]): i for i in self._list()}
        return {h.instance_id: instance_state(instances.get(h.instance_id)) for h in handles}

    def cancel(self, handle: Handle) -> None:
        self._destroy(handle.instance_id)

    def list_instances(self) -> list[Handle]:
        return [
            Handle(instance_id=str(i["id"]), name=str(i["label"]))
            for i in self._list()
            if str(i.get("label") or "").startswith(MACHINE_PREFIX)
        ]

    def _destroy(self, instance_id: str) -> None:
        try:
            answer = self._http.call(
                "DELETE", f"/instances/{instance_id}/", key=self._key, bucket="destroy"
            )
        except InstanceNotFound:
            return  # destroyed already: nothing bills
        if isinstance(answer, dict) and answer.get("success") is False:
            code = error_code(answer)
            if code in GONE_CODES:
                return
            # DELETE is idempotent: a later cancel may succeed.
            raise TransientProviderError(
                f"Vast.ai did not destroy instance {instance_id}: {said(answer)}",
                provider=TARGET,
                code=code,
                body=answer,
            )

    def _list(self, filters: Mapping[str, object] | None = None) -> list[dict[str, Any]]:
        """Every instance of the account (``filters``: those Vast selects with them):
        ``GET /api/v1/instances/``, page by page (the v0 list answers 410 to accounts created
        after 2026-06-02). A page that fails fails the whole list: a partial one would make the
        missing instances look LOST."""
        params: dict[str, Any] = {
            "select_filters": json.dumps(dict(filters or {})),
            "order_by": json.dumps([{"col": "id", "dir": "asc"}]),
            "limit": V1_PAGE_LIMIT,
        }
        out: dict[str, dict[str, Any]] = {}  # by id: a row a later page repeats counts once
        seen: set[str] = set()
        while True:
            try:
                body = self._http_v1.call(
                    "GET", "/instances/", key=self._key, params=params, bucket="list"
                )
            except InstanceNotFound as exc:
                raise PermanentProviderError(
                    f"Vast.ai refused to list instances ({exc.message}); check VAST_API_URL "
                    "and that the account's key may read its instances",
                    provider=TARGET,
                    status=exc.status,
                    code=exc.code,
                    body=exc.body,
                ) from None
            if not isinstance(body, dict) or not isinstance(body.get("instances"), list):
                # Never read as "no instances": every attempt would be declared LOST.
                raise TransientProviderError(
                    "Vast.ai GET /api/v1/instances/ answered without an instances list",
                    provider=TARGET,
                )
            for row in body["instances"]:
                if isinstance(row, dict) and row.get("id") is not None:
                    out.setdefault(str(row["id"]), row)
            token = str(body.get("next_token") or "")
            if not token or token in seen:  # a repeated token would page forever
                return list(out.values())
            seen.add(token)
            params["after_token"] = token

    def _find(self, name: str) -> dict[str, Any] | None:
        # Vast selects by label (one page, not the whole account); the label is checked here too.
        labelled = self._list({"label": {"in": [name]}})
        return next((i for i in labelled if i.get("label") == name), None)


def from_settings(secrets: Mapping[str, str]) -> VastAI:
    from django.conf import settings

    key = secrets["api_key"]
    return VastAI(
        api_key=key,
        # Vast limits per identity (token, user, IP): one set of buckets per key.
        http=ProviderHTTP(
            provider=TARGET,
            base_url=settings.VAST_API_URL,
            limiter=shared_limiter(TARGET, RATE_LIMITS, api_key=key),
        ),
        image=settings.VAST_IMAGE,
        disk_gb=settings.VAST_DISK_GB,
        min_reliability=settings.VAST_MIN_RELIABILITY,
        min_cuda=settings.VAST_MIN_CUDA,
        min_inet_down_mbps=settings.VAST_MIN_INET_DOWN_MBPS,
        verified_only=settings.VAST_VERIFIED_ONLY,
    )
