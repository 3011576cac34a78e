"""jobs.gpu_needs, pure: a job's GPU needs parsed with the bad field named (``parse_gpu``), and
why a node cannot run a job (``misfit``: GPU count, memory per GPU, name glob, labels)."""

from __future__ import annotations

import pytest

from jobs.errors import InvalidRequest
from jobs.gpu_needs import misfit, parse_gpu
from jobs.models import GpuNode
from tests.support.factories import GpuNodeFactory
from tests.support.fleet import A100_40, H100, RTX_24, T4


def _machine(*gpus: dict, **labels: str) -> GpuNode:
    """An unsaved node as misfit sees it."""
    return GpuNodeFactory.build(
        name="m", capabilities={"gpu_count": len(gpus), "gpus": list(gpus)}, labels=labels
    )


# --- misfit -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("gpu", "selector", "node", "why"),
    [
        pytest.param({}, {}, _machine(), None, id="no-needs-fit-a-cpu-node"),
        pytest.param({"count": 1}, {}, _machine(), "has 0 GPU(s), the job needs 1", id="cpu-node"),
        pytest.param({"count": 2}, {}, _machine(H100), "has 1 GPU(s), the job needs 2", id="count"),
        pytest.param({"count": 2}, {}, _machine(H100, H100), None, id="count-met"),
        # vram_mb is MiB, min_vram_gb is GB: 24576 MiB and 40960 MiB meet 24 and 40.
        pytest.param({"count": 1, "min_vram_gb": 24}, {}, _machine(RTX_24), None, id="vram-24"),
        pytest.param({"count": 1, "min_vram_gb": 40}, {}, _machine(A100_40), None, id="vram-40"),
        pytest.param(
            {"count": 1, "min_vram_gb": 24}, {}, _machine(T4), "the job needs 24 GB", id="vram-low"
        ),
        # Per GPU, never summed: two 40 GB GPUs are not one 80 GB GPU.
        pytest.param(
            {"count": 1, "min_vram_gb": 80},
            {},
            _machine(A100_40, A100_40),
            "the job needs 80 GB",
            id="vram-per-gpu",
        ),
        pytest.param(
            {"count": 2, "min_vram_gb": 40}, {}, _machine(A100_40, A100_40), None, id="vram-each"
        ),
        pytest.param({"count": 1, "name": "*H100*"}, {}, _machine(H100), None, id="name-glob"),
        pytest.param(
            {"count": 1, "name": "*H100*"},
            {},
            _machine(T4),
            "has Tesla T4, the job needs *H100*",
            id="name-glob-miss",
        ),
        pytest.param({}, {"region": "eu-*"}, _machine(), "has no label region", id="label-missing"),
        pytest.param(
            {},
            {"region": "eu-*"},
            _machine(region="us-east"),
            "label region=us-east does not match eu-*",
            id="label-mismatch",
        ),
        pytest.param({}, {"region": "eu-*"}, _machine(region="eu-west"), None, id="label-glob"),
        pytest.param(
            {},
            {"region": "eu-*", "tier": "spot"},
            _machine(region="eu-west"),
            "has no label tier",
            id="every-label-needed",
        ),
    ],
)
def test_misfit_says_why_a_node_cannot_run_a_job(gpu, selector, node, why) -> None:
    found = misfit(gpu, selector, node)
    if why is None:
        assert found is None
    else:
        assert found is not None and why in found, found


def test_an_80gb_h100_satisfies_min_vram_gb_80() -> None:
    assert misfit({"count": 1, "min_vram_gb": 80}, {}, _machine(H100)) is None


# --- parse_gpu --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (None, {}),
        ({}, {}),
        ({"count": 0}, {"count": 0}),
        ({"name": "*H100*"}, {"name": "*H100*", "count": 1}),
        ({"min_vram_gb": 24}, {"min_vram_gb": 24, "count": 1}),
        ({"min_vram_gb": 40.5, "count": 2}, {"min_vram_gb": 40.5, "count": 2}),
    ],
)
def test_parse_gpu_normalises_a_name_or_vram_without_count_to_one_gpu(given, expected) -> None:
    assert parse_gpu(given) == expected


@pytest.mark.parametrize(
    ("given", "param"),
    [
        ("H100", "gpu"),
        ([1], "gpu"),
        ({"gpus": 1}, "gpu"),
        ({"count": "2"}, "gpu.count"),
        ({"count": True}, "gpu.count"),
        ({"count": 1.5}, "gpu.count"),
        ({"count": -1}, "gpu.count"),
        ({"count": 65}, "gpu.count"),
        ({"min_vram_gb": 0}, "gpu.min_vram_gb"),
        ({"min_vram_gb": "24"}, "gpu.min_vram_gb"),
        ({"min_vram_gb": False}, "gpu.min_vram_gb"),
        ({"min_vram_gb": float("inf")}, "gpu.min_vram_gb"),
        ({"min_vram_gb": float("nan")}, "gpu.min_vram_gb"),
        ({"name": ""}, "gpu.name"),
        ({"name": 5}, "gpu.name"),
        ({"name": "H100\n"}, "gpu.name"),
    ],
)
def test_parse_gpu_names_the_bad_field(given, param) -> None:
    with pytest.raises(InvalidRequest) as raised:
        parse_gpu(given)
    assert raised.value.param == param
