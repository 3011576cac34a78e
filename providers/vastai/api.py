"""What the Vast.ai adapter knows about Vast's REST v0: the target name, the endpoint, its rate
limits and unit quirks, and how to read a number it sends."""

from __future__ import annotations

TARGET = "vastai"
DEFAULT_URL = "https://console.vast.ai/api/v0"
SEARCH_LIMIT = 64  # the most one search answers
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
    "list": (1, 2.2),  # GET /instances/ (poll, launch's look-up, list_instances)
    "destroy": (1, 3.3),  # DELETE /instances/{id}/
}


def number(value: object) -> float | None:
    """A price or figure Vast sent as a number or a numeric string; None for anything else."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    try:
        return float(value)
    except ValueError:
        return None
