"""Answers shaped like Vast.ai's documented ones (REST v0: ``POST /bundles/`` offers,
``PUT /asks/{id}/``, ``{"success": false, "error", "msg"}`` errors; v1: the paged
``GET /api/v1/instances/``), shared by the adapter tests and the contract test
(``VAST_CASE``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from providers import vastai
from providers.base import Offer, ProviderAdapter
from providers.http import ProviderHTTP
from tests.providers import contract
from tests.providers.contract import KEY, Case, Exchange, Sleep

BASE = "https://console.vast.ai/api/v0"
V1 = "https://console.vast.ai/api/v1"
LIST_URL = f"{V1}/instances/"  # the instance list (v0's answers 410 to newer accounts)
IMAGE = "pytorch/pytorch:2.8.0-cuda12.8-cudnn9-devel"
OFFER_ID = 21614864
MACHINE_ID = 13429
INSTANCE_ID = 26070143
PUBLIC_IP = "203.0.113.45"
SSH_PORT = "41022"  # the host port Docker mapped to the container's 22, a string as Vast sends it


def offer(
    ask_id: int = OFFER_ID,
    *,
    gpu_name: str = "RTX 4090",
    num_gpus: int = 1,
    gpu_ram: int = 24564,
    dph_total: float = 0.3547,
    min_bid: float | None = 0.2113,
    machine_id: int = MACHINE_ID,
    geolocation: str = "Quebec, CA",
    **extra: Any,
) -> dict[str, Any]:
    """One ask as ``POST /bundles/`` lists it in ``offers``. ``gpu_ram`` is MiB per GPU
    (documented as MB; the figures are nvidia-smi's),
    ``disk_space`` GB free on the host, ``dph_total`` the on-demand $/h for GPU, disk and the
    rest, ``dph_base`` the GPU part alone."""
    return {
        "id": ask_id,
        "ask_contract_id": ask_id,
        "bundle_id": 523851397,
        "bundled_results": None,
        "machine_id": machine_id,
        "host_id": 91235,
        "gpu_name": gpu_name,
        "gpu_arch": "nvidia",
        "num_gpus": num_gpus,
        "gpu_ram": gpu_ram,
        "gpu_total_ram": gpu_ram * num_gpus,
        "gpu_frac": 1.0,
        "gpu_mem_bw": 933.5,
        "gpu_max_power": 450.0,
        "gpu_max_temp": 83.0,
        "gpu_display_active": False,
        "gpu_lanes": 16,
        "pcie_bw": 24.8,
        "pci_gen": 4.0,
        "bw_nvlink": 0.0,
        "compute_cap": 890,
        "total_flops": 82.6 * num_gpus,
        "dlperf": 73.2 * num_gpus,
        "dlperf_per_dphtotal": 206.4,
        "flops_per_dphtotal": 232.9,
        "cpu_name": "AMD EPYC 7B13 64-Core Processor",
        "cpu_arch": "amd64",
        "cpu_cores": 128,
        "cpu_cores_effective": 16.0 * num_gpus,
        "cpu_ghz": 3.5,
        "cpu_ram": 257655,
        "disk_space": 412.3,
        "disk_bw": 4015.2,
        "disk_name": "SAMSUNG MZQL23T8HCLS",
        "dph_total": dph_total,
        "dph_base": round(dph_total - 0.0147, 4),
        "storage_cost": 0.15,
        "storage_total_cost": 0.0147,
        "inet_up": 812.4,
        "inet_down": 904.7,
        "inet_up_cost": 0.0039,
        "inet_down_cost": 0.0039,
        "min_bid": min_bid,
        "is_bid": False,
        "reliability": 0.9962,
        "reliability2": 0.9962,
        "direct_port_count": 100,
        "cuda_max_good": 12.8,
        "driver_version": "570.124.06",
        "driver_vers": 570124006,
        "mobo_name": "ROMED8-2T",
        "os_version": "22.04",
        "has_avx": 1,
        "hosting_type": 1,
        "external": False,
        "geolocation": geolocation,
        "geolocode": 1036,
        "public_ipaddr": "198.51.100.20",
        "static_ip": True,
        "verification": "verified",
        "vericode": 1,
        "rentable": True,
        "rented": False,
        "start_date": 1767225600.0,
        "end_date": 1798761600.0,
        "duration": 31536000.0,
        "score": 224.7,
        "time_remaining": "",
        "time_remaining_isbid": "",
        "webpage": None,
        "vms_enabled": False,
        **extra,
    }


def instance(
    instance_id: int | str = INSTANCE_ID,
    actual_status: str | None = "running",
    *,
    label: str = contract.REQUEST.name,
    public_key: str = contract.REQUEST.ssh_public_key,
    status_msg: str | None = None,
    intended_status: str = "running",
    cur_state: str = "running",
    next_state: str = "running",
    dph_total: float = 0.3547,
    **extra: Any,
) -> dict[str, Any]:
    """One instance as ``GET /instances/`` lists it. ``ports`` only once the container runs;
    ``ssh_host``/``ssh_port`` are Vast's proxy, ``public_ipaddr`` plus the port mapped to
    ``22/tcp`` the direct address ssh_direct opens."""
    running = actual_status == "running"
    messages = {
        None: None,
        "loading": "Pulling image pytorch/pytorch:2.8.0-cuda12.8-cudnn9-devel",
        "created": "Creating container",
        "running": "success, running pytorch/pytorch_2.8.0-cuda12.8-cudnn9-devel/ssh",
        "exited": "Container exited with code 137",
        "offline": "host is offline",
    }
    return {
        "id": int(instance_id) if str(instance_id).isdigit() else instance_id,
        "machine_id": MACHINE_ID,
        "host_id": 91235,
        "bundle_id": 523851397,
        "label": label,
        "actual_status": actual_status,
        "intended_status": intended_status,
        "cur_state": cur_state,
        "next_state": next_state,
        "status_msg": status_msg if status_msg is not None else messages.get(actual_status),
        "image_uuid": IMAGE,
        "image_runtype": "ssh_direct ssh",
        "image_args": [],
        "onstart": vastai.ONSTART,
        "extra_env": [["TRAINHUB_SSH_PUBLIC_KEY", public_key]],
        "template_id": None,
        "template_hash_id": None,
        "jupyter_token": "5f0e8a1f3c6d4b2a9e7d",
        "public_ipaddr": PUBLIC_IP,
        "local_ipaddrs": "10.0.12.7 172.17.0.1\n",
        "ports": {"22/tcp": [{"HostIp": "0.0.0.0", "HostPort": SSH_PORT}]} if running else {},  # noqa: S104
        "direct_port_start": 41020,
        "direct_port_end": 41119,
        "direct_port_count": 100,
        "machine_dir_ssh_port": 41021,
        "ssh_host": "ssh5.vast.ai",
        "ssh_port": 30142,
        "ssh_idx": "5",
        "gpu_name": "RTX 4090",
        "num_gpus": 1,
        "gpu_ram": 24564,
        "gpu_totalram": 24564,
        "gpu_util": 0.0 if running else None,
        "gpu_temp": 41.0 if running else None,
        "cpu_name": "AMD EPYC 7B13 64-Core Processor",
        "cpu_cores": 128,
        "cpu_cores_effective": 16.0,
        "cpu_ram": 257655,
        "cpu_util": 0.3 if running else None,
        "mem_usage": 0.9 if running else None,
        "mem_limit": 32206.0,
        "disk_space": 80.0,
        "disk_usage": 21.4 if running else None,
        "vmem_usage": 0.0 if running else None,
        "cuda_max_good": 12.8,
        "driver_version": "570.124.06",
        "dph_total": dph_total,
        "dph_base": round(dph_total - 0.0147, 4),
        "storage_cost": 0.15,
        "storage_total_cost": 0.0147,
        "inet_up": 812.4,
        "inet_down": 904.7,
        "inet_up_billed": None,
        "inet_down_billed": None,
        "min_bid": 0.2113,
        "is_bid": False,
        "reliability2": 0.9962,
        "geolocation": "Quebec, CA",
        "verification": "verified",
        "start_date": 1790000000.0,
        "end_date": 1798761600.0,
        "duration": 8761600.0,
        "uptime_mins": 12.4 if running else None,
        "logo": "/static/logos/vastai_small2.png",
        "webpage": None,
        **extra,
    }


def listing(
    *instances: dict[str, Any], next_token: str | None = None, total: int | None = None
) -> dict[str, Any]:
    """One page of ``GET /api/v1/instances/`` (at most 25 rows; ``next_token`` while more
    remain), the rows as full instance objects (no ``select_cols``)."""
    labels: dict[str, int] = {}
    for row in instances:
        labels[str(row.get("label") or "")] = labels.get(str(row.get("label") or ""), 0) + 1
    return {
        "success": True,
        "instances_found": len(instances),
        "total_instances": len(instances) if total is None else total,
        "label_counts": labels,
        "next_token": next_token,
        "instances": list(instances),
    }


def created(instance_id: int = INSTANCE_ID) -> dict[str, Any]:
    """The ``PUT /asks/{id}/`` success answer."""
    return {
        "success": True,
        "new_contract": instance_id,
        "instance_api_key": "c2e1b2f09d0f4c1f8a5b4f0a3d9e1c77",
    }


def error(code: str, msg: str, **extra: Any) -> dict[str, Any]:
    """Vast's most common error shape."""
    return {"success": False, "error": code, "msg": msg, **extra}


def trainhub_offer(ask: dict[str, Any] | None = None) -> Offer:
    """The ``Offer`` placement would hand to launch for ``ask``."""
    ask = ask or offer()
    return Offer(
        target="vastai",
        offer_id=str(ask["id"]),
        gpu_name=ask["gpu_name"],
        gpu_count=ask["num_gpus"],
        vram_gb=ask["gpu_ram"] * vastai.MIB_IN_GB,
        price_per_hour=ask["dph_total"],
        spot_price_per_hour=vastai.api.bid(ask["min_bid"], ask["dph_total"]),
        region=ask["geolocation"],
        machine_id=str(ask["machine_id"]),
    )


# --- the contract case ------------------------------------------------------------------------


def _build(base_url: str, sleep: Sleep) -> ProviderAdapter:
    return vastai.VastAI(
        api_key=KEY,
        http=ProviderHTTP(provider="vastai", base_url=base_url, sleep=sleep),
        image=IMAGE,
    )


def _poll(ids: Sequence[str], raw: str) -> list[Exchange]:
    # The status map's "" is Vast's null (provisioning).
    listed = [instance(i, raw or None) for i in ids]
    return [Exchange("GET", LIST_URL, json=listing(*listed))]


VAST_CASE = Case(
    name="vastai",
    base_url=BASE,
    build=_build,
    instance_id=str(INSTANCE_ID),
    launch=Exchange("PUT", f"{BASE}/asks/{OFFER_ID}/", json=created()),
    # A launch first looks for an instance labelled with the attempt (a lost create answer).
    before_launch=(Exchange("GET", LIST_URL, json=listing()),),
    cancel=lambda i: Exchange("DELETE", f"{BASE}/instances/{i}/", json={"success": True}),
    poll=_poll,
    status_map=vastai.STATUS_MAP,
    # actual_status as Vast's show-instance reference lists it, null as "", and "created" and
    # "restarting", which SkyPilot's Vast provisioner sees.
    documented_statuses=frozenset(
        {
            "",
            "loading",
            "created",
            "running",
            "stopped",
            "frozen",
            "exited",
            "rebooting",
            "restarting",
            "unknown",
            "offline",
        }
    ),
    unauthorized=error("not_authorized", "Invalid user key"),
    not_found=error("no_such_instance", "Instance 4242 not found."),
    request=dataclasses.replace(contract.REQUEST, offer=trainhub_offer()),
)
