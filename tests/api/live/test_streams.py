"""A job's events over real WebSocket (``websockets``) and SSE (``httpx-sse``) connections to
the stream process: the stored ones after a cursor, then live ones, with the seqs the events
route shows; the refusals at the door."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import threading
import time
from typing import Any

import httpx
import pytest
from httpx_sse import connect_sse
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from jobs.models import JobEvent
from jobs.services.accounts.projects import api_key_revoke
from jobs.services.core.events import event_append
from tests.support.processes import STREAM_BUFFER_MESSAGES as BUFFER_MESSAGES

pytestmark = [pytest.mark.django_db(transaction=True)]


def stored_numbers(job) -> list[int]:
    return list(
        JobEvent.objects.filter(job=job).order_by("number").values_list("number", flat=True)
    )


def append(job, count: int, type: str = "log", size: int = 0) -> None:
    """``count`` events; ``size`` bytes of incompressible padding each (the socket deflates)."""
    for i in range(count):
        pad = base64.b64encode(os.urandom(size * 3 // 4)).decode()
        event_append(job=job, type=type, message=f"line {i}", data={"pad": pad})


def bearer(raw: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {raw}"}


async def receive_until(ws, last: int, timeout: float = 20) -> list[dict[str, Any]]:
    """Messages until one with seq ``last``; fails when none comes for ``timeout`` seconds (a
    stall, not a busy machine's slower pace)."""
    got: list[dict[str, Any]] = []
    while True:
        message = json.loads(await asyncio.wait_for(ws.recv(), timeout))
        got.append(message)
        if message.get("seq") == last and message["type"] != "resync":
            return got


async def close_code(ws, timeout: float = 15) -> int | None:
    async with asyncio.timeout(timeout):
        try:
            while True:
                await ws.recv()
        except ConnectionClosed:
            return ws.close_code


# --- WebSocket --------------------------------------------------------------------------------


def test_socket_sends_stored_events_then_live_ones_with_the_stored_seqs(
    stream_server, make_job, user, key_of
) -> None:
    job = make_job()
    append(job, 3)

    raw, first_last = key_of(user), stored_numbers(job)[-1]

    async def watch() -> list[dict[str, Any]]:
        url = f"{stream_server.ws_url}/ws/jobs/{job.public_id}"
        async with connect(url, additional_headers=bearer(raw)) as ws:
            first = await receive_until(ws, first_last)
            await asyncio.to_thread(append, job, 5, "metrics")
            return first + await receive_until(ws, first_last + 5)

    messages = asyncio.run(watch())
    assert [m["seq"] for m in messages] == stored_numbers(job)
    stored = {e.number: e for e in JobEvent.objects.filter(job=job)}
    for m in messages:
        assert m["type"] == stored[m["seq"]].type
        assert m["data"]["id"].endswith(f"-{m['seq']}")
        assert m["data"]["message"] == stored[m["seq"]].message
    assert [m["type"] for m in messages][-5:] == ["metrics"] * 5


def test_socket_resumes_after_a_seq_or_an_event_id(stream_server, make_job, user, key_of) -> None:
    job = make_job()
    append(job, 4)
    numbers = stored_numbers(job)
    event_id = f"ftevent-{job.public_id.removeprefix('ftjob-')}-{numbers[1]}"

    raw = key_of(user)

    async def watch(after: str) -> list[int]:
        url = f"{stream_server.ws_url}/ws/jobs/{job.public_id}?after={after}"
        async with connect(url, additional_headers=bearer(raw)) as ws:
            return [m["seq"] for m in await receive_until(ws, numbers[-1])]

    assert asyncio.run(watch(str(numbers[2]))) == numbers[3:]
    assert asyncio.run(watch(event_id)) == numbers[2:]


def test_no_gap_and_no_duplicate_while_events_arrive_during_the_handover(
    stream_server, make_job, user, key_of
) -> None:
    """Watchers connect (with and without a cursor) while a producer appends as fast as it can:
    each receives every number after its cursor exactly once, in order."""
    job = make_job()
    append(job, 20)
    raw = key_of(user)
    final: list[int] = []  # the last number, once the producer is done

    async def watch(after: int) -> list[int]:
        url = f"{stream_server.ws_url}/ws/jobs/{job.public_id}?after={after}"
        seqs: list[int] = []
        async with connect(url, additional_headers=bearer(raw)) as ws, asyncio.timeout(60):
            while not (final and seqs and seqs[-1] >= final[0]):
                try:
                    message = json.loads(await asyncio.wait_for(ws.recv(), 0.5))
                except TimeoutError:
                    continue
                assert message["type"] != "resync"
                seqs.append(message["seq"])
        return seqs

    async def main() -> list[list[int]]:
        producer = asyncio.create_task(asyncio.to_thread(append, job, 300))
        watchers = []
        for i in range(8):  # staggered connects, each mid-production
            watchers.append(asyncio.create_task(watch(after=i * 3)))
            await asyncio.sleep(0.05)
        await producer
        final.append((await asyncio.to_thread(stored_numbers, job))[-1])
        return await asyncio.gather(*watchers)

    results = asyncio.run(main())
    numbers = stored_numbers(job)
    for i, seqs in enumerate(results):
        assert seqs == [n for n in numbers if n > i * 3], f"watcher {i}"


def test_a_client_that_stops_reading_gets_resync_and_misses_nothing(
    stream_server, make_job, user, key_of
) -> None:
    """A watcher that does not read fills its bounded buffer; it is told ``resync`` and re-read
    from its last seq. A second, reading watcher of the same job gets every event in order
    meanwhile, without a resync."""
    job = make_job()
    raw = key_of(user)
    count, before = 2500, len(stored_numbers(job))

    async def main() -> tuple[list[dict[str, Any]], list[int]]:
        url = f"{stream_server.ws_url}/ws/jobs/{job.public_id}"
        async with (
            # No keepalive pings from a client that does not read: it would not see the pong
            # while the flood lasts, longer on a busy machine, and close the socket itself.
            connect(url, additional_headers=bearer(raw), max_queue=1, ping_interval=None) as slow,
            connect(url, additional_headers=bearer(raw)) as fast,
        ):
            await asyncio.sleep(0.3)  # both subscribed
            producer = asyncio.create_task(asyncio.to_thread(append, job, count, "log", 15000))
            fast_seqs: list[int] = []
            while len(fast_seqs) < count + before:  # each message within 30 s: no stall
                message = json.loads(await asyncio.wait_for(fast.recv(), 30))
                assert message["type"] != "resync"
                fast_seqs.append(message["seq"])
            await producer
            last = (await asyncio.to_thread(stored_numbers, job))[-1]
            return await receive_until(slow, last, timeout=90), fast_seqs

    slow_messages, fast_seqs = asyncio.run(main())
    numbers = stored_numbers(job)
    assert fast_seqs == numbers
    resyncs = [m for m in slow_messages if m["type"] == "resync"]
    assert resyncs, "the slow watcher was never told to resync"
    # After each resync the seqs continue from the resync's seq: nothing skipped, no repeats.
    delivered: list[int] = []
    for m in slow_messages:
        if m["type"] == "resync":
            assert m["seq"] == (delivered[-1] if delivered else 0)
        else:
            delivered.append(m["seq"])
    assert delivered == numbers
    assert count > BUFFER_MESSAGES


def test_socket_refusals(stream_server, make_job, make_user, user, key_of) -> None:
    job = make_job()
    stranger = key_of(make_user("mallory"))  # a member of another project only

    async def code(path: str, headers: dict[str, str] | None = None) -> int | None:
        async with connect(f"{stream_server.ws_url}{path}", additional_headers=headers) as ws:
            return await close_code(ws)

    path = f"/ws/jobs/{job.public_id}"
    raw = key_of(user)
    assert asyncio.run(code(path)) == 4401  # no key
    assert asyncio.run(code(path, {"Authorization": "Bearer sk-not-a-key"})) == 4401
    assert asyncio.run(code(f"{path}?api_key={raw}")) == 4401  # never a key in the URL
    assert asyncio.run(code(path, bearer(stranger))) == 4404  # another project's job
    assert asyncio.run(code("/ws/jobs/ftjob-nosuchjob", bearer(raw))) == 4404
    assert asyncio.run(code(f"{path}?after=-1", bearer(raw))) == 4400
    assert asyncio.run(code(f"{path}?after=ftevent-other-3", bearer(raw))) == 4400


def test_a_revoked_key_s_open_sockets_close_within_10_s(
    stream_server, make_job, user, key_of
) -> None:
    from jobs.services.accounts.projects import api_key_create

    job = make_job()
    key, raw = api_key_create(user=user, name="to revoke")

    async def main() -> tuple[int | None, float]:
        async with connect(
            f"{stream_server.ws_url}/ws/jobs/{job.public_id}", additional_headers=bearer(raw)
        ) as ws:
            await asyncio.sleep(0.5)
            await asyncio.to_thread(api_key_revoke, key=key)
            started = time.monotonic()
            return await close_code(ws, timeout=15), time.monotonic() - started

    code, waited = asyncio.run(main())
    assert code == 4401
    assert waited <= 10


def test_a_browser_can_send_its_key_as_a_subprotocol(stream_server, make_job, user, key_of):
    job = make_job()
    append(job, 2)
    raw = key_of(user)

    async def main() -> tuple[str | None, list[int]]:
        async with connect(
            f"{stream_server.ws_url}/ws/jobs/{job.public_id}",
            subprotocols=["trainhub.v1", f"trainhub.bearer.{raw}"],
        ) as ws:
            return ws.subprotocol, [m["seq"] for m in await receive_until(ws, 2)]

    protocol, seqs = asyncio.run(main())
    assert protocol == "trainhub.v1"
    assert seqs == [1, 2]


def test_project_socket_sends_a_snapshot_then_status_changes(
    stream_server, make_job, user, key_of
) -> None:
    from jobs.services.core.jobs import job_cancel

    job = make_job()
    raw = key_of(user)

    async def main() -> list[dict[str, Any]]:
        async with connect(f"{stream_server.ws_url}/ws/jobs", additional_headers=bearer(raw)) as ws:
            got = [json.loads(await asyncio.wait_for(ws.recv(), 10))]
            await asyncio.to_thread(append, job, 3)  # not status changes: not sent here
            await asyncio.to_thread(lambda: job_cancel(job=job))
            while got[-1]["data"].get("data", {}).get("status") != "cancelled":
                got.append(json.loads(await asyncio.wait_for(ws.recv(), 10)))
            return got

    snapshot, *changes = asyncio.run(main())
    assert snapshot["job"] == job.public_id
    assert snapshot["data"] == {"status": "queued", "snapshot": True}
    status_events = JobEvent.objects.filter(
        job=job, type="status", number__gt=snapshot["seq"]
    ).order_by("number")
    assert [c["seq"] for c in changes] == [e.number for e in status_events]
    for change, event in zip(changes, status_events, strict=True):
        assert change["type"] == "status" and change["job"] == job.public_id
        assert change["data"]["message"] == event.message
        assert change["data"]["data"] == event.data


# --- SSE --------------------------------------------------------------------------------------


def sse_events(url: str, headers: dict[str, str], until: int, timeout: float = 20):
    got = []
    with (
        httpx.Client(timeout=timeout) as client,
        connect_sse(client, "GET", url, headers=headers) as source,
    ):
        source.response.raise_for_status()
        assert source.response.headers["content-type"].startswith("text/event-stream")
        for sse in source.iter_sse():
            got.append(sse)
            if sse.id == str(until):
                return got
    return got


def test_sse_streams_the_events_route_and_resumes_with_last_event_id(
    stream_server, make_job, user, key_of
) -> None:
    job = make_job()
    append(job, 3)
    headers = bearer(key_of(user))
    url = f"{stream_server.url}/v1/fine_tuning/jobs/{job.public_id}/events?stream=true"
    numbers = stored_numbers(job)

    events = sse_events(url, headers, until=numbers[-1])
    assert [int(e.id) for e in events] == numbers
    first = events[0].json()
    assert first["object"] == "fine_tuning.job.event"
    assert first["id"] == f"ftevent-{job.public_id.removeprefix('ftjob-')}-{numbers[0]}"
    assert {e.event for e in events} <= {"status", "log"}

    # Reconnect where the last one stopped, while more arrive.
    threading.Timer(0.5, append, args=(job, 2, "metrics")).start()
    more = sse_events(url, {**headers, "Last-Event-ID": str(numbers[-1])}, until=numbers[-1] + 2)
    assert [int(e.id) for e in more] == [numbers[-1] + 1, numbers[-1] + 2]
    assert more[0].event == "metrics"
    assert more[0].json()["type"] == "metrics"  # OpenAI's shape on OpenAI's path

    native = f"{stream_server.url}/api/v1/jobs/{job.public_id}/events?stream=true&after=2"
    assert [int(e.id) for e in sse_events(native, headers, until=numbers[-1])] == numbers[2:]


def test_sse_refusals_are_json_errors(stream_server, make_job, make_user, user, key_of) -> None:
    job = make_job()
    url = f"{stream_server.url}/v1/fine_tuning/jobs/{job.public_id}/events?stream=true"
    answers = {
        "no key": httpx.get(url),
        "stranger": httpx.get(url, headers=bearer(key_of(make_user("mallory")))),
        "bad cursor": httpx.get(url, headers={**bearer(key_of(user)), "Last-Event-ID": "x"}),
        "not a stream": httpx.get(f"{stream_server.url}/v1/files", headers=bearer(key_of(user))),
    }
    assert {k: r.status_code for k, r in answers.items()} == {
        "no key": 401, "stranger": 404, "bad cursor": 400, "not a stream": 404,
    }  # fmt: skip
    for r in answers.values():
        assert set(r.json()["error"]) == {"message", "type", "param", "code"}
    assert answers["bad cursor"].json()["error"]["param"] == "after"


def test_the_web_process_names_the_stream_server_for_stream_true(api, make_job) -> None:
    job = make_job()
    r = api.get(f"/v1/fine_tuning/jobs/{job.public_id}/events?stream=true")
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "stream_not_served_here"
    assert "stream" in r.json()["error"]["message"]


def test_a_project_watcher_that_stops_reading_gets_resync_and_a_fresh_snapshot(
    stream_server, make_job, user, key_of
) -> None:
    """Status changes pile up for a project socket that does not read (published straight to
    the project's group, large enough to fill the socket's buffers): it is told ``resync`` and
    sent a new snapshot, and its queue never holds more than its bound."""
    from jobs.services.outbox import live

    job = make_job()
    raw = key_of(user)
    status = JobEvent.objects.filter(job=job, type="status").latest("number")
    fields = {**live.event_fields(status), "data": {"status": "queued", "pad": ""}}
    flood = [
        (live.project_group(job.project_id),
         {"type": live.PROJECT_MESSAGE, "job": job.public_id, "job_pk": job.pk,
          "event": {**fields, "data": {**fields["data"], "pad": os.urandom(6000).hex()}}})
        for _ in range(4000)
    ]  # fmt: skip

    async def main() -> list[dict[str, Any]]:
        url = f"{stream_server.ws_url}/ws/jobs"
        # No keepalive pings: the client does not read the pong while it is not reading.
        async with connect(
            url, additional_headers=bearer(raw), max_queue=1, ping_interval=None
        ) as ws:
            first = json.loads(await asyncio.wait_for(ws.recv(), 10))  # the snapshot
            await asyncio.to_thread(live._send_all, flood)
            await asyncio.sleep(2)  # not reading meanwhile
            got = [first]
            async with asyncio.timeout(60):
                while not (got[-1]["type"] == "status" and got[-1]["data"].get("snapshot")
                           and any(m["type"] == "resync" for m in got)):  # fmt: skip
                    got.append(json.loads(await ws.recv()))
            return got

    messages = asyncio.run(main())
    kinds = [m["type"] for m in messages]
    assert messages[0]["data"] == {"status": "queued", "snapshot": True}
    assert "resync" in kinds
    after = messages[kinds.index("resync") + 1]
    assert after["job"] == job.public_id and after["data"]["snapshot"] is True
    assert len(messages) < len(flood)  # the backlog was dropped, not delivered late
