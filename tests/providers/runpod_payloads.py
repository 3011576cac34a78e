"""Answers shaped like RunPod's documented ones (REST v2 ``api-reference-v2/openapi.json``),
shared by the adapter and contract tests."""

from __future__ import annotations

from typing import Any

IMAGE = "ghcr.io/trainhub/executor:1.4.0-cu128"
H100 = "NVIDIA H100 80GB HBM3"
# What an edge proxy answers for a 5xx: an HTML page, not the API's JSON.
HTML_502 = (
    "<html><head><title>502 Bad Gateway</title></head><body><center><h1>502 Bad Gateway</h1>"
    "</center><hr><center>cloudflare</center></body></html>"
)


def pod(pod_id: str, status: str, *, name: str, public_key: str, gpu: str = H100) -> dict[str, Any]:
    """A v2 Pod as ``GET /v2/pods`` returns it; ``ssh.direct`` and ``runtime`` only once the
    container runs, ``cost`` 0 once it is exited or terminated."""
    running = status == "RUNNING"
    return {
        "id": pod_id,
        "name": name,
        "image": IMAGE,
        "args": "",
        "disk": 80,
        "ports": ["22/tcp"],
        "env": {"PUBLIC_KEY": public_key},
        "registry": None,
        "status": status,
        "actions": ["stop", "restart", "terminate"] if running else ["terminate"],
        "mounts": {},
        "gpu": {"id": gpu, "count": 1, "vcpuCount": 16, "memory": 125},
        "cloud": "SECURE",
        "dataCenterId": "US-TX-3",
        "cudaVersion": "12.8",
        "ssh": {
            "proxy": {
                "host": "ssh.runpod.io",
                "port": 22,
                "username": f"{pod_id}-64411eb2",
                "command": f"ssh {pod_id}-64411eb2@ssh.runpod.io",
            },
            "direct": {
                "host": "195.26.233.3",
                "port": 34446,
                "username": "root",
                "command": "ssh root@195.26.233.3 -p 34446",
            }
            if running
            else None,
        },
        "template": None,
        "cost": 2.69 if status in ("PROVISIONING", "STARTING", "RUNNING") else 0.0,
        "locked": False,
        "globalNetworking": {"enabled": False},
        "runtime": {
            "uptime": 120,
            "ports": [{"private": 22, "public": 34446, "type": "tcp", "ip": "195.26.233.3"}],
        }
        if running
        else None,
        "createdAt": "2026-09-30T12:00:00Z",
        "startedAt": "2026-09-30T12:02:00Z" if running else None,
    }


def gpu_type(
    gpu_id: str,
    name: str,
    memory: int | None,
    *,
    secure: float | None,
    community: float | None,
    availability: str | None = "HIGH",
    max_count: tuple[int, int] = (8, 8),
    pool: str | None = "HOPPER_80",
    data_centers: tuple[str, ...] = ("US-TX-3",),
) -> dict[str, Any]:
    """A v2 GpuType as ``GET /v2/catalog/gpus`` returns it: list prices in USD per hour for
    one GPU per cloud (a cloud that does not sell the type is flagged off and priced 0),
    ``maxCount`` per cloud, and, only when asked for with ``include=AVAILABILITY``, an
    ``availability`` level (NONE, LOW, MEDIUM, HIGH) with the data centres that stock it.
    ``availability=None`` builds the answer without that expansion."""
    gpu: dict[str, Any] = {
        "id": gpu_id,
        "name": name,
        "pool": pool,
        "manufacturer": "NVIDIA",
        "memory": memory,
        "secure": secure is not None,
        "community": community is not None,
        "price": {"secure": secure or 0.0, "community": community or 0.0, "serverless": 2.72},
        "maxCount": {"secure": max_count[0], "community": max_count[1]},
    }
    if memory is None:
        del gpu["memory"]
    if availability is not None:
        gpu["availability"] = availability
        if availability != "NONE":  # omitted when the type is out of stock everywhere
            gpu["dataCenters"] = [
                {"id": dc, "name": dc.replace("-", " "), "availability": availability}
                for dc in data_centers
            ]
        gpu["cudaVersions"] = [{"version": "12.8", "available": availability != "NONE"}]
    return gpu


def catalog(*gpus: dict[str, Any]) -> dict[str, Any]:
    """The ``{"gpus": [...]}`` wrapper of the v2 catalogue listing."""
    return {"gpus": list(gpus)}
