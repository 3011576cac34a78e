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

Errors: ``instance-operations/launch/insufficient-capacity`` is NoCapacity (the next offer may
have machines); ``global/quota-exceeded`` is QuotaExceeded, a permanent refusal: the quota is
the account's, so every other offer would be refused too, each try spending a 12.5 s slot of
the launch bucket. Rate limits are Lambda's per API key, so the shared limiter keeps one set of
buckets per key (``from_settings``), not one per provider.

No spot: Lambda's API v1 has no interruptible or spot instances (launch takes no such field
and instance types carry one on-demand price), so offers never carry a spot price. No CPU-only
types (the executor needs a GPU).

This module is the adapter (the calls and their order; ``poll`` reads instances through this
module's ``instance_state``, which a test replaces); what it reads and sends is beside it:
``api`` (limits, SSH login, prices), ``offers`` (instance types as Offers), ``states`` (the
status map), ``codes`` (Lambda's error codes) and ``keys`` (our SSH key names).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from providers.base import MACHINE_PREFIX, Handle, LaunchRequest, Offer, RemoteState, RemoteStatus
from providers.errors import (
    InstanceNotFound,
    NoCapacity,
    PermanentProviderError,
    ProviderError,
    RateLimited,
    TransientProviderError,
    vm_launch_target,
)
from providers.http import ProviderHTTP
from providers.lambda_cloud.api import DEFAULT_URL, RATE_LIMITS, SSH_PORT, SSH_USER, TARGET
from providers.lambda_cloud.codes import ERROR_CODES, translate
from providers.lambda_cloud.keys import KEY_PREFIX, OUR_KEY, key_name
from providers.lambda_cloud.offers import offers_from_types, parse_gpu
from providers.lambda_cloud.states import STATUS_MAP, instance_state
from providers.ratelimit import shared_limiter

__all__ = [
    "DEFAULT_URL",
    "ERROR_CODES",
    "KEY_PREFIX",
    "RATE_LIMITS",
    "SSH_PORT",
    "SSH_USER",
    "STATUS_MAP",
    "TARGET",
    "LambdaCloud",
    "from_settings",
    "instance_state",
    "key_name",
    "parse_gpu",
    "translate",
]

log = logging.getLogger(__name__)


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
        return offers_from_types(types, gpu, type_globs=self._types, region_globs=self._regions)

    # --- launch ---------------------------------------------------------------------------

    def launch(self, request: LaunchRequest) -> Handle:
        _, type_name, region = vm_launch_target(request, TARGET, "Lambda")
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
                if OUR_KEY.match(str(k.get("name", ""))) and k["name"] not in in_use and k.get("id")
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


def from_settings(secrets: Mapping[str, str]) -> LambdaCloud:
    from django.conf import settings

    key = secrets["api_key"]
    return LambdaCloud(
        api_key=key,
        # Lambda limits each API key: one set of buckets per key, shared by every worker.
        http=ProviderHTTP(
            provider=TARGET,
            base_url=settings.LAMBDA_API_URL,
            limiter=shared_limiter(TARGET, RATE_LIMITS, api_key=key),
        ),
        instance_types=settings.LAMBDA_INSTANCE_TYPES,
        regions=settings.LAMBDA_REGIONS,
    )
