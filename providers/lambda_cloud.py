"""Lambda Cloud on-demand instances (``lambda``, API v1): one VM per attempt, the executor
driven over SSH as ``ubuntu`` by the control plane (``providers.ssh``). Every answer is
``{"data": ...}``; errors are ``{"error": {"code", "message"}}`` and are mapped by ``code``
(``ERROR_CODES``), whatever HTTP status they came with.

- offers: ``GET /instance-types`` lists every type with the regions that have capacity now;
  one available offer per (type, region), ``offer_id`` ``<type>@<region>``, and one unavailable
  offer per type with none. Lambda sells fixed GPU counts per type, so a type with more GPUs
  than asked still fits (the control plane re-checks and sorts).
- launch: rents exactly ``request.offer``. ``GET /instances`` first: an instance of this
  attempt that exists already (a launch whose answer was lost) is reused. The attempt's key is
  registered under a name derived from its hash, then ``POST /instance-operations/launch``
  (1 call per 12 s at Lambda: its own limiter bucket). Nothing is called after a launch that
  succeeded: the caller stores the id first (SkyPilot #2261 leaked instances when a list call
  after the launch hit a 429).
- poll: one ``GET /instances`` answers for every handle; one that is not listed is asked for
  by id, and LOST once Lambda no longer knows it.
- cancel: ``POST /instance-operations/terminate`` (Lambda has no stop: billing runs until
  terminate); then, best effort, our keys that no instance uses any more are deleted.

No spot, and no CPU-only types (the executor needs a GPU).
"""

from __future__ import annotations

import fnmatch
import hashlib
import logging
import re
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
    offer_misfit,
)
from providers.errors import (
    InstanceNotFound,
    InvalidCredentials,
    NoCapacity,
    PermanentProviderError,
    ProviderError,
    RateLimited,
    TransientProviderError,
)
from providers.http import ProviderHTTP
from providers.ratelimit import shared_limiter

log = logging.getLogger(__name__)

TARGET = "lambda"
DEFAULT_URL = "https://cloud.lambda.ai/api/v1"
# Lambda: about 1 request/s in general, launch 1 per 12 s; kept a little under both.
RATE_LIMITS: dict[str, tuple[int, float]] = {"default": (9, 10.0), "launch": (1, 12.5)}
SSH_PORT = 22
SSH_USER = "ubuntu"  # Lambda Stack images
KEY_PREFIX = "trainhub-"
# Only keys we named are ever deleted: an operator's own "trainhub-laptop" key is left alone.
_OUR_KEY = re.compile(rf"^{re.escape(KEY_PREFIX)}[0-9a-f]{{16}}$")

STATUS_MAP: Mapping[str, RemoteStatus] = {
    "booting": RemoteStatus.PENDING,
    "active": RemoteStatus.RUNNING,  # PENDING until it has an IP address
    # May recover; the control plane's readiness deadline and lease bound the wait.
    "unhealthy": RemoteStatus.PENDING,
    "terminating": RemoteStatus.LOST,  # unasked: someone terminated it (console, another tool)
    "terminated": RemoteStatus.LOST,
}

# Lambda's error code -> what it means to the control plane, whatever the HTTP status.
ERROR_CODES: Mapping[str, type[ProviderError]] = {
    "instance-operations/launch/insufficient-capacity": NoCapacity,
    "global/quota-exceeded": NoCapacity,
    "global/invalid-api-key": InvalidCredentials,
    "global/account-inactive": InvalidCredentials,
    "global/object-does-not-exist": InstanceNotFound,
}

# "H100 (80 GB SXM5)", "GH200 (96 GB)", "1x A10 (24 GB PCIe)": model, GB per GPU, form factor.
_GPU = re.compile(
    r"^(?:\d+x\s+)?(?P<model>[^(]*?)\s*\(\s*(?P<gb>\d+(?:\.\d+)?)\s*GB\b\s*(?P<form>[^)]*)\)",
    re.IGNORECASE,
)


def translate(exc: ProviderError) -> ProviderError:
    """The family member Lambda's error code stands for; ``exc`` itself when it adds nothing."""
    kind = ERROR_CODES.get(exc.code)
    if kind is None and exc.code.startswith("provider/") and not exc.retryable:
        kind = TransientProviderError  # an upstream failure at Lambda: usually passes
    if kind is None or isinstance(exc, kind):
        return exc  # a 429 or 5xx keeps its Retry-After and maybe_applied
    message = exc.message
    if exc.code == "global/quota-exceeded":
        message += (
            " (the Lambda account's quota is reached, not a shortage at Lambda: ask Lambda to "
            "raise it, or end other instances)"
        )
    fields: dict[str, Any] = {
        "provider": exc.provider,
        "status": exc.status,
        "code": exc.code,
        "body": exc.body,
    }
    if kind is TransientProviderError:
        applied = bool(getattr(exc, "maybe_applied", False))
        return TransientProviderError(message, maybe_applied=applied, **fields)
    return kind(message, **fields)


def parse_gpu(*descriptions: str) -> tuple[str, float]:
    """(GPU name, GB per GPU) from the first description that names the memory:
    "A100 (40 GB SXM4)" -> ("A100 SXM4", 40.0). The form factor stays in the name so a glob
    can tell SXM from PCIe. (name, 0.0) when none does."""
    for text in descriptions:
        match = _GPU.match(text.strip())
        if match:
            name = " ".join(p for p in (match["model"].strip(), match["form"].strip()) if p)
            return name, float(match["gb"])
    first = next((t.strip() for t in descriptions if t.strip()), "")
    return re.sub(r"^\d+x\s+", "", first), 0.0


def key_name(public_key: str) -> str:
    """The Lambda name of an SSH key: from the hash of its blob, so the comment does not
    matter and the same key is registered once however often an attempt is launched."""
    parts = public_key.split()
    blob = parts[1] if len(parts) > 1 else public_key.strip()
    return KEY_PREFIX + hashlib.sha256(blob.encode()).hexdigest()[:16]


def _allowed(value: str, patterns: Sequence[str]) -> bool:
    return not patterns or any(fnmatch.fnmatchcase(value, p) for p in patterns)


def _price(instance_type: object) -> float | None:
    """USD per hour; None when Lambda does not say. The cents are an integer in the schema, a
    string in the schema's own example: both are read."""
    cents = instance_type.get("price_cents_per_hour") if isinstance(instance_type, dict) else None
    try:
        return float(str(cents)) / 100
    except ValueError:
        return None


class LambdaCloud:
    """The adapter for one Lambda Cloud API key; ``instance_types`` and ``regions`` are
    allow-lists of globs (empty allows all)."""

    def __init__(
        self,
        *,
        api_key: str,
        http: ProviderHTTP,
        instance_types: Sequence[str] = (),
        regions: Sequence[str] = (),
    ) -> None:
        self._key = api_key
        self._http = http
        self._types = list(instance_types)
        self._regions = list(regions)

    # --- offers ---------------------------------------------------------------------------

    def offers(self, gpu: Mapping[str, object]) -> list[Offer]:
        types = self._call("GET", "/instance-types")
        if not isinstance(types, dict):
            raise self._malformed("GET /instance-types")
        out: list[Offer] = []
        for type_name, entry in types.items():
            itype = entry.get("instance_type") if isinstance(entry, dict) else None
            if not isinstance(itype, dict) or not _allowed(type_name, self._types):
                continue
            specs = itype.get("specs") or {}
            count = int(specs.get("gpus") or 0)
            name, vram = parse_gpu(
                str(itype.get("gpu_description") or ""), str(itype.get("description") or "")
            )
            price = _price(itype)
            if count == 0 or price is None:
                continue  # CPU-only, or no price to compare or cap
            regions = [
                str(r["name"])
                for r in entry.get("regions_with_capacity_available") or []
                if isinstance(r, dict) and r.get("name") and _allowed(str(r["name"]), self._regions)
            ]
            common: dict[str, Any] = {
                "target": TARGET,
                "gpu_name": name,
                "gpu_count": count,
                "vram_gb": vram,
                "price_per_hour": price,
                "details": {
                    "instance_type": type_name,
                    "description": itype.get("description", ""),
                    "vcpus": specs.get("vcpus"),
                    "memory_gib": specs.get("memory_gib"),
                    "storage_gib": specs.get("storage_gib"),
                },
            }
            out += [Offer(offer_id=f"{type_name}@{r}", region=r, **common) for r in regions]
            if not regions:
                out.append(Offer(offer_id=type_name, available=False, **common))
        fitting = [o for o in out if offer_misfit(gpu, o) is None]  # coarse: placement re-checks
        return sorted(fitting, key=lambda o: (o.price_per_hour, not o.available, o.offer_id))

    # --- launch ---------------------------------------------------------------------------

    def launch(self, request: LaunchRequest) -> Handle:
        offer = request.offer
        type_name, _, region = (offer.offer_id if offer else "").partition("@")
        if offer is None or offer.target != TARGET or not type_name or not region:
            got = f"{offer.target} offer {offer.offer_id!r}" if offer else "no offer"
            raise PermanentProviderError(
                "a Lambda launch rents one offer: the request must carry an available Lambda "
                f"offer '<instance type>@<region>' from offers(); it has {got}",
                provider=TARGET,
            )
        if not request.ssh_public_key:
            raise PermanentProviderError(
                "Lambda launches need the attempt's SSH public key", provider=TARGET
            )
        existing = self._find(request.name)
        if existing is not None:
            return Handle(instance_id=str(existing["id"]), name=request.name)
        key = self._ensure_key(request.ssh_public_key)
        body = {
            "region_name": region,
            "instance_type_name": type_name,
            "ssh_key_names": [key],  # Lambda takes exactly one
            "quantity": 1,  # more is refused (global/invalid-parameters)
            "name": request.name,
        }
        try:
            data = self._call("POST", "/instance-operations/launch", json=body, bucket="launch")
        except PermanentProviderError as exc:
            gone = self._key_gone(key, exc)
            if gone is None:
                raise
            raise gone from exc
        ids = data.get("instance_ids") if isinstance(data, dict) else None
        if not isinstance(ids, list):
            # A 200 we cannot read may still have rented a machine: look before launching again.
            raise TransientProviderError(
                "lambda POST /instance-operations/launch answered 200 without instance_ids",
                provider=TARGET,
                maybe_applied=True,
            )
        if not ids:
            raise NoCapacity(
                f"Lambda launched no {type_name} in {region} (no instance id came back)",
                provider=TARGET,
            )
        return Handle(instance_id=str(ids[0]), name=request.name)

    def _find(self, name: str) -> dict[str, Any] | None:
        for instance in self._instances():
            if instance.get("name") == name and instance.get("status") != "terminated":
                return instance
        return None

    def _ensure_key(self, public_key: str) -> str:
        name = key_name(public_key)
        if not any(k.get("name") == name for k in self._keys()):
            self._call("POST", "/ssh-keys", json={"name": name, "public_key": public_key})
        return name

    def _key_gone(self, name: str, refusal: ProviderError) -> TransientProviderError | None:
        """After a refused launch: a cancel elsewhere may have deleted the key between its
        registration and the launch (it looked unused then). A later try registers it again."""
        try:
            if any(k.get("name") == name for k in self._keys()):
                return None
        except ProviderError:
            return None
        return TransientProviderError(
            f"{refusal.message} (SSH key {name} was deleted meanwhile, by the key clean-up of "
            "a concurrent cancel: the launch can be tried again)",
            provider=TARGET,
            status=refusal.status,
            code=refusal.code,
            body=refusal.body,
        )

    # --- poll -----------------------------------------------------------------------------

    def poll(self, handles: Sequence[Handle]) -> dict[str, RemoteState]:
        if not handles:
            return {}
        listed = {str(i["id"]): i for i in self._instances()}
        states: dict[str, RemoteState] = {}
        for handle in handles:
            instance = listed.get(handle.instance_id)
            if instance is None:
                # Not listed: gone, or too new for the list. Lambda answers by id either way.
                try:
                    instance = self._call("GET", f"/instances/{handle.instance_id}")
                except InstanceNotFound:
                    states[handle.instance_id] = RemoteState(
                        RemoteStatus.LOST, "Lambda no longer knows this instance"
                    )
                    continue
                except (TransientProviderError, RateLimited):
                    continue  # unknown this cycle
            states[handle.instance_id] = instance_state(instance)
        return states

    # --- cancel ---------------------------------------------------------------------------

    def cancel(self, handle: Handle) -> None:
        try:
            self._call(
                "POST",
                "/instance-operations/terminate",
                json={"instance_ids": [handle.instance_id]},
                idempotent=True,  # terminating twice is harmless: retry 5xx
            )
        except InstanceNotFound:
            return  # terminated already: nothing bills
        self._remove_unused_keys()

    def _remove_unused_keys(self) -> None:
        """Best effort: a key stays while any listed instance names it (a terminating one
        included; Lambda refuses with ``ssh-keys/key-in-use`` anyway), so the key of the
        instance just terminated goes at a later cancel. A failure here never fails the
        cancel: the next one tries again."""
        try:
            in_use = {
                str(name)
                for instance in self._instances()
                if instance.get("status") != "terminated"
                for name in instance.get("ssh_key_names") or []
            }
            unused = [
                k
                for k in self._keys()
                if _OUR_KEY.match(str(k.get("name", "")))
                and k["name"] not in in_use
                and k.get("id")
            ]
        except ProviderError as exc:
            log.info("lambda: SSH key clean-up left for a later cancel: %s", exc)
            return
        for key in unused:
            try:
                self._call("DELETE", f"/ssh-keys/{key['id']}")
            except ProviderError as exc:  # ssh-keys/key-in-use: attached again meanwhile
                log.info("lambda: SSH key %s kept for now: %s", key["name"], exc)

    # --- list -----------------------------------------------------------------------------

    def list_instances(self) -> list[Handle]:
        # A terminating instance is already being stopped: terminating it again would only
        # spend the rate budget (and tell its job a misleading story).
        return [
            Handle(instance_id=str(i["id"]), name=str(i.get("name") or ""))
            for i in self._instances()
            if str(i.get("name") or "").startswith(MACHINE_PREFIX)
            and i.get("status") not in ("terminating", "terminated")
        ]

    # --- HTTP -----------------------------------------------------------------------------

    def _call(
        self,
        method: str,
        path: str,
        *,
        json: object = None,
        idempotent: bool | None = None,
        bucket: str = "default",
    ) -> Any:
        """The unwrapped ``data`` of Lambda's answer; errors mapped by Lambda's code."""
        try:
            body = self._http.call(
                method, path, key=self._key, json=json, idempotent=idempotent, bucket=bucket
            )
        except ProviderError as exc:
            mapped = translate(exc)
            if mapped is exc:
                raise
            raise mapped from exc
        return body.get("data") if isinstance(body, dict) else None

    def _instances(self) -> list[dict[str, Any]]:
        data = self._call("GET", "/instances")
        if not isinstance(data, list):
            # Never read as "no instances": every attempt would be declared LOST.
            raise self._malformed("GET /instances")
        return [i for i in data if isinstance(i, dict) and i.get("id")]

    def _keys(self) -> list[dict[str, Any]]:
        data = self._call("GET", "/ssh-keys")
        if not isinstance(data, list):
            raise self._malformed("GET /ssh-keys")  # else a second key of the same name
        return [k for k in data if isinstance(k, dict)]

    @staticmethod
    def _malformed(what: str) -> TransientProviderError:
        return TransientProviderError(
            f"lambda {what} answered without the expected data", provider=TARGET
        )


def instance_state(instance: object) -> RemoteState:
    """A Lambda instance object as a RemoteState."""
    if not isinstance(instance, dict):
        return RemoteState(RemoteStatus.PENDING, "Lambda sent no instance object")
    raw = str(instance.get("status", ""))
    status = STATUS_MAP.get(raw, RemoteStatus.PENDING)
    price = _price(instance.get("instance_type"))
    if status is RemoteStatus.LOST:
        return RemoteState(status, f"the instance is {raw}", price_per_hour=price)
    ip = instance.get("ip")
    if status is RemoteStatus.RUNNING and ip:
        address = SshAddress(host=str(ip), port=SSH_PORT, username=SSH_USER)
        return RemoteState(status, "active", ssh=address, price_per_hour=price)
    if raw == "active":
        return RemoteState(RemoteStatus.PENDING, "active, no IP address yet", price_per_hour=price)
    if raw == "unhealthy":
        message = "Lambda reports the instance unhealthy"
    else:
        message = raw or "unknown Lambda instance status"
    return RemoteState(RemoteStatus.PENDING, message, price_per_hour=price)


def from_settings(secrets: Mapping[str, str]) -> LambdaCloud:
    from django.conf import settings

    return LambdaCloud(
        api_key=secrets["api_key"],
        http=ProviderHTTP(
            provider=TARGET,
            base_url=settings.LAMBDA_API_URL,
            limiter=shared_limiter(TARGET, RATE_LIMITS),
        ),
        instance_types=settings.LAMBDA_INSTANCE_TYPES,
        regions=settings.LAMBDA_REGIONS,
    )
