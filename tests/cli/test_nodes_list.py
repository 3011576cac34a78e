"""``trainhub nodes list`` against a scripted server: the cached models column (all of them up
to three, else how many and the first two; ``-`` for a node that never reported)."""

from __future__ import annotations

import json
from typing import Any

from tests.cli._fake_api import Reply, fake_api

KEY = "th-cli-test-secret-key-0123456789abcdefghijklmnop"


def _node(name: str, models: list[str] | None) -> dict[str, Any]:
    return {
        "id": name, "object": "gpu_node", "status": "idle", "draining": False, "ephemeral": False,
        "labels": {}, "capabilities": {"gpu_count": 1, "gpus": [{"name": "H100", "vram_mb": 1}]},
        "cached_models": models or [], "models_reported_at": None if models is None else 1,
        "current_job": None, "current_attempt": None, "last_heartbeat_at": 1, "registered_at": 1,
        "created_at": 1,
    }  # fmt: skip


def test_nodes_list_shows_the_cached_models(run_cli) -> None:
    page = {
        "object": "list",
        "data": [
            _node("gpu-a", ["acme/tiny-llama", "/models/llama"]),
            _node("gpu-b", [f"acme/m{i}" for i in range(5)]),
            _node("gpu-c", []),
            _node("gpu-old", None),
        ],
        "has_more": False,
    }
    with fake_api() as api:
        api.on("GET", "/api/v1/nodes", Reply.json(page))
        env = {"TRAINHUB_URL": api.url, "TRAINHUB_API_KEY": KEY}
        shown = run_cli("nodes", "list", env=env)
        as_json = run_cli("--json", "nodes", "list", env=env)
    assert shown.exit_code == 0, shown.output
    rows = {line.split()[0]: line for line in shown.stdout.splitlines() if "gpu-" in line}
    assert "models" in shown.stdout.splitlines()[0]
    assert "acme/tiny-llama, /models/llama" in rows["gpu-a"]
    assert "5: acme/m0, acme/m1, …" in rows["gpu-b"]
    assert " none " in rows["gpu-c"]
    assert " - " in rows["gpu-old"]
    assert json.loads(as_json.stdout)["data"][1]["cached_models"][4] == "acme/m4"
