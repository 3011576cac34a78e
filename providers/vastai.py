"""Vast.ai (``vastai``): a marketplace of single machines ("asks"), one rented per attempt and
driven over direct SSH by the control plane (``providers.ssh``). REST v0 at
``console.vast.ai/api/v0``, Bearer auth.

- offers: ``POST /bundles/`` with a filter body (rentable, unrented, verified, direct SSH
  ports, reliability, CUDA, bandwidth, GPU count, VRAM, disk), cheapest first. The GPU name
  glob is matched here, not by Vast: a search answers at most 64 offers, ordered by price.
- launch: rents exactly ``request.offer``. ``GET /instances/`` first: an instance labelled with
  the attempt's name is a create whose answer was lost, and is reused. Otherwise
  ``PUT /asks/{offer}/``, sent once (it rents a machine; Vast has no idempotency key, the label
  is ours). The ssh runtypes replace the image entrypoint, so the attempt's key is installed
  by ``onstart``; it is also attached with ``POST /instances/{id}/ssh/`` as a best effort.
  A create that failed yet names a ``new_contract`` left an instance behind (a bid too low
  creates it stopped): that instance is destroyed before the error is raised.
- poll: one ``GET /instances/`` for every handle. Stopped, frozen, exited, unknown and offline
  are LOST: we never stop or freeze an instance, and none of them turns into running while
  the disk keeps billing. Running with ``ports["22/tcp"]`` carries the SSH address.
- cancel: ``DELETE /instances/{id}/`` (destroy). Never stop: a stopped instance bills its
  disk. 404 is success.

Bids (interruptible instances) are not offered: ``price`` is never sent.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

from providers.base import (
    MACHINE_PREFIX,
    Handle,
    LaunchRequest,
    Offer,
    RemoteState,
    RemoteStatus,
    SshAddress,
    gpu_name_matches,
)
from providers.errors import (
    InstanceNotFound,
    NoCapacity,
    PermanentProviderError,
    ProviderError,
    TransientProviderError,
)
from providers.http import ProviderHTTP
from providers.ratelimit import shared_limiter

logger = logging.getLogger(__name__)

TARGET = "vastai"
DEFAULT_URL = "https://console.vast.ai/api/v0"
SEARCH_LIMIT = 64  # the most one search answers
# Vast's gpu_ram is documented as MB but is nvidia-smi's MiB (an RTX 4090 reports 24564, an
# "80GB" H100 81559, a "48GB" L40S 46068); cards are sold in decimal GB.
MIB_IN_GB = 2**20 / 1e9

# Vast enforces a minimum interval per endpoint and identity (token + user + IP) and sends no
# Retry-After, so a call it refuses costs a backoff: space calls out here instead, shared by
# every worker. Intervals from Vast's "rate limits by endpoint" table (GET /instances/ one per
# 2 s, DELETE /instances/{id}/ one per 3 s) and the search spec (threshold 2 s), plus 10% for
# the network between our clock and theirs. The create and attach intervals are not published:
# the search's is assumed.
RATE_LIMITS: dict[str, tuple[int, float]] = {
    "search": (1, 2.2),  # POST /bundles/
    "create": (1, 2.2),  # PUT /asks/{id}/
    "attach": (1, 2.2),  # POST /instances/{id}/ssh/
    "list": (1, 2.2),  # GET /instances/ (poll, launch's look-up, list_instances)
    "destroy": (1, 3.3),  # DELETE /instances/{id}/
}

# ``actual_status``, the container's state. Vast sends null while the contract is being set up:
# ``instance_state`` reads null (and a missing field) as "".
STATUS_MAP: Mapping[str, RemoteStatus] = {
    "": RemoteStatus.PENDING,  # null: provisioning
    "created": RemoteStatus.PENDING,  # container created, not started (see the OCI check)
    "loading": RemoteStatus.PENDING,  # pulling the image, starting
    "rebooting": RemoteStatus.PENDING,
    "restarting": RemoteStatus.PENDING,  # not in Vast's docs; SkyPilot sees it
    "running": RemoteStatus.RUNNING,
    # We never stop or freeze an instance: stopped means outbid or interrupted, and frozen
    # something we did not ask for. Neither resumes on its own.
    "stopped": RemoteStatus.LOST,
    "frozen": RemoteStatus.LOST,
    # These never become running, and the instance bills its disk until destroyed.
    "exited": RemoteStatus.LOST,  # the container process exited unexpectedly
    "unknown": RemoteStatus.LOST,  # no heartbeat from the host
    "offline": RemoteStatus.LOST,  # the host disconnected
}

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

_GONE_CODES = frozenset({"no_such_instance", "not_found"})
# What placement may want to show or check beyond the Offer fields.
_OFFER_DETAILS = (
    "reliability2",
    "cuda_max_good",
    "inet_down",
    "dph_base",
    "verification",
    "direct_port_count",
    "disk_space",
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
            _offer(ask)
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
            "num_gpus": {"eq": _gpu_count(gpu)},
            "disk_space": {"gte": self._disk_gb},  # we are billed for the disk we ask for
        }
        if self._verified_only:
            query["verified"] = {"eq": True}
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
        """The ``PUT /asks/{offer}/`` body: an on-demand container with direct SSH."""
        return {
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
            raise _create_failure(exc, offer_id) from None
        body = answer if isinstance(answer, dict) else {}
        new_contract = body.get("new_contract")
        if body.get("success") is False:
            self._destroy_left_behind(body, what)
            raise _refusal(body, offer_id)
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
            code = _code(answer)
            if code in _GONE_CODES:
                return
            # DELETE is idempotent: a later cancel may succeed.
            raise TransientProviderError(
                f"Vast.ai did not destroy instance {instance_id}: {_said(answer)}",
                provider=TARGET,
                code=code,
                body=answer,
            )

    def _list(self) -> list[dict[str, Any]]:
        try:
            body = self._http.call("GET", "/instances/", key=self._key, bucket="list")
        except InstanceNotFound as exc:
            # Vast answers 410 here for accounts created after its v0 list was deprecated.
            raise PermanentProviderError(
                f"Vast.ai refused to list instances ({exc.message}); this account may need "
                "the v1 API (GET /api/v1/instances/), which trainhub does not use yet",
                provider=TARGET,
                status=exc.status,
                code=exc.code,
                body=exc.body,
            ) from None
        instances = body.get("instances") if isinstance(body, dict) else None
        return [i for i in instances or [] if isinstance(i, dict) and i.get("id") is not None]

    def _find(self, name: str) -> dict[str, Any] | None:
        return next((i for i in self._list() if i.get("label") == name), None)


def instance_state(instance: Mapping[str, Any] | None) -> RemoteState:
    """An instance of ``GET /instances/`` (None: not listed) as a RemoteState."""
    if instance is None:
        return RemoteState(RemoteStatus.LOST, "Vast no longer lists this instance")
    raw = str(instance.get("actual_status") or "")
    price = _float(instance.get("dph_total"))
    status_msg = str(instance.get("status_msg") or "").strip()
    states = {instance.get(k) for k in ("cur_state", "intended_status", "next_state")}
    if states == {"stopped"}:
        return RemoteState(
            RemoteStatus.LOST,
            f"outbid or interrupted: Vast stopped the instance (actual_status {raw or 'null'})",
            price_per_hour=price,
        )
    if raw == "created" and _is_error(status_msg):
        # The container could not start (e.g. "OCI runtime create failed"): it never will.
        return RemoteState(
            RemoteStatus.LOST, f"the container failed to start: {status_msg}", price_per_hour=price
        )
    status = STATUS_MAP.get(raw, RemoteStatus.PENDING)
    if status is RemoteStatus.LOST:
        detail = f": {status_msg}" if status_msg else ""
        return RemoteState(status, f"the instance is {raw}{detail}", price_per_hour=price)
    if status is RemoteStatus.RUNNING:
        address = _ssh_address(instance)
        if address is not None:
            return RemoteState(status, "running", ssh=address, price_per_hour=price)
        return RemoteState(
            RemoteStatus.PENDING, "running, without a direct SSH port yet", price_per_hour=price
        )
    return RemoteState(status, raw or "provisioning", price_per_hour=price)


def _ssh_address(instance: Mapping[str, Any]) -> SshAddress | None:
    """``ssh_direct``: root at the host's public address, on the port mapped to 22."""
    host = str(instance.get("public_ipaddr") or "").strip()
    ports = instance.get("ports")
    bindings = ports.get("22/tcp") if isinstance(ports, dict) else None
    if not host or not isinstance(bindings, list) or not bindings:
        return None
    first = bindings[0]
    port = first.get("HostPort") if isinstance(first, dict) else None
    if port is None or not str(port).isdigit():
        return None
    return SshAddress(host=host, port=int(port), username="root")


def _offer(ask: Mapping[str, Any]) -> Offer:
    min_bid = _float(ask.get("min_bid"))
    return Offer(
        target=TARGET,
        offer_id=str(ask["id"]),
        gpu_name=str(ask.get("gpu_name") or ""),
        gpu_count=int(ask.get("num_gpus") or 1),
        vram_gb=float(ask.get("gpu_ram") or 0) * MIB_IN_GB,  # per GPU, decimal GB as sold
        price_per_hour=float(ask.get("dph_total") or 0),  # on demand, GPU + disk + the rest
        spot_price_per_hour=min_bid,
        available=True,  # a search lists only what can be rented now
        region=str(ask.get("geolocation") or ""),
        machine_id=str(ask.get("machine_id") or ""),
        details={k: ask[k] for k in _OFFER_DETAILS if ask.get(k) is not None},
    )


def _create_failure(exc: ProviderError, offer_id: str) -> ProviderError:
    """What a refused ``PUT /asks/{id}/`` means to the caller."""
    code = _code(exc.body) or exc.code
    if code == "no_such_ask" or (isinstance(exc, InstanceNotFound) and not code):
        # 404: the offer is gone; 410: it cannot start now (cancel_unavail).
        return NoCapacity(
            f"Vast.ai offer {offer_id} is no longer available ({exc.message}); choose another",
            provider=TARGET,
            status=exc.status,
            code=code,
            body=exc.body,
        )
    if isinstance(exc, InstanceNotFound):  # a 404/410 that is not about the offer
        return PermanentProviderError(
            exc.message, provider=TARGET, status=exc.status, code=code, body=exc.body
        )
    return exc


def _refusal(body: Mapping[str, Any], offer_id: str) -> ProviderError:
    """A create answered 2xx with ``"success": false``."""
    code = _code(body)
    message = f"Vast.ai refused to rent offer {offer_id}: {_said(body)}"
    error = NoCapacity if code == "no_such_ask" else PermanentProviderError
    return error(message, provider=TARGET, code=code, body=dict(body))


def _code(body: object) -> str:
    """Vast's error code: ``error``, or a ``msg`` that is a bare code (some routes put it
    there, e.g. ``{"success": false, "msg": "no_such_ask"}``)."""
    if not isinstance(body, dict):
        return ""
    for key in ("error", "msg"):
        value = body.get(key)
        if isinstance(value, str) and value and " " not in value:
            return value
    return ""


def _said(body: Mapping[str, Any]) -> str:
    parts = [str(body[k]) for k in ("error", "msg", "message") if body.get(k)]
    return "; ".join(dict.fromkeys(parts)) or str(dict(body))[:200]


def _is_error(status_msg: str) -> bool:
    text = status_msg.lower()
    return "error" in text or "failed" in text


def _gpu_count(gpu: Mapping[str, object]) -> int:
    return max(1, int(str(gpu.get("count") or 1)))


def _float(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    try:
        return float(value)
    except ValueError:
        return None


def from_settings(secrets: Mapping[str, str]) -> VastAI:
    from django.conf import settings

    return VastAI(
        api_key=secrets["api_key"],
        http=ProviderHTTP(
            provider=TARGET,
            base_url=settings.VAST_API_URL,
            limiter=shared_limiter(TARGET, RATE_LIMITS),
        ),
        image=settings.VAST_IMAGE,
        disk_gb=settings.VAST_DISK_GB,
        min_reliability=settings.VAST_MIN_RELIABILITY,
        min_cuda=settings.VAST_MIN_CUDA,
        min_inet_down_mbps=settings.VAST_MIN_INET_DOWN_MBPS,
        verified_only=settings.VAST_VERIFIED_ONLY,
    )
