"""The own GPU fleet as the service tests build it (test_services_nodes, test_services_dispatch,
test_gpu_needs and the fleet fixtures in conftest.py): GPUs as nvidia-smi reports them, a node
registered and idle, and the run_attempt messages the dispatcher sent."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.utils import timezone

from jobs.models import GpuNode, JobAttempt, TrainingJob
from jobs.services.fleet import nodes
from trainhub_contract import celery_conf as cc

N = GpuNode.Status

# As nvidia-smi reports them (memory.total in MiB).
H100 = {"name": "NVIDIA H100 80GB HBM3", "vram_mb": 81559}
A100_40 = {"name": "NVIDIA A100-SXM4-40GB", "vram_mb": 40960}
RTX_24 = {"name": "NVIDIA GeForce RTX 3090", "vram_mb": 24576}
T4 = {"name": "Tesla T4", "vram_mb": 15360}


def node_report(gpus: tuple[dict, ...] = (), labels: dict | None = None, **extra: Any) -> dict:
    return {
        "capabilities": {
            "gpus": [dict(g) for g in gpus],
            "gpu_count": len(gpus),
            "backend": "peft",
        },
        "labels": labels or {},
        **extra,
    }


def online_node(name: str, *gpus: dict, **labels: str) -> tuple[GpuNode, str]:
    """A node created, registered and idle; returns it with its token."""
    node, token = nodes.node_create(name=name, actor="ops")
    nodes.node_register(node=node, report=node_report(gpus, labels, celery_hostname=f"node@{name}"))
    node.refresh_from_db()
    assert node.status == N.IDLE
    return node, token


def node_status(node: GpuNode) -> str:
    return GpuNode.objects.values_list("status", flat=True).get(pk=node.pk)


def attempt_of(job: TrainingJob, number: int = 1) -> JobAttempt:
    return JobAttempt.objects.get(job=job, number=number)


def run_messages(sent: Any) -> list[tuple[str | None, dict[str, Any]]]:
    """(queue, message) of every run_attempt sent."""
    return [
        (queue, args[0])
        for (name, args), queue in zip(sent.calls, sent.queues, strict=True)
        if name == cc.RUN_ATTEMPT
    ]


def expire_lease(attempt: JobAttempt) -> None:
    JobAttempt.objects.filter(pk=attempt.pk).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1)
    )
