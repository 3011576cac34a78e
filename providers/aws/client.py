"""The boto3 side of the adapter: one EC2 client per region, and the calls through which every
answer is read and every error mapped (``errors.translate``)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from providers.aws.api import TARGET
from providers.aws.errors import translate
from providers.errors import TransientProviderError


def boto_client(session: Any, region: str, *, endpoint_url: str | None, max_attempts: int) -> Any:
    """An EC2 client of ``session`` for ``region`` with a timeout on every call."""
    from botocore.config import Config

    config = Config(
        connect_timeout=10,
        read_timeout=30,
        # Standard mode retries throttles, 5xx and dropped connections with backoff;
        # RunInstances included, which its ClientToken makes safe.
        retries={"mode": "standard", "total_max_attempts": max_attempts},
    )
    return session.client("ec2", region_name=region, endpoint_url=endpoint_url, config=config)


def session(credentials: Mapping[str, str | None]) -> Any:
    """A boto3 session with the key, or boto3's default chain when it holds none."""
    import boto3

    return boto3.session.Session(**credentials)


def call(ec2: Any, method: str, region: str, **params: Any) -> dict[str, Any]:
    action = "".join(p.title() for p in method.split("_"))
    try:
        answer = getattr(ec2, method)(**params)
    except Exception as exc:
        raise translate(exc, action=f"{action} in {region}") from exc
    if not isinstance(answer, dict):
        raise TransientProviderError(f"aws {action} in {region}: no answer", provider=TARGET)
    return answer


def pages(ec2: Any, method: str, key: str, region: str, **params: Any) -> list[dict[str, Any]]:
    """Every item of a paginated describe call."""
    items: list[dict[str, Any]] = []
    token = ""
    while True:
        answer = call(ec2, method, region, **params, **({"NextToken": token} if token else {}))
        items += [i for i in answer.get(key) or [] if isinstance(i, dict)]
        token = str(answer.get("NextToken") or "")
        if not token:
            return items


def instances(ec2: Any, region: str, filters: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for reservation in pages(ec2, "describe_instances", "Reservations", region, Filters=filters):
        for instance in reservation.get("Instances") or []:
            if isinstance(instance, dict) and instance.get("InstanceId"):
                yield instance
