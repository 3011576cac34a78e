"""One watcher's view of a job's events: the stored ones after its cursor, then live ones, in
order, with no gap and no duplicate, whatever the channel layer does.

Events are numbered per job without gaps (jobs/services/core/events.py), so the feed needs no
handshake with the producers: it subscribes first, then reads the database, and from then on a
live message is sent on when it holds the next number, skipped when it holds old ones, and
answered with a database read when it skips ahead (a message that was late, lost or too large
to carry its events). Lost messages with nothing after them are caught by a periodic check of
the job's event counter.

Backpressure: live messages wait in a bounded queue that the channel layer's handler fills
without ever blocking. A watcher whose connection cannot keep up fills it; the queue is then
emptied, the watcher is told ``resync`` and re-read from its last number at the pace its
connection takes. Producers and other watchers never wait for a slow one.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.conf import settings

from api.live.background import ensure_running
from jobs.models import JobEvent, TrainingJob

if TYPE_CHECKING:  # channels ships no type hints: its database_sync_to_async subclasses this
    from asgiref.sync import SyncToAsync as database_sync_to_async
else:
    from channels.db import database_sync_to_async

log = logging.getLogger(__name__)

REPLAY_PAGE = 500
# How often an idle feed checks the job's counter for events no message told it of.
CATCH_UP_SECONDS = 5.0


@dataclass(frozen=True)
class Resync:
    """The watcher fell behind: what follows is re-read from after ``seq``."""

    seq: int


_RESYNC = object()  # queued in place of the dropped messages
_CATCH_UP = object()  # the counter check saw events no message brought


def event_from_fields(job_pk: int, fields: dict[str, Any]) -> JobEvent:
    """A JobEvent rebuilt from a live message (jobs.services.outbox.live.event_fields), once per
    process."""
    key = (job_pk, fields["number"])
    if key not in _decoded:
        _decoded[key] = _build_event(job_pk, fields)
    event: JobEvent = _decoded[key]
    return event


def _build_event(job_pk: int, fields: dict[str, Any]) -> JobEvent:
    created = fields.get("created_at")
    event = JobEvent(
        job_id=job_pk,
        number=fields["number"],
        seq=fields["number"],
        attempt=fields["attempt"],
        type=fields["type"],
        level=fields["level"],
        message=fields["message"],
        data=fields["data"],
    )
    if created is not None:
        event.created_at = dt.datetime.fromtimestamp(created, tz=dt.UTC)
    return event


@database_sync_to_async
def _events_after(job_pk: int, number: int) -> list[JobEvent]:
    return list(
        JobEvent.objects.filter(job_id=job_pk, number__gt=number).order_by("number")[:REPLAY_PAGE]
    )


@database_sync_to_async
def _event_counters(job_pks: set[int]) -> dict[int, int]:
    return dict(TrainingJob.objects.filter(pk__in=job_pks).values_list("pk", "event_counter"))


class Recent(dict[Any, Any]):
    """A dict that forgets its oldest entries beyond ``size``: what one message costs to decode
    and present is paid once per process, not once per watcher."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size

    def __setitem__(self, key: Any, value: Any) -> None:
        super().__setitem__(key, value)
        if len(self) > self.size:
            del self[next(iter(self))]


_decoded = Recent(4096)


class _CounterCheck:
    """Every ``CATCH_UP_SECONDS``, one query for the event counters of every job this process
    watches; a feed behind its job's counter (a message it never got) is told to re-read."""

    def __init__(self) -> None:
        self._feeds: dict[int, set[JobFeed]] = {}
        self._task: asyncio.Task[None] | None = None

    def add(self, feed: JobFeed) -> None:
        self._feeds.setdefault(feed.job_pk, set()).add(feed)
        self._task = ensure_running(self._task, self._run)

    def discard(self, feed: JobFeed) -> None:
        feeds = self._feeds.get(feed.job_pk, set())
        feeds.discard(feed)
        if not feeds:
            self._feeds.pop(feed.job_pk, None)

    async def _run(self) -> None:
        while self._feeds:
            await asyncio.sleep(CATCH_UP_SECONDS)
            try:
                counters = await _event_counters(set(self._feeds))
            except Exception:  # a database blip: the next round asks again
                log.warning("live: could not read event counters", exc_info=True)
                continue
            for job_pk, feeds in list(self._feeds.items()):
                for feed in list(feeds):
                    if counters.get(job_pk, 0) > feed.last:
                        feed.offer(_CATCH_UP)


_counter_check = _CounterCheck()


class JobFeed:
    def __init__(self, job_pk: int, after: int, buffer_messages: int | None = None) -> None:
        self.job_pk = job_pk
        self.last = after
        size = buffer_messages or settings.TRAINHUB_LIVE_BUFFER_MESSAGES
        self._queue: asyncio.Queue[Any] = asyncio.Queue(maxsize=size)
        self._behind = False

    def offer(self, message: object) -> None:
        """A live message from the channel layer (or the counter check's nudge); never
        blocks."""
        if self._behind:
            return  # the resync re-reads it
        try:
            self._queue.put_nowait(message)
        except asyncio.QueueFull:
            self._behind = True
            while not self._queue.empty():
                self._queue.get_nowait()
            self._queue.put_nowait(_RESYNC)

    async def events(self) -> AsyncIterator[JobEvent | Resync]:
        """Stored events after the cursor, then live ones, forever; a ``Resync`` marks a
        re-read after falling behind."""
        _counter_check.add(self)
        try:
            async for event in self._replay():
                yield event
            while True:
                message = await self._queue.get()
                if message is _RESYNC:
                    # Cleared before the re-read: what commits from here on is queued again,
                    # and what the re-read returns as well is skipped by its number.
                    self._behind = False
                    yield Resync(self.last)
                    async for event in self._replay():
                        yield event
                elif message is _CATCH_UP:
                    async for event in self._replay():
                        yield event
                else:
                    async for event in self._from_message(message):
                        yield event
        finally:
            _counter_check.discard(self)

    async def _from_message(self, message: dict[str, Any]) -> AsyncIterator[JobEvent]:
        if message["last"] <= self.last:
            return
        for fields in message["events"]:
            if fields["number"] <= self.last:
                continue
            if fields["number"] != self.last + 1:
                break  # a gap: the database has what came between
            self.last = fields["number"]
            yield event_from_fields(self.job_pk, fields)
        if self.last < message["last"]:
            async for event in self._replay():
                yield event

    async def _replay(self) -> AsyncIterator[JobEvent]:
        while True:
            page = await _events_after(self.job_pk, self.last)
            for event in page:
                self.last = event.number
                yield event
            if len(page) < REPLAY_PAGE:
                return
