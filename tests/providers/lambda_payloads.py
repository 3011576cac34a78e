"""Answers shaped like Lambda Cloud's documented ones (API v1: the 1.5.3 OpenAPI schema plus
``private_ip`` from the newer one), shared by the adapter and contract tests, and the
contract test's ``LAMBDA_CASE``."""

from __future__ import annotations

import dataclasses
from typing import Any

from providers import lambda_cloud
from providers.base import Offer, ProviderAdapter
from providers.http import ProviderHTTP
from tests.providers.contract import KEY, REQUEST, Case, Exchange, Sleep

BASE = "https://cloud.lambda.ai/api/v1"
REGIONS = {
    "us-east-1": "Virginia, USA",
    "us-west-1": "California, USA",
    "us-south-1": "Texas, USA",
    "europe-central-1": "Germany",
}


def instance_type(
    name: str,
    gpu_description: str,
    cents: int,
    *,
    gpus: int = 1,
    vcpus: int = 30,
    memory_gib: int = 200,
    storage_gib: int = 1400,
) -> dict[str, Any]:
    """An ``instance_type`` object; ``description`` is the count and the GPU, as Lambda
    words it ("8x H100 (80 GB SXM5)")."""
    return {
        "name": name,
        "description": f"{gpus}x {gpu_description}" if gpus else gpu_description,
        "gpu_description": gpu_description,
        "price_cents_per_hour": cents,
        "specs": {
            "vcpus": vcpus,
            "memory_gib": memory_gib,
            "storage_gib": storage_gib,
            "gpus": gpus,
        },
    }


def region(name: str) -> dict[str, str]:
    return {"name": name, "description": REGIONS.get(name, name)}


# The catalogue the offer tests read: prices as Lambda listed them in 2026.
A10 = instance_type("gpu_1x_a10", "A10 (24 GB PCIe)", 75)
A100 = instance_type("gpu_1x_a100_sxm4", "A100 (40 GB SXM4)", 129, vcpus=30, storage_gib=512)
A100_X8 = instance_type(
    "gpu_8x_a100_80gb_sxm4", "A100 (80 GB SXM4)", 1432, gpus=8, vcpus=240, memory_gib=1800
)
H100 = instance_type("gpu_1x_h100_sxm5", "H100 (80 GB SXM5)", 329, vcpus=26, memory_gib=225)
GH200 = instance_type("gpu_1x_gh200", "GH200 (96 GB)", 149, vcpus=64, memory_gib=432)
B200_X2 = instance_type("gpu_2x_b200_sxm6", "B200 (180 GB SXM6)", 998, gpus=2, vcpus=52)
CPU = {
    "name": "cpu_4x_general",
    "description": "4x CPU General (16 GiB)",
    "gpu_description": "",
    "price_cents_per_hour": 20,
    "specs": {"vcpus": 4, "memory_gib": 16, "storage_gib": 100, "gpus": 0},
}


def instance_types(*entries: tuple[dict[str, Any], list[str]]) -> dict[str, Any]:
    """``GET /instance-types``: a dict keyed by type name, each with the regions that have
    capacity now."""
    return {
        "data": {
            itype["name"]: {
                "instance_type": itype,
                "regions_with_capacity_available": [region(r) for r in regions],
            }
            for itype, regions in entries
        }
    }


def instance(
    instance_id: str,
    status: str,
    *,
    name: str | None = REQUEST.name,
    key_names: tuple[str, ...] = (),
    itype: dict[str, Any] = A100,
    region_name: str = "us-east-1",
) -> dict[str, Any]:
    """An instance as ``GET /instances`` lists it: ``ip`` and ``hostname`` null while booting,
    Jupyter fields once the machine is up."""
    up = status in ("active", "unhealthy")
    return {
        "id": instance_id,
        "name": name,
        "ip": "198.51.100.23" if up else None,
        "private_ip": "10.19.60.24" if up else None,
        "status": status,
        "ssh_key_names": list(key_names or (lambda_cloud.key_name(REQUEST.ssh_public_key),)),
        "file_system_names": [],
        "region": region(region_name),
        "instance_type": itype,
        "hostname": "198-51-100-23.cloud.lambda.ai" if up else None,
        "jupyter_token": "53968f128c4a4489b688c2c0a181d083" if up else None,
        "jupyter_url": (
            "https://jupyter-3ac4c5c6-9026-47d2-9a33-71efccbcd0ee.lambdaspaces.com/"
            "?token=53968f128c4a4489b688c2c0a181d083"
            if up
            else None
        ),
    }


def ssh_key(key_id: str, name: str, public_key: str) -> dict[str, Any]:
    """An ``sshKey``; ``private_key`` is only ever sent for a pair Lambda generated."""
    return {"id": key_id, "name": name, "public_key": public_key}


def error(code: str, message: str, suggestion: str | None = None) -> dict[str, Any]:
    """Lambda's error body (``suggestion`` is optional and may be null)."""
    body: dict[str, Any] = {"code": code, "message": message}
    if suggestion is not None:
        body["suggestion"] = suggestion
    return {"error": body}


INVALID_KEY = error("global/invalid-api-key", "API key was invalid, expired, or deleted.")
NOT_FOUND = error("global/object-does-not-exist", "Specified instance does not exist.")
NO_CAPACITY = error(
    "instance-operations/launch/insufficient-capacity",
    "Not enough capacity to fulfill launch request.",
    "Choose an instance type with more availability, or try again later.",
)
QUOTA = error(
    "global/quota-exceeded",
    "Quota exceeded for instance type.",
    "Contact Support to increase your quota.",
)
KEY_IN_USE = error("ssh-keys/key-in-use", "SSH key is in use by an instance.")
UPSTREAM = error("provider/internal-unavailable", "The provider is temporarily unavailable.")


# --- the contract test's case ------------------------------------------------------------------

INSTANCE = "0920582c7ff041399e34823a0be62549"
OFFER = Offer(
    target="lambda",
    offer_id="gpu_1x_a100_sxm4@us-east-1",
    gpu_name="A100 SXM4",
    gpu_count=1,
    vram_gb=40.0,
    price_per_hour=1.29,
    region="us-east-1",
)


def _build(base_url: str, sleep: Sleep) -> ProviderAdapter:
    http = ProviderHTTP(provider="lambda", base_url=base_url, sleep=sleep)
    return lambda_cloud.LambdaCloud(api_key=KEY, http=http)


LAMBDA_CASE = Case(
    name="lambda",
    base_url=BASE,
    build=_build,
    instance_id=INSTANCE,
    launch=Exchange(
        "POST", f"{BASE}/instance-operations/launch", json={"data": {"instance_ids": [INSTANCE]}}
    ),
    # A launch first looks for an instance of the attempt, then registers the attempt's key.
    before_launch=(
        Exchange("GET", f"{BASE}/instances", json={"data": []}),
        Exchange("GET", f"{BASE}/ssh-keys", json={"data": []}),
        Exchange(
            "POST",
            f"{BASE}/ssh-keys",
            json={
                "data": ssh_key(
                    "0920582c7ff041399e34823a0be62548",
                    lambda_cloud.key_name(REQUEST.ssh_public_key),
                    REQUEST.ssh_public_key,
                )
            },
        ),
    ),
    # Only the terminate is answered: the key clean-up after it fails, and must not matter.
    cancel=lambda i: Exchange(
        "POST",
        f"{BASE}/instance-operations/terminate",
        json={"data": {"terminated_instances": [instance(i, "terminating")]}},
    ),
    poll=lambda ids, status: [
        Exchange("GET", f"{BASE}/instances", json={"data": [instance(i, status) for i in ids]})
    ],
    status_map=lambda_cloud.STATUS_MAP,
    documented_statuses=frozenset({"booting", "active", "unhealthy", "terminating", "terminated"}),
    unauthorized=INVALID_KEY,
    not_found=NOT_FOUND,
    request=dataclasses.replace(REQUEST, offer=OFFER),
)
