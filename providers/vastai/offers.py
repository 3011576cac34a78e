"""Vast.ai asks (``POST /bundles/`` results) as priced Offers."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from providers.base import Offer
from providers.vastai.api import MIB_IN_GB, TARGET, number

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
    return Offer(
        target=TARGET,
        offer_id=str(ask["id"]),
        gpu_name=str(ask.get("gpu_name") or ""),
        gpu_count=int(ask.get("num_gpus") or 1),
        vram_gb=float(ask.get("gpu_ram") or 0) * MIB_IN_GB,  # per GPU, decimal GB as sold
        price_per_hour=float(ask.get("dph_total") or 0),  # on demand, GPU + disk + the rest
        spot_price_per_hour=number(ask.get("min_bid")),
        available=True,  # a search lists only what can be rented now
        region=str(ask.get("geolocation") or ""),
        machine_id=str(ask.get("machine_id") or ""),
        details={k: ask[k] for k in OFFER_DETAILS if ask.get(k) is not None},
    )


def gpu_count(gpu: Mapping[str, object]) -> int:
    """GPUs per machine for the job's ``gpu`` needs: at least one."""
    return max(1, int(str(gpu.get("count") or 1)))
