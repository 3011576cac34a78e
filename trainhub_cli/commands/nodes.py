"""``trainhub nodes list|drain|undrain``: the own GPU fleet (operators: a staff user's key)."""

from __future__ import annotations

from typing import Any

import click

from trainhub_cli.render import status_text, table, when
from trainhub_cli.state import get_state, json_option


def _gpus(node: dict[str, Any]) -> str:
    caps = node.get("capabilities") or {}
    count = caps.get("gpu_count")
    names = {g.get("name") for g in caps.get("gpus") or [] if isinstance(g, dict)}
    label = ", ".join(sorted(n for n in names if n)) or caps.get("backend") or ""
    return f"{count or 0} {label}".strip()


def _models(node: dict[str, Any]) -> str:
    """The cached base models: all of them up to three, else the count and the first two."""
    if node.get("models_reported_at") is None:
        return "-"  # a node (or control plane) from before model cache reports
    names = [str(m) for m in node.get("cached_models") or []]
    if len(names) <= 3:
        return ", ".join(names) or "none"
    return f"{len(names)}: {', '.join(names[:2])}, …"


@click.group()
def nodes() -> None:
    """The own GPU nodes (operator endpoints: needs a staff user's key)."""


@nodes.command("list")
@json_option
def list_nodes() -> None:
    """List the GPU nodes with their status, GPUs, cached models, labels and current job."""
    state = get_state()
    page = state.api.get("/nodes")
    out = state.output
    if out.json_mode:
        out.json(page)
        return
    rows = [
        (n["id"], status_text(n.get("status")), "yes" if n.get("draining") else "", _gpus(n),
         _models(n), n.get("labels") or None, n.get("current_job"),
         when(n.get("last_heartbeat_at")))
        for n in page["data"]
    ]  # fmt: skip
    columns = ("id", "status", "draining", "gpus", "models", "labels", "job", "heartbeat")
    out.print(table(columns, rows))


def _drain_command(name: str, doc: str) -> None:
    @nodes.command(name, help=doc)
    @click.argument("node")
    @json_option
    def command(node: str) -> None:
        state = get_state()
        changed = state.api.post(f"/nodes/{node}/{name}")
        out = state.output
        if out.json_mode:
            out.json(changed)
        else:
            draining = "draining" if changed.get("draining") else "not draining"
            out.print(f"{changed['id']}: {changed.get('status')}, {draining}")


_drain_command("drain", "Stop placing new jobs on NODE (its current job finishes).")
_drain_command("undrain", "Place jobs on NODE again.")
