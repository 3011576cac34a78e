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

Spot pods exist only in the deprecated GraphQL API and are not offered.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence
from typing import Any

from providers.base import (
    MACHINE_PREFIX,
    Handle,
    LaunchRequest,
    RemoteState,
    RemoteStatus,
    SshAddress,
)
from providers.errors import InstanceNotFound, NoCapacity, PermanentProviderError
from providers.http import ProviderHTTP
from providers.ratelimit import shared_limiter

DEFAULT_URL = "https://api.runpod.io/v2"
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
        existing = self._find(request.name)
        if existing is not None:
            return Handle(instance_id=existing["id"], name=request.name)
        candidates = gpu_candidates(request.gpu, self._gpu_types)
        if not candidates:
            raise NoCapacity(
                f"no configured RunPod GPU type (RUNPOD_POD_GPU_TYPES) fits gpu={dict(request.gpu)}"
            )
        refusals = []
        for gpu_id, _vram in candidates:
            try:
                pod = self._http.call(
                    "POST", "/pods", key=self._key, json=self._create_body(request, gpu_id)
                )
            except PermanentProviderError as exc:
                if exc.status != 400:  # 422 schema, 402 balance, 403 access: no GPU helps
                    raise
                refusals.append(f"{gpu_id}: {exc}")
                continue
            return Handle(instance_id=str(pod["id"]), name=request.name)
        raise NoCapacity("RunPod refused every fitting GPU type: " + " | ".join(refusals)[:900])

    def _create_body(self, request: LaunchRequest, gpu_id: str) -> dict[str, Any]:
        gpu: dict[str, Any] = {"id": gpu_id, "count": max(1, int(request.gpu.get("count", 1)))}
        if self._cuda:
            gpu["allowedCudaVersions"] = self._cuda
        return {
            "name": request.name,
            "image": self._image,
            "gpu": gpu,
            "cloud": self._cloud,  # explicit: an absent cloud means different things to clients
            "disk": self._disk_gb,
            "ports": ["22/tcp"],
            "env": {"PUBLIC_KEY": request.ssh_public_key},
        }

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


def pod_state(pod: Mapping[str, Any] | None) -> RemoteState:
    """A v2 Pod object (None: not listed) as a RemoteState."""
    if pod is None:
        return RemoteState(RemoteStatus.LOST, "RunPod no longer lists this pod")
    raw = str(pod.get("status", ""))
    status = STATUS_MAP.get(raw, RemoteStatus.PENDING)
    if status is RemoteStatus.LOST:
        return RemoteState(status, f"the pod is {raw}")
    direct = (pod.get("ssh") or {}).get("direct") if isinstance(pod.get("ssh"), dict) else None
    if status is RemoteStatus.RUNNING and isinstance(direct, dict) and direct.get("host"):
        address = SshAddress(
            host=str(direct["host"]),
            port=int(direct.get("port") or 22),
            username=str(direct.get("username") or "root"),
        )
        return RemoteState(status, "RUNNING", ssh=address)
    # RUNNING without an SSH address yet: the container is still coming up.
    return RemoteState(RemoteStatus.PENDING, raw or "unknown RunPod pod status")


def from_settings(secrets: Mapping[str, str]) -> RunpodPods:
    from django.conf import settings

    return RunpodPods(
        api_key=secrets["api_key"],
        http=ProviderHTTP(
            provider="runpod-pod",
            base_url=settings.RUNPOD_REST_URL,
            limiter=shared_limiter("runpod-pod", RATE_LIMITS),
        ),
        image=settings.RUNPOD_POD_IMAGE,
        gpu_types=settings.RUNPOD_POD_GPU_TYPES,
        cloud=settings.RUNPOD_POD_CLOUD,
        cuda_versions=settings.RUNPOD_POD_CUDA_VERSIONS,
        disk_gb=settings.RUNPOD_POD_DISK_GB,
    )
