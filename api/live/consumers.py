"""The live endpoints: a job's events over WebSocket (``/ws/jobs/<id>``) and SSE (the events
route with ``?stream=true``), and a project's status changes over WebSocket (``/ws/jobs``).

A job stream sends ``{"type": <event type>, "seq": <event number>, "data": <the event as the
events route shows it>}`` (``status`` is the job's status; an executor's report of its attempt
is ``attempt_status``: live.stream_type) for every stored event after the cursor (``?after=<seq or event
id>``, or SSE's ``Last-Event-ID``), then live ones (api/live/feed.py); ``{"type": "resync",
"seq": n}`` when the connection fell behind and what follows is re-read from after ``n``.

WebSocket close codes: 4400 bad cursor, 4401 no valid API key (or revoked while open), 4404 no
such job in the key's project.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

from channels.generic.websocket import AsyncJsonWebsocketConsumer
from channels.layers import get_channel_layer
from django.conf import settings

from api import presenters
from api.live import auth
from api.live.feed import JobFeed, Recent, Resync, event_from_fields
from jobs.models import ApiKey, JobEvent, TrainingJob
from jobs.services.outbox import live
from jobs.states import TERMINAL

if TYPE_CHECKING:  # channels ships no type hints: its database_sync_to_async subclasses this
    from asgiref.sync import SyncToAsync as database_sync_to_async
else:
    from channels.db import database_sync_to_async

CLOSE_BAD_REQUEST = 4400
CLOSE_UNAUTHENTICATED = 4401
CLOSE_NOT_FOUND = 4404
SSE_KEEPALIVE_SECONDS = 15.0
SNAPSHOT_JOBS = 500


class BadCursor(ValueError):
    pass


def parse_cursor(value: str | None, job_public_id: str) -> int:
    """``after``/``Last-Event-ID``: an event number, or an event id of this job (what the
    events route returns); 0 (from the start) when absent."""
    if value is None or value == "":
        return 0
    number = value.removeprefix(f"ftevent-{job_public_id.removeprefix('ftjob-')}-")
    if not number.isascii() or not number.isdigit() or len(number) > 12:
        raise BadCursor(f"after: '{value[:80]}' is not an event number or an event id of this job.")
    return int(number)


def query_value(scope: dict[str, Any], name: str) -> str | None:
    values = parse_qs(scope.get("query_string", b"").decode("latin-1")).get(name)
    return values[-1] if values else None


# A message's rendering, shared by every watcher of the job in this process.
_rendered = Recent(4096)


def _socket_text(event: JobEvent, job_public_id: str) -> str:
    key = ("ws", event.job_id, event.number)
    if key not in _rendered:
        data = presenters.event_json(event, job_public_id)
        message = {"type": live.stream_type(event), "seq": event.number, "data": data}
        _rendered[key] = json.dumps(message)
    text: str = _rendered[key]
    return text


def _sse_frame(
    event: JobEvent, job_public_id: str, present: Callable[[JobEvent, str], dict[str, Any]]
) -> bytes:
    key = (present.__name__, event.job_id, event.number)
    if key not in _rendered:
        data = json.dumps(present(event, job_public_id), separators=(",", ":"))
        kind = live.stream_type(event)
        _rendered[key] = f"id: {event.number}\nevent: {kind}\ndata: {data}\n\n".encode()
    frame: bytes = _rendered[key]
    return frame


@database_sync_to_async
def _find_job(key: ApiKey, job_id: str) -> TrainingJob | None:
    if not job_id.isascii() or len(job_id) > 40:
        return None
    return TrainingJob.objects.filter(project_id=key.project_id, public_id=job_id).first()


class JobEventsSocket(AsyncJsonWebsocketConsumer):  # type: ignore[misc]  # channels: no hints
    """``/ws/jobs/<job_id>``."""

    close: Callable[[int], Awaitable[None]]  # the base's, as called here (channels: no hints)
    key: ApiKey
    job: TrainingJob
    feed: JobFeed | None = None
    _sender: asyncio.Task[None] | None = None

    async def connect(self) -> None:
        # Accepted first, so a refusal reaches the client as a close code, not a bare 403.
        await self.accept(auth.chosen_subprotocol(self.scope))
        key = await auth.authenticate(self.scope)
        if key is None:
            return await self.close(CLOSE_UNAUTHENTICATED)
        job = await _find_job(key, self.scope["url_route"]["kwargs"]["job_id"])
        if job is None:
            return await self.close(CLOSE_NOT_FOUND)
        try:
            after = parse_cursor(query_value(self.scope, "after"), job.public_id)
        except BadCursor:
            return await self.close(CLOSE_BAD_REQUEST)
        self.key, self.job, self.feed = key, job, JobFeed(job.pk, after)
        # Subscribe before the feed's first read: nothing committed after the read is missed.
        await self.channel_layer.group_add(live.job_group(job.pk), self.channel_name)
        auth.open_connections.add(key.pk, self, self._revoked)
        self._sender = asyncio.get_running_loop().create_task(self._send_feed(self.feed))

    async def disconnect(self, code: int) -> None:
        if self._sender is not None:
            self._sender.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._sender
        if self.feed is not None:
            auth.open_connections.discard(self.key.pk, self)
            await self.channel_layer.group_discard(live.job_group(self.job.pk), self.channel_name)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        """Clients only listen; anything they send is ignored."""

    async def dispatch(self, message: dict[str, Any]) -> None:
        """A live message only joins the feed's queue. Handled here, before channels' own
        dispatch, which first hops to the process's one sync thread to close old database
        connections: once per watcher per event, that hop was a third of the process's time."""
        if message["type"] == live.JOB_MESSAGE:
            if self.feed is not None:
                self.feed.offer(message)
            return
        await super().dispatch(message)

    async def _send_feed(self, feed: JobFeed) -> None:
        async for item in feed.events():
            if isinstance(item, Resync):
                await self.send_json({"type": "resync", "seq": item.seq})
            else:
                await self.send(text_data=_socket_text(item, self.job.public_id))

    async def _revoked(self) -> None:
        await self.close(CLOSE_UNAUTHENTICATED)


class JobEventsSSE:
    """``GET <events route>?stream=true`` (text/event-stream), a plain ASGI app: it listens on
    its own channel while it writes. ``id:`` is the event number, so a reconnecting client's
    ``Last-Event-ID`` resumes where it stopped."""

    # The events route's own shape: OpenAI's under /v1/fine_tuning/…, trainhub's on /api/v1/jobs/.
    present: Callable[[JobEvent, str], dict[str, Any]] = staticmethod(presenters.openai_event_json)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        key = await auth.authenticate(scope)
        if key is None:
            return await _json_error(send, 401, "Invalid or missing API key.", "invalid_api_key")
        job_id = scope["url_route"]["kwargs"]["job_id"]
        job = await _find_job(key, job_id)
        if job is None:
            return await _json_error(
                send, 404, f"No fine-tuning job '{job_id[:40]}'.", "job_not_found"
            )
        headers = auth.scope_headers(scope)
        try:
            after = parse_cursor(
                headers.get("last-event-id") or query_value(scope, "after"), job.public_id
            )
        except BadCursor as exc:
            return await _json_error(send, 400, str(exc), "invalid_value", param="after")
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"text/event-stream; charset=utf-8"),
                    (b"cache-control", b"no-cache"),
                    (b"x-accel-buffering", b"no"),  # proxies must not hold events back
                ],
            }
        )
        await _SSEStream(self.present, key, job, after, send).run(receive)


class _SSEStream:
    def __init__(
        self,
        present: Callable[[JobEvent, str], dict[str, Any]],
        key: ApiKey,
        job: TrainingJob,
        after: int,
        send: Any,
    ) -> None:
        self.present, self.key, self.job, self._send = present, key, job, send
        self.feed = JobFeed(job.pk, after)
        self._lock = asyncio.Lock()
        self._revoked = asyncio.Event()

    async def run(self, receive: Any) -> None:
        layer = get_channel_layer()
        channel = await layer.new_channel()
        group = live.job_group(self.job.pk)
        # Subscribe before the feed's first read: nothing committed after the read is missed.
        await layer.group_add(group, channel)
        auth.open_connections.add(self.key.pk, self, self._on_revoked)
        loop = asyncio.get_running_loop()
        tasks = [
            loop.create_task(self._listen(layer, channel)),
            loop.create_task(self._write_feed()),
            loop.create_task(self._keep_alive()),
            loop.create_task(_until_disconnect(receive)),
            loop.create_task(self._revoked.wait()),
        ]
        try:
            await self._write(b": stream of " + self.job.public_id.encode() + b"\n")
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            auth.open_connections.discard(self.key.pk, self)
            await layer.group_discard(group, channel)
        if self._revoked.is_set():
            await self._write(b'event: error\ndata: {"error":{"code":"invalid_api_key"}}\n\n')
        with contextlib.suppress(Exception):  # the client may be gone already
            await self._send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _listen(self, layer: Any, channel: str) -> None:
        while True:
            message = await layer.receive(channel)
            if message.get("type") == live.JOB_MESSAGE:
                self.feed.offer(message)

    async def _write_feed(self) -> None:
        async for item in self.feed.events():
            if isinstance(item, Resync):
                await self._write(f'event: resync\ndata: {{"seq":{item.seq}}}\n\n'.encode())
                continue
            await self._write(_sse_frame(item, self.job.public_id, self.present))

    async def _keep_alive(self) -> None:
        while True:
            await asyncio.sleep(SSE_KEEPALIVE_SECONDS)
            # A comment line alone: no blank line after it, which some clients (httpx-sse
            # 0.4) would read as an empty event.
            await self._write(b": keep-alive\n")

    async def _write(self, chunk: bytes) -> None:
        async with self._lock:
            await self._send({"type": "http.response.body", "body": chunk, "more_body": True})

    async def _on_revoked(self) -> None:
        self._revoked.set()


async def _until_disconnect(receive: Any) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _json_error(
    send: Any, status: int, message: str, code: str, param: str | None = None
) -> None:
    error = {"message": message, "type": "invalid_request_error", "param": param, "code": code}
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json")],
        }
    )
    await send({"type": "http.response.body", "body": json.dumps({"error": error}).encode()})


@database_sync_to_async
def _status_snapshot(project_id: int) -> list[dict[str, Any]]:
    jobs = (
        TrainingJob.objects.filter(project_id=project_id)
        .exclude(status__in=TERMINAL)
        .order_by("-pk")
        .values("public_id", "status", "event_counter")[:SNAPSHOT_JOBS]
    )
    return [
        {"type": "status", "job": j["public_id"], "seq": j["event_counter"],
         "data": {"status": j["status"], "snapshot": True}}
        for j in jobs
    ]  # fmt: skip


class NativeJobEventsSSE(JobEventsSSE):
    present = staticmethod(presenters.event_json)


class ProjectJobsSocket(AsyncJsonWebsocketConsumer):  # type: ignore[misc]  # channels: no hints
    """``/ws/jobs``: a snapshot of the project's unfinished jobs (``data.snapshot: true``), then
    every job's status changes as ``{"type": "status", "job", "seq", "data": <event>}``. ``seq``
    is the job's event number: a change with a seq at or below what a client has is old. A
    connection that falls behind its bounded queue gets ``{"type": "resync"}`` and a fresh
    snapshot."""

    close: Callable[[int], Awaitable[None]]  # the base's, as called here (channels: no hints)
    key: ApiKey | None = None
    _queue: asyncio.Queue[Any] | None = None
    _sender: asyncio.Task[None] | None = None

    async def connect(self) -> None:
        await self.accept(auth.chosen_subprotocol(self.scope))
        self.key = await auth.authenticate(self.scope)
        if self.key is None:
            return await self.close(CLOSE_UNAUTHENTICATED)
        self._queue = asyncio.Queue(maxsize=settings.TRAINHUB_LIVE_BUFFER_MESSAGES)
        await self.channel_layer.group_add(
            live.project_group(self.key.project_id), self.channel_name
        )
        auth.open_connections.add(self.key.pk, self, self._revoked)
        sending = self._send_changes(self._queue, self.key.project_id)
        self._sender = asyncio.get_running_loop().create_task(sending)

    async def disconnect(self, code: int) -> None:
        if self._sender is not None:
            self._sender.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._sender
        if self.key is not None:
            auth.open_connections.discard(self.key.pk, self)
            await self.channel_layer.group_discard(
                live.project_group(self.key.project_id), self.channel_name
            )

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        """Clients only listen."""

    async def dispatch(self, message: dict[str, Any]) -> None:
        """A status change only joins the bounded queue (as JobEventsSocket.dispatch)."""
        if message["type"] == live.PROJECT_MESSAGE:
            if self._queue is not None:
                _offer(self._queue, message)
            return
        await super().dispatch(message)

    async def _send_changes(self, queue: asyncio.Queue[Any], project_id: int) -> None:
        for snapshot in await _status_snapshot(project_id):
            await self.send_json(snapshot)
        while True:
            message = await queue.get()
            if message is _RESYNC:
                await self.send_json({"type": "resync"})
                for snapshot in await _status_snapshot(project_id):
                    await self.send_json(snapshot)
                continue
            event = event_from_fields(message["job_pk"], message["event"])
            data = presenters.event_json(event, message["job"])
            await self.send_json(
                {"type": "status", "job": message["job"], "seq": event.number, "data": data}
            )

    async def _revoked(self) -> None:
        await self.close(CLOSE_UNAUTHENTICATED)


_RESYNC = object()


def _offer(queue: asyncio.Queue[Any], message: dict[str, Any]) -> None:
    """Queue without waiting; a full queue is emptied and answered with one resync."""
    try:
        queue.put_nowait(message)
    except asyncio.QueueFull:
        while not queue.empty():
            queue.get_nowait()
        queue.put_nowait(_RESYNC)
