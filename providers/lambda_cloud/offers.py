"""Lambda instance types (``GET /instance-types``) as priced Offers: one available offer per
(type, region with capacity), ``offer_id`` ``<type>@<region>``, and one unavailable offer per
type with none. No CPU-only types (the executor needs a GPU)."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping, Sequence
from typing import Any

from providers.base import Offer, offer_misfit
from providers.lambda_cloud.api import TARGET, price

# "H100 (80 GB SXM5)", "GH200 (96 GB)", "1x A10 (24 GB PCIe)": model, GB per GPU, form factor.
_GPU = re.compile(
    r"^(?:\d+x\s+)?(?P<model>[^(]*?)\s*\(\s*(?P<gb>\d+(?:\.\d+)?)\s*GB\b\s*(?P<form>[^)]*)\)",
    re.IGNORECASE,
)


def parse_gpu(*descriptions: str) -> tuple[str, float]:
    """(GPU name, GB per GPU) from the first description that names the memory:
    "A100 (40 GB SXM4)" -> ("A100 SXM4", 40.0). The form factor stays in the name so a glob
    can tell SXM from PCIe. (name, 0.0) when none does."""
    for text in descriptions:
        match = _GPU.match(text.strip())
        if match:
            name = " ".join(p for p in (match["model"].strip(), match["form"].strip()) if p)
            return name, float(match["gb"])
    first = next((t.strip() for t in descriptions if t.strip()), "")
    return re.sub(r"^\d+x\s+", "", first), 0.0


def allowed(value: str, patterns: Sequence[str]) -> bool:
    """Whether ``value`` passes an allow-list of globs (empty allows all)."""
    return not patterns or any(fnmatch.fnmatchcase(value, p) for p in patterns)


def offers_from_types(
    types: Mapping[str, Any],
    gpu: Mapping[str, object],
    *,
    type_globs: Sequence[str] = (),
    region_globs: Sequence[str] = (),
) -> list[Offer]:
    """The ``data`` of ``GET /instance-types`` as the offers that may fit ``gpu``, cheapest
    first. Lambda sells fixed GPU counts per type, so a type with more GPUs than asked still
    fits (the control plane re-checks and sorts)."""
    out: list[Offer] = []
    for type_name, entry in types.items():
        itype = entry.get("instance_type") if isinstance(entry, dict) else None
        if not isinstance(itype, dict) or not allowed(type_name, type_globs):
            continue
        specs = itype.get("specs") or {}
        count = int(specs.get("gpus") or 0)
        name, vram = parse_gpu(
            str(itype.get("gpu_description") or ""), str(itype.get("description") or "")
        )
        rate = price(itype)
        if count == 0 or rate is None:
            continue  # CPU-only, or no price to compare or cap
        regions = [
            str(r["name"])
            for r in entry.get("regions_with_capacity_available") or []
            if isinstance(r, dict) and r.get("name") and allowed(str(r["name"]), region_globs)
        ]
        common: dict[str, Any] = {
            "target": TARGET,
            "gpu_name": name,
            "gpu_count": count,
            "vram_gb": vram,
            "price_per_hour": rate,
            "details": {
                "instance_type": type_name,
                "description": itype.get("description", ""),
                "vcpus": specs.get("vcpus"),
                "memory_gib": specs.get("memory_gib"),
                "storage_gib": specs.get("storage_gib"),
            },
        }
        out += [Offer(offer_id=f"{type_name}@{r}", region=r, **common) for r in regions]
        if not regions:
            out.append(Offer(offer_id=type_name, available=False, **common))
    fitting = [o for o in out if offer_misfit(gpu, o) is None]  # coarse: placement re-checks
    return sorted(fitting, key=lambda o: (o.price_per_hour, not o.available, o.offer_id))
