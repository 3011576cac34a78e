"""RunPod pods over REST v2 (``runpod-pod``): one pod per attempt, the executor driven over
SSH by the control plane (``providers.ssh``).

- launch: ``GET /pods?name=`` first: a pod of this attempt that exists already (a launch whose
  answer was lost) is reused, so a retried launch never rents a second pod. Otherwise
  ``POST /pods`` for each GPU type that fits the job, in order; a 400 is RunPod's answer for
  "no capacity" as well as for a rule violation, so the next type is tried, and NoCapacity
  raised when none is left. The pod exposes ``22/tcp`` and gets the attempt's public key in
  ``PUBLIC_KEY`` (RunPod images append it to ``authorized_keys``).
- poll: one ``GET /pods`` lists every pod of the account: batched, whatever the attempt count.
  A pod missing from the list, TERMINATED or EXITED unasked is LOST; RUNNING with
  ``ssh.direct`` carries the SSH address.
- cancel: ``DELETE /pods/{id}``, the only call that stops the billing (a stopped pod still
  bills its disk); 404 is success.
- offers: ``GET /catalog/gpus?include=AVAILABILITY&product=POD`` prices the configured GPU types
  that fit the job (list price per GPU per hour for the configured cloud, times the count) with
  their stock; ``launch`` of an offer then creates on exactly that GPU type. The pod's ``cost``
  (USD per hour, 0 once exited) is the rate RunPod actually bills, reported on every poll.

Spot (interruptible) pods are not offered, because REST v2 cannot rent one. Checked against
RunPod's v2 OpenAPI schema (runpod/docs ``api-reference-v2/openapi.json``, read 2026-11):
``CreatePodRequest`` has name, image, cloud, gpu {id, count, allowedCudaVersions,
minCudaVersion}, cpu, dataCenterIds, mounts, globalNetworking, startSsh, startJupyter,
templateId and the container settings, and rejects any other field (``unevaluatedProperties:
false``, a 422); the v1 ``interruptible`` flag was not carried over. The ``Pod`` object has no
interruptible flag and no bid, and the catalogue's ``GpuType.price`` has only secure,
community and serverless (no spot price). Interruptible pods remain in the GraphQL API alone
(``podRentInterruptable`` with ``bidPerGpu``), which RunPod has deprecated and plans to retire
in early 2027; REST v1's ``interruptible: true`` went with v1 (retired 2026-11-15). So offers
carry no ``spot_price_per_hour``, placement never asks for spot here, and a launch that asks
anyway (``CapacityType.SPOT``) is refused as permanent before anything is rented. If v2 gains the
field, the create body and ``pod_state`` are the two places to change: an interrupted pod
shows as EXITED without our asking, which this adapter reads as LOST today.

Rate limits: v2 limits each user (its 429 names the window and sends Retry-After), so the
shared limiter keeps one set of buckets per API key.

Kept whole (about 340 lines): the catalogue pricing and the status map are small and read
with the calls they serve.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeGuard

from providers.base import (
    MACHINE_PREFIX,
    CapacityType,
    Handle,
    LaunchRequest,
    Offer,
    RemoteState,
    RemoteStatus,
    SshAddress,
)
from providers.errors import InstanceNotFound, NoCapacity, PermanentProviderError
from providers.http import ProviderHTTP
from providers.ratelimit import shared_limiter

TARGET = "runpod-pod"
DEFAULT_URL = "https://api.runpod.io/v2"
# The clouds a pod can be created in; the catalogue prices and stocks each separately.
CLOUDS = ("SECURE", "COMMUNITY")
# Not documented for REST v2; a conservative share of the v1 REST limits.
RATE_LIMITS: dict[str, tuple[int, float]] = {"default": (90, 10.0)}

STATUS_MAP: Mapping[str, RemoteStatus] = {
    "PROVISIONING": RemoteStatus.PENDING,
    "STARTING": RemoteStatus.PENDING,
    "RUNNING": RemoteStatus.RUNNING,
    "EXITED": RemoteStatus.LOST,  # unasked: a crash, a host failure or an interruption
    "ERROR": RemoteStatus.LOST,
    "TERMINATED": RemoteStatus.LOST,
}


def gpu_candidates(gpu: Mapping[str, Any], catalog: Sequence[str]) -> list[tuple[str, int]]:
    """The ``"<gpu id>=<VRAM GB>"`` catalogue entries that satisfy the job's ``gpu`` needs,
    in the catalogue's order of preference."""
    out = []
    for entry in catalog:
        gpu_id, _, vram = entry.rpartition("=")
        if not gpu_id or not vram.isdigit():
            raise ValueError(f"RUNPOD_POD_GPU_TYPES entry {entry!r} is not '<gpu id>=<VRAM GB>'")
        if gpu.get("min_vram_gb") and int(vram) < float(gpu["min_vram_gb"]):
            continue
        if gpu.get("name") and not fnmatch.fnmatch(gpu_id.lower(), str(gpu["name"]).lower()):
            continue
        out.append((gpu_id, int(vram)))
    return out


class RunpodPods:
    """The adapter for one RunPod API key."""

    def __init__(
        self,
        *,
        api_key: str,
        http: ProviderHTTP,
        image: str,
        gpu_types: Sequence[str],
        cloud: str = "SECURE",
        cuda_versions: Sequence[str] = (),
        disk_gb: int = 80,
    ) -> None:
        self._key = api_key
        self._http = http
        self._image = image
        self._gpu_types = list(gpu_types)
        self._cloud = cloud
        self._cuda = list(cuda_versions)
        self._disk_gb = disk_gb

    def launch(self, request: LaunchRequest) -> Handle:
        if request.capacity is CapacityType.SPOT:
            raise PermanentProviderError(
                f"{request.name}: RunPod's REST v2 API cannot rent an interruptible (spot) pod "
                "(its create request has no such field); rent this pod on demand",
                provider=TARGET,
            )
        existing = self._find(request.name)
        if existing is not None:
            return Handle(instance_id=existing["id"], name=request.name)
        if request.offer is not None:
            return self._launch_offer(request, request.offer)
        candidates = gpu_candidates(request.gpu, self._gpu_types)
        if not candidates:
            raise NoCapacity(
                f"no configured RunPod GPU type (RUNPOD_POD_GPU_TYPES) fits gpu={dict(request.gpu)}"
            )
        count = gpu_count(request.gpu)
        refusals = []
        for gpu_id, _vram in candidates:
            try:
                pod = self._create(request, gpu_id, count)
            except PermanentProviderError as exc:
                if exc.status != 400:  # 422 schema, 402 balance, 403 access: no GPU helps
                    raise
                refusals.append(f"{gpu_id}: {exc}")
                continue
            return Handle(instance_id=str(pod["id"]), name=request.name)
        raise NoCapacity("RunPod refused every fitting GPU type: " + " | ".join(refusals)[:900])

    def _launch_offer(self, request: LaunchRequest, offer: Offer) -> Handle:
        """Placement priced this GPU type: another type would be another price, so none is
        tried in its place; a refusal goes back to placement as NoCapacity."""
        if offer.target != TARGET:
            raise PermanentProviderError(
                f"offer {offer.offer_id!r} is for target {offer.target!r}, not {TARGET}",
                provider=TARGET,
            )
        try:
            pod = self._create(request, offer.offer_id, max(1, offer.gpu_count))
        except PermanentProviderError as exc:
            if exc.status != 400:
                raise
            raise NoCapacity(
                f"RunPod refused GPU type {offer.offer_id}: {exc}"[:900],
                provider=TARGET,
                status=400,
            ) from exc
        return Handle(instance_id=str(pod["id"]), name=request.name)

    def _create(self, request: LaunchRequest, gpu_id: str, count: int) -> Any:
        gpu: dict[str, Any] = {"id": gpu_id, "count": count}
        if self._cuda:
            gpu["allowedCudaVersions"] = self._cuda
        body = {
            "name": request.name,
            "image": self._image,
            "gpu": gpu,
            "cloud": self._cloud,  # explicit: an absent cloud means different things to clients
            "disk": self._disk_gb,
            "ports": ["22/tcp"],
            "env": {"PUBLIC_KEY": request.ssh_public_key},
        }
        return self._http.call("POST", "/pods", key=self._key, json=body)

    def offers(self, gpu: Mapping[str, Any]) -> list[Offer]:
        """The configured GPU types that fit ``gpu``, priced for the configured cloud (ALL: the
        cheaper cloud that has stock) at the job's GPU count, cheapest first. A type the
        catalogue does not list, or prices at nothing for the cloud, is left out."""
        wanted = gpu_candidates(gpu, self._gpu_types)
        if not wanted:
            return []
        count = gpu_count(gpu)
        cloud = self._cloud.upper()
        found: dict[str, list[tuple[Quote, dict[str, Any]]]] = {}
        for each in CLOUDS if cloud == "ALL" else (cloud,):
            for gpu_type in self._catalog(each, count):
                quote = cloud_quote(gpu_type, each, count)
                if quote is not None:
                    found.setdefault(gpu_type["id"], []).append((quote, gpu_type))
        out = []
        for gpu_id, vram in wanted:
            if gpu_id not in found:
                continue
            # In stock before cheap: with ALL, the cheaper cloud may have no machine at all.
            best, gpu_type = min(found[gpu_id], key=lambda f: (not f[0].available, f[0].price))
            memory = gpu_type.get("memory")
            out.append(
                Offer(
                    target=TARGET,
                    offer_id=gpu_id,
                    # The id, not the display name: it is what the job's name glob matched
                    # here (gpu_candidates), and placement matches that glob again.
                    gpu_name=gpu_id,
                    gpu_count=count,
                    vram_gb=float(memory) if _positive(memory) else float(vram),
                    price_per_hour=round(best.price * count, 4),
                    spot_price_per_hour=None,  # REST v2 has no spot (interruptible) pods
                    available=best.available,
                    details={
                        "name": str(gpu_type.get("name") or gpu_id),
                        "cloud": best.cloud,
                        "pool": gpu_type.get("pool"),
                        "stock": best.stock,
                        "data_centers": best.data_centers,
                    },
                )
            )
        out.sort(key=lambda o: o.price_per_hour)  # stable: ties keep the operator's order
        return out

    def _catalog(self, cloud: str, count: int) -> list[dict[str, Any]]:
        # Availability is scoped by cloud, count and CUDA versions: asked exactly as launch
        # will create, so "available" means this pod, not any pod of the type.
        params = {"include": "AVAILABILITY", "product": "POD", "cloud": cloud, "count": str(count)}
        if self._cuda:
            params["cudaVersions"] = ",".join(self._cuda)
        body = self._http.call("GET", "/catalog/gpus", key=self._key, params=params)
        gpus = body.get("gpus", []) if isinstance(body, dict) else []
        return [g for g in gpus if isinstance(g, dict) and isinstance(g.get("id"), str)]

    def poll(self, handles: Sequence[Handle]) -> dict[str, RemoteState]:
        pods = {p["id"]: p for p in self._list()}
        return {h.instance_id: pod_state(pods.get(h.instance_id)) for h in handles}

    def cancel(self, handle: Handle) -> None:
        try:
            self._http.call("DELETE", f"/pods/{handle.instance_id}", key=self._key)
        except InstanceNotFound:
            return  # terminated already: nothing bills

    def list_instances(self) -> list[Handle]:
        return [
            Handle(instance_id=p["id"], name=p.get("name", ""))
            for p in self._list()
            if str(p.get("name", "")).startswith(MACHINE_PREFIX) and p.get("status") != "TERMINATED"
        ]

    def _list(self, **params: str) -> list[dict[str, Any]]:
        body = self._http.call("GET", "/pods", key=self._key, params=params or None)
        pods = body.get("pods", []) if isinstance(body, dict) else []
        return [p for p in pods if isinstance(p, dict) and "id" in p]

    def _find(self, name: str) -> dict[str, Any] | None:
        for pod in self._list(name=name):
            if pod.get("name") == name and pod.get("status") != "TERMINATED":
                return pod
        return None


@dataclass(frozen=True)
class Quote:
    """One GPU type in one cloud, from the catalogue."""

    cloud: str
    price: float  # USD per hour for one GPU
    available: bool
    stock: str | None  # the catalogue's availability level; None when it gave none
    data_centers: list[str]  # those with stock for this request


def gpu_count(gpu: Mapping[str, Any]) -> int:
    """GPUs per pod: a pod has at least one (a CPU-only job still rents a GPU pod)."""
    return max(1, int(gpu.get("count") or 1))


def cloud_quote(gpu_type: Mapping[str, Any], cloud: str, count: int) -> Quote | None:
    """What a catalogue GpuType says about ``cloud``; None when the cloud does not sell it at
    ``count`` GPUs per pod (flagged off, no price, or no machine that large)."""
    key = cloud.lower()  # GpuType keys its per-cloud fields "secure" / "community"
    largest = (gpu_type.get("maxCount") or {}).get(key)
    price = (gpu_type.get("price") or {}).get(key)
    if gpu_type.get(key) is False or not _positive(price):
        return None
    if _positive(largest) and count > largest:
        return None
    stock = gpu_type.get("availability")
    centres = gpu_type.get("dataCenters")
    return Quote(
        cloud=cloud,
        price=float(price),
        available=in_stock(stock),
        stock=None if stock is None else str(stock),
        data_centers=[
            str(dc["id"])
            for dc in (centres if isinstance(centres, list) else [])
            if isinstance(dc, dict) and "id" in dc and in_stock(dc.get("availability"))
        ],
    )


def in_stock(level: object) -> bool:
    """The catalogue's availability (NONE, LOW, MEDIUM or HIGH) as a yes or no. Absent means
    RunPod did not say (it is sent only for include=AVAILABILITY), so the type is treated as
    available and a create that finds no machine answers NoCapacity as before."""
    if level is None:
        return True
    if isinstance(level, bool):
        return level
    if isinstance(level, int | float):
        return level > 0
    return str(level).strip().upper() != "NONE"


def _positive(value: object) -> TypeGuard[int | float]:
    """A number above zero (RunPod writes absent figures as 0 or null)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0


def pod_state(pod: Mapping[str, Any] | None) -> RemoteState:
    """A v2 Pod object (None: not listed) as a RemoteState."""
    if pod is None:
        return RemoteState(RemoteStatus.LOST, "RunPod no longer lists this pod")
    # ``cost`` is the pod's billed rate in USD per hour; 0 once it exited: nothing to report.
    cost = pod.get("cost")
    price = float(cost) if _positive(cost) else None
    raw = str(pod.get("status", ""))
    status = STATUS_MAP.get(raw, RemoteStatus.PENDING)
    if status is RemoteStatus.LOST:
        return RemoteState(status, f"the pod is {raw}", price_per_hour=price)
    direct = (pod.get("ssh") or {}).get("direct") if isinstance(pod.get("ssh"), dict) else None
    if status is RemoteStatus.RUNNING and isinstance(direct, dict) and direct.get("host"):
        address = SshAddress(
            host=str(direct["host"]),
            port=int(direct.get("port") or 22),
            username=str(direct.get("username") or "root"),
        )
        return RemoteState(status, "RUNNING", ssh=address, price_per_hour=price)
    # RUNNING without an SSH address yet: the container is still coming up.
    return RemoteState(
        RemoteStatus.PENDING, raw or "unknown RunPod pod status", price_per_hour=price
    )


def from_settings(secrets: Mapping[str, str]) -> RunpodPods:
    from django.conf import settings

    key = secrets["api_key"]
    return RunpodPods(
        api_key=key,
        http=ProviderHTTP(  # v2 limits each user: one set of buckets per key
            provider=TARGET,
            base_url=settings.RUNPOD_REST_URL,
            limiter=shared_limiter(TARGET, RATE_LIMITS, api_key=key),
        ),
        image=settings.RUNPOD_POD_IMAGE,
        gpu_types=settings.RUNPOD_POD_GPU_TYPES,
        cloud=settings.RUNPOD_POD_CLOUD,
        cuda_versions=settings.RUNPOD_POD_CUDA_VERSIONS,
        disk_gb=settings.RUNPOD_POD_DISK_GB,
    )
