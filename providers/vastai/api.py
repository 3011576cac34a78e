"""What the Vast.ai adapter knows about Vast's REST API: the target name, the endpoint, its rate
limits and unit quirks, how trainhub bids, and how to read a number it sends."""

from __future__ import annotations

import math
import re

TARGET = "vastai"
DEFAULT_URL = "https://console.vast.ai/api/v0"
SEARCH_LIMIT = 64  # the most one search answers
# GET /api/v1/instances/ answers at most 25 rows a page (and a next_token while more remain).
V1_PAGE_LIMIT = 25
# An interruptible instance is a bid: trainhub bids the ask's min_bid plus this share, so the
# next bid at exactly the minimum does not outbid it at once. Still far below on demand.
BID_MARGIN = 0.05
# Vast's gpu_ram is documented as MB but is nvidia-smi's MiB (an RTX 4090 reports 24564, an
# "80GB" H100 81559, a "48GB" L40S 46068); cards are sold in decimal GB.
MIB_IN_GB = 2**20 / 1e9

# Vast enforces a minimum interval per endpoint and identity (token + user + IP) and sends no
# Retry-After, so a call it refuses costs a backoff: space calls out here instead, shared by
# every worker. Intervals from Vast's "rate limits by endpoint" table (GET /instances/ one per
# 2 s, DELETE /instances/{id}/ one per 3 s) and the search spec (threshold 2 s), plus 10% for
# the network between our clock and theirs. The create and attach intervals are not published:
# the search's is assumed.
RATE_LIMITS: dict[str, tuple[int, float]] = {
    "search": (1, 2.2),  # POST /bundles/
    "create": (1, 2.2),  # PUT /asks/{id}/
    "attach": (1, 2.2),  # POST /instances/{id}/ssh/
    # GET /api/v1/instances/, per page (poll, launch's look-up, list_instances); v1's own
    # interval is not published: v0's list one is kept.
    "list": (1, 2.2),
    "destroy": (1, 3.3),  # DELETE /instances/{id}/
}


def v1_url(base_url: str) -> str:
    """The v1 root beside the configured v0 one (``…/api/v0`` → ``…/api/v1``): only the
    instance list moved to v1; every other call stays on v0."""
    root, _, version = base_url.rstrip("/").rpartition("/")
    if not root or not re.fullmatch(r"v\d+", version):
        raise ValueError(
            f"VAST_API_URL {base_url!r} must be Vast's v0 root (…/api/v0): the instance list "
            "is read from the v1 root beside it"
        )
    return f"{root}/v1"


def bid(min_bid: object, on_demand: float) -> float | None:
    """The $/h trainhub bids for an ask whose lowest accepted bid is ``min_bid``: BID_MARGIN
    above it, rounded up to a tenth of a cent. None when the ask takes no bid, or when the bid
    would not be cheaper than renting it on demand (then spot buys nothing but interruptions)."""
    low = number(min_bid)
    if low is None or low <= 0:
        return None
    # Rounded to 6 places first: 0.2 x 1.05 x 1000 is 210.00000000000003 in floating point.
    price = math.ceil(round(low * (1 + BID_MARGIN) * 1000, 6)) / 1000
    return price if price < on_demand else None


def number(value: object) -> float | None:
    """A price or figure Vast sent as a number or a numeric string; None for anything else."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    try:
        return float(value)
    except ValueError:
        return None
