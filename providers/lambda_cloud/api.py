"""What the Lambda Cloud adapter knows about Lambda's API v1: the target name, the endpoint,
its rate limits, how instances are reached and how prices are written."""

from __future__ import annotations

TARGET = "lambda"
DEFAULT_URL = "https://cloud.lambda.ai/api/v1"
# Lambda: about 1 request/s in general, launch 1 per 12 s; kept a little under both.
RATE_LIMITS: dict[str, tuple[int, float]] = {"default": (9, 10.0), "launch": (1, 12.5)}
SSH_PORT = 22
SSH_USER = "ubuntu"  # Lambda Stack images


def price(instance_type: object) -> float | None:
    """USD per hour; None when Lambda does not say. The cents are an integer in the schema, a
    string in the schema's own example: both are read."""
    cents = instance_type.get("price_cents_per_hour") if isinstance(instance_type, dict) else None
    try:
        return float(str(cents)) / 100
    except ValueError:
        return None
