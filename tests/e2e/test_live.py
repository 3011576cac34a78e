"""A tiny job on a real GPU node process, watched from created to succeeded over every live
channel at once — a WebSocket, an SSE stream, a WebSocket that drops mid-job and comes back
with ``after``, and the project's status socket — each compared with the stored events."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import httpx
import pytest
from httpx_sse import connect_sse
from websockets.asyncio.client import connect

from jobs.models import GpuNode, JobEvent, TrainingJob
from jobs.services.accounts.projects import api_key_create
from jobs.services.fleet.nodes import node_create
from jobs.services.outbox.live import stream_type
from tests.e2e.conftest import submit_tiny_job, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]
TIMEOUT = 240
TERMINAL = {"succeeded", "failed", "cancelled"}


def _ends(message: dict[str, Any]) -> bool:
    return message["type"] == "status" and message["data"]["data"].get("status") in TERMINAL


async def _next(ws: Any) -> dict[str, Any]:
    """The next message; fails only when none comes for TIMEOUT seconds (the wait follows the
    job's progress, not a wall clock a busy machine would overrun)."""
    return json.loads(await asyncio.wait_for(ws.recv(), TIMEOUT))


async def _socket(url: str, headers: dict[str, str], stop_after_metrics: bool = False):
    """(type, seq) of each message until the job ends (or its first metrics event)."""
    got: list[tuple[str, int]] = []
    async with connect(url, additional_headers=headers) as ws:
        while True:
            message = await _next(ws)
            got.append((message["type"], message["seq"]))
            if _ends(message) or (stop_after_metrics and message["type"] == "metrics"):
                return got


async def _project(url: str, headers: dict[str, str], job_id: str) -> list[int]:
    seqs: list[int] = []
    async with connect(url, additional_headers=headers) as ws:
        while True:
            message = await _next(ws)
            if message["job"] != job_id or message["data"].get("snapshot"):
                continue
            seqs.append(message["seq"])
            if message["data"]["data"].get("status") in TERMINAL:
                return seqs


def _sse(url: str, headers: dict[str, str], out: list[tuple[str, int]]) -> None:
    with (
        httpx.Client(timeout=TIMEOUT) as client,
        connect_sse(client, "GET", url, headers=headers) as source,
    ):
        for sse in source.iter_sse():
            out.append((sse.event, int(sse.id)))
            if sse.event == "status" and sse.json()["data"].get("status") in TERMINAL:
                return


def test_a_job_watched_live_over_every_channel_matches_its_stored_events(
    plane, start_node, stream_server, api, user, demo_dataset, tiny_model_dir
) -> None:
    _, token = node_create(name="node-live", actor="test")
    node = start_node("node-live", token)
    idle = GpuNode.objects.filter(name="node-live", status="idle")
    wait_for("node-live to register", idle.exists, 60, node, plane)
    _, raw = api_key_create(user=user, name="watcher")
    headers = {"Authorization": f"Bearer {raw}"}
    job_id = submit_tiny_job(api, tiny_model_dir, demo_dataset, target="local")
    ws_job = f"{stream_server.ws_url}/ws/jobs/{job_id}"
    sse_seen: list[tuple[str, int]] = []
    sse = threading.Thread(
        target=_sse,
        args=(f"{stream_server.url}/v1/fine_tuning/jobs/{job_id}/events?stream=true", headers,
              sse_seen),
    )  # fmt: skip
    sse.start()

    async def watch() -> tuple[list, list, list, list]:
        project = asyncio.create_task(_project(f"{stream_server.ws_url}/ws/jobs", headers, job_id))
        whole = asyncio.create_task(_socket(ws_job, headers))
        first = await _socket(ws_job, headers, stop_after_metrics=True)
        rest = await _socket(f"{ws_job}?after={first[-1][1]}", headers)
        return await whole, first, rest, await project

    whole, first, rest, project = asyncio.run(watch())
    sse.join(TIMEOUT)
    job = TrainingJob.objects.get(public_id=job_id)
    assert job.status == "succeeded", (job.error_code, job.error_message, node.tail())
    events = JobEvent.objects.filter(job=job).order_by("number")
    stored = [(stream_type(e), e.number) for e in events]
    upto = [s for s in stored if s[1] <= whole[-1][1]]  # what was stored when it ended
    assert whole == upto
    assert [n for _, n in sse_seen] == [n for _, n in upto]
    assert first + rest == upto  # dropped after the first metrics, resumed with after=
    assert any(t == "metrics" for t, _ in whole)
    # The project socket, opened after the job was created, saw each later status change.
    status_numbers = [n for t, n in upto if t == "status"]
    assert project == status_numbers[-len(project) :]
    assert len(project) >= 3  # provisioning, running, ..., succeeded
