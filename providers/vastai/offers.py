"""Vast.ai asks (``POST /bundles/`` results) as priced Offers."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from providers.base import Offer
from providers.vastai.api import MIB_IN_GB, TARGET, bid

# What placement may want to show or check beyond the Offer fields.
OFFER_DETAILS = (
    "reliability2",
    "cuda_max_good",
    "inet_down",
    "dph_base",
    "verification",
    "direct_port_count",
    "disk_space",
)


def offer_from_ask(ask: Mapping[str, Any]) -> Offer:
    """One ask of a search answer (it must have an ``id``) as an Offer."""
    on_demand = float(ask.get("dph_total") or 0)  # GPU + disk + the rest
    return Offer(
        target=TARGET,
        offer_id=str(ask["id"]),
        gpu_name=str(ask.get("gpu_name") or ""),
        gpu_count=int(ask.get("num_gpus") or 1),
        vram_gb=float(ask.get("gpu_ram") or 0) * MIB_IN_GB,  # per GPU, decimal GB as sold
        price_per_hour=on_demand,
        # What launch bids for an interruptible instance of this ask (None: no bid worth it).
        spot_price_per_hour=bid(ask.get("min_bid"), on_demand),
        available=True,  # a search lists only what can be rented now
        region=str(ask.get("geolocation") or ""),
        machine_id=str(ask.get("machine_id") or ""),
        details={k: ask[k] for k in OFFER_DETAILS if ask.get(k) is not None},
    )


def exact_gpu_names(pattern: str) -> list[str]:
    """The names to ask Vast for (``gpu_name in [...]``) when the job's GPU name is not a glob:
    Vast compares names exactly and writes them with spaces ("RTX 4090"), CLIs with
    underscores; most names are upper case ("H100 SXM"), some not ("Tesla V100"), so the
    job's own spelling is sent beside the upper-case one. [] for a glob (``*``, ``?``, ``[``)
    or no name: then the name is matched client-side only."""
    if not pattern or any(c in pattern for c in "*?["):
        return []
    spaced = " ".join(pattern.replace("_", " ").split())
    return list(dict.fromkeys((spaced, spaced.upper())))


def gpu_count(gpu: Mapping[str, object]) -> int:
    """GPUs per machine for the job's ``gpu`` needs: at least one."""
    return max(1, int(str(gpu.get("count") or 1)))
