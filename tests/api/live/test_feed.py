"""JobFeed's rules one by one, on the real database: what it sends from a message, what it
re-reads, and when it tells a watcher to resync."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from api.live import feed as feed_module
from api.live.feed import JobFeed, Resync
from jobs.models import JobEvent
from jobs.services.core.events import event_append
from jobs.services.outbox import live

pytestmark = [pytest.mark.django_db(transaction=True)]


def counter(job) -> int:
    job.refresh_from_db(fields=["event_counter"])
    return job.event_counter


def message_for(job, events: list[JobEvent], *, carry: bool = True) -> dict[str, Any]:
    return {
        "type": live.JOB_MESSAGE,
        "job": job.public_id,
        "last": events[-1].number,
        "events": [live.event_fields(e) for e in events] if carry else [],
    }


def take(feed: JobFeed, count: int, timeout: float = 5) -> list[Any]:
    async def run() -> list[Any]:
        got: list[Any] = []
        async with asyncio.timeout(timeout):
            async for item in feed.events():
                got.append(item)
                if len(got) == count:
                    return got
        return got

    return asyncio.run(run())


def numbers(items: list[Any]) -> list[Any]:
    return [("resync", i.seq) if isinstance(i, Resync) else i.number for i in items]


def test_a_message_with_the_next_numbers_is_sent_on_without_a_read(make_job) -> None:
    job = make_job()
    stored = counter(job)
    # Events as a message carries them, not in the database: only the message can yield them.
    unsaved = [
        JobEvent(number=stored + i, attempt=1, type="log", level="info", message=f"m{i}", data={})
        for i in (1, 2)
    ]
    feed = JobFeed(job.pk, after=stored)
    feed.offer(message_for(job, unsaved))
    got = take(feed, 2)
    assert numbers(got) == [stored + 1, stored + 2]
    assert [e.message for e in got] == ["m1", "m2"]


def test_old_numbers_are_skipped_and_a_gap_is_read_from_the_database(make_job) -> None:
    job = make_job()
    before = counter(job)
    events = [event_append(job=job, type="log", message=str(i)) for i in range(4)]
    feed = JobFeed(job.pk, after=before + 1)
    feed.offer(message_for(job, events[:1]))  # already past it: skipped
    feed.offer(message_for(job, events[3:]))  # skips 3 and 4: the database has them
    assert numbers(take(feed, 3)) == [before + 2, before + 3, before + 4]


def test_a_message_too_large_to_carry_its_events_costs_a_read(make_job, monkeypatch) -> None:
    monkeypatch.setattr(live, "MAX_MESSAGE_BYTES", 10)
    job = make_job()
    before = counter(job)
    events = [event_append(job=job, type="log", message=str(i)) for i in range(3)]
    message = live._job_message(job, events)
    assert message["events"] == [] and message["last"] == before + 3
    feed = JobFeed(job.pk, after=before)
    feed._queue.put_nowait(message)
    # The initial read already has them; the message then holds nothing new.
    assert numbers(take(feed, 3)) == [before + 1, before + 2, before + 3]


def test_events_no_message_told_of_are_found_by_the_counter_check(make_job, monkeypatch) -> None:
    monkeypatch.setattr(feed_module, "CATCH_UP_SECONDS", 0.1)
    job = make_job()
    feed = JobFeed(job.pk, after=counter(job))

    async def run() -> list[Any]:
        got = []
        stream = feed.events()

        async def append_later() -> None:
            await asyncio.sleep(0.3)  # after the feed's first read; no message is offered
            await asyncio.to_thread(event_append, job=job, type="log", message="unannounced")

        task = asyncio.create_task(append_later())
        async with asyncio.timeout(5):
            got.append(await anext(stream))
        await task
        return got

    (event,) = asyncio.run(run())
    assert event.message == "unannounced"


def test_a_full_buffer_becomes_one_resync_and_a_re_read(make_job) -> None:
    job = make_job()
    caught_up = counter(job)
    feed = JobFeed(job.pk, after=caught_up, buffer_messages=2)
    events = [event_append(job=job, type="log", message=str(i)) for i in range(6)]
    for event in events:  # 6 messages into room for 2, while the watcher is busy
        feed.offer(message_for(job, [event]))
    got = take(feed, 7)
    assert numbers(got) == [caught_up + i for i in range(1, 7)] + [("resync", caught_up + 6)]
    # The initial read sent them all; the resync re-read found nothing more and no repeats.
