"""EC2 instance types as priced Offers: one per (configured type, configured region), GPU
facts from ``DescribeInstanceTypes``, availability from ``DescribeInstanceTypeOfferings``, the
on-demand price from ``providers.aws.prices`` and the spot price from
``DescribeSpotPriceHistory`` (the lowest current price over the region's zones)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from providers.aws.api import TARGET
from providers.aws.prices import on_demand_price
from providers.base import Offer, offer_misfit

# EC2 reports the memory the driver sees (an A10G: 22,888 MiB); offers say what the GPU is
# sold as, like every other provider's (decimal GB), where that differs.
SOLD_VRAM_GB: Mapping[str, float] = {"A10G": 24.0, "L4": 24.0, "L40S": 48.0, "T4": 16.0}


def gpu_facts(instance_type: Mapping[str, Any]) -> tuple[str, int, float] | None:
    """(GPU name, count, GB per GPU) of a described type; None for a type without GPUs."""
    info = instance_type.get("GpuInfo") or {}
    gpus = [g for g in info.get("Gpus") or [] if isinstance(g, dict)]
    if not gpus:
        return None
    first = gpus[0]
    name = str(first.get("Name") or "")
    count = sum(int(g.get("Count") or 0) for g in gpus)
    mib = float((first.get("MemoryInfo") or {}).get("SizeInMiB") or 0)
    vram = SOLD_VRAM_GB.get(name, round(mib / 1024, 1))
    return (name, count, vram) if count else None


def spot_prices(history: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """The lowest current spot price per type: the newest entry of each (type, zone), then the
    cheapest zone (EC2 picks a zone with capacity; the price differs by zone)."""
    newest: dict[tuple[str, str], tuple[Any, float]] = {}
    for entry in history:
        try:
            price = float(str(entry.get("SpotPrice")))
        except ValueError:
            continue
        key = (str(entry.get("InstanceType")), str(entry.get("AvailabilityZone")))
        stamp = entry.get("Timestamp")
        if key not in newest or (stamp is not None and stamp > newest[key][0]):
            newest[key] = (stamp, price)
    out: dict[str, float] = {}
    for (itype, _zone), (_stamp, price) in newest.items():
        out[itype] = min(price, out.get(itype, price))
    return out


def region_offers(
    region: str,
    *,
    types: Mapping[str, Mapping[str, Any]],
    offered: set[str],
    spot: Mapping[str, float],
    price_overrides: Mapping[str, float],
) -> list[Offer]:
    """The offers of one region: every described GPU type with a known price; ``available``
    when EC2 sells the type in the region."""
    out: list[Offer] = []
    for name, described in types.items():
        facts = gpu_facts(described)
        price = on_demand_price(name, region, price_overrides)
        if facts is None or price is None:
            continue
        gpu_name, count, vram = facts
        gpus = (described.get("GpuInfo") or {}).get("Gpus") or [{}]
        out.append(
            Offer(
                target=TARGET,
                offer_id=f"{name}@{region}",
                gpu_name=gpu_name,
                gpu_count=count,
                vram_gb=vram,
                price_per_hour=price,
                spot_price_per_hour=spot.get(name),
                available=name in offered,
                region=region,
                details={
                    "instance_type": name,
                    "manufacturer": str(gpus[0].get("Manufacturer") or ""),
                    "gpu_memory_mib": (gpus[0].get("MemoryInfo") or {}).get("SizeInMiB"),
                    "vcpus": (described.get("VCpuInfo") or {}).get("DefaultVCpus"),
                    "memory_mib": (described.get("MemoryInfo") or {}).get("SizeInMiB"),
                },
            )
        )
    return out


def fitting(offers: Iterable[Offer], gpu: Mapping[str, object]) -> list[Offer]:
    """The coarse filter (placement re-checks), cheapest first, available before not."""
    keep = [o for o in offers if offer_misfit(gpu, o) is None]
    return sorted(keep, key=lambda o: (o.price_per_hour, not o.available, o.offer_id))
