"""``trainhub providers list|offers``: cloud targets and their priced offers."""

from __future__ import annotations

from typing import Any

import click
from rich.text import Text

from trainhub_cli.render import table
from trainhub_cli.state import get_state, json_option


@click.group()
def providers() -> None:
    """Cloud GPU targets usable by this project, and their offers."""


@providers.command("list")
@json_option
def list_providers() -> None:
    """Each target: usable or why not, and whether its key verifies."""
    state = get_state()
    page = state.api.get("/providers")
    out = state.output
    if out.json_mode:
        out.json(page)
        return

    def key(p: dict[str, Any]) -> str:
        cred = p.get("credential")
        if not cred:
            return "-"
        verified = {True: "verified", False: "refused", None: "checking"}[cred.get("verified")]
        return f"{cred.get('source') or 'none'} ({verified})"

    rows = [
        (p["id"], Text("yes", style="green") if p.get("usable") else Text("no", style="red"),
         key(p), "yes" if p.get("has_offers") else "", p.get("problem") or p.get("description"))
        for p in page["data"]
    ]  # fmt: skip
    out.print(table(("id", "usable", "credential", "offers", "notes"), rows))


@providers.command("offers")
@click.argument("target")
@click.option("--gpu", metavar="GLOB", help='GPU name or glob, e.g. "*H100*".')
@click.option("--count", type=click.IntRange(0, 64), help="GPUs per machine (default 1).")
@click.option("--min-vram", type=float, metavar="GB", help="GB per GPU at least.")
@json_option
def offers(target: str, gpu: str | None, count: int | None, min_vram: float | None) -> None:
    """Priced offers of TARGET that fit the GPU needs, cheapest first."""
    state = get_state()
    page = state.api.get(f"/providers/{target}/offers", gpu=gpu, count=count, min_vram_gb=min_vram)
    out = state.output
    if out.json_mode:
        out.json(page)
        return
    rows = [
        (o.get("offer_id") or o.get("id"), o.get("gpu_name"), o.get("gpu_count"),
         o.get("vram_gb"), o.get("price_per_hour"), o.get("region"),
         "yes" if o.get("available", True) else "no")
        for o in page["data"]
    ]  # fmt: skip
    out.print(table(("offer", "gpu", "count", "vram GB", "$/hour", "region", "available"), rows))
