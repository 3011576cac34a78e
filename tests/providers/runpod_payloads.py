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
