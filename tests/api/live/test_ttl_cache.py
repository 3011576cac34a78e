"""The stream process's small cache (api/live/ttl_cache.py): entries expire, the oldest put goes
when it is full, and a missing entry is loaded once for everyone who asks while it loads."""

from __future__ import annotations

import asyncio

import pytest

from api.live.ttl_cache import TtlCache


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_an_entry_lives_its_seconds_and_the_oldest_put_goes_first() -> None:
    clock = Clock()
    cache: TtlCache[str, int] = TtlCache(seconds=5, size=2, clock=clock)
    cache.put("a", 1)
    clock.now += 4.9
    assert cache.get("a") == 1
    clock.now += 0.1
    assert cache.get("a") is None and len(cache) == 0, "gone at its fifth second"

    cache.put("a", 1)
    cache.put("b", 2)
    cache.put("a", 3)  # put again: now the newest
    cache.put("c", 4)
    assert (cache.get("a"), cache.get("b"), cache.get("c")) == (3, None, 4)

    cache.drop_where(lambda value: value > 3)
    cache.drop("nothing here")
    assert (cache.get("a"), cache.get("c")) == (3, None)


def test_a_missing_entry_is_loaded_once_for_everyone_asking_meanwhile() -> None:
    cache: TtlCache[str, str] = TtlCache(seconds=5, size=10)
    loads = 0

    async def load() -> str:
        nonlocal loads
        loads += 1
        await asyncio.sleep(0.05)
        return "route"

    async def many() -> list[str | None]:
        return await asyncio.gather(*(cache.get_or_load("k", load) for _ in range(50)))

    assert asyncio.run(many()) == ["route"] * 50
    assert loads == 1 and cache.get("k") == "route"


def test_a_load_that_fails_or_finds_nothing_is_not_kept() -> None:
    cache: TtlCache[str, str] = TtlCache(seconds=5, size=10)

    async def nothing() -> str | None:
        return None

    async def refused() -> str:
        await asyncio.sleep(0.01)
        raise LookupError("no such model")

    async def ask_twice() -> list[object]:
        return await asyncio.gather(
            cache.get_or_load("gone", refused), cache.get_or_load("gone", refused),
            return_exceptions=True,
        )  # fmt: skip

    assert asyncio.run(cache.get_or_load("none", nothing)) is None
    failed = asyncio.run(ask_twice())
    assert [type(e) for e in failed] == [LookupError, LookupError], "each asker hears why"
    assert len(cache) == 0

    async def then_found() -> str:
        return "found"

    assert asyncio.run(cache.get_or_load("gone", then_found)) == "found", "asked again, loaded"


def test_one_asker_cancelled_does_not_cancel_the_load_the_others_wait_on() -> None:
    cache: TtlCache[str, str] = TtlCache(seconds=5, size=10)

    async def slow() -> str:
        await asyncio.sleep(0.05)
        return "route"

    async def scene() -> str | None:
        impatient = asyncio.ensure_future(cache.get_or_load("k", slow))
        patient = asyncio.ensure_future(cache.get_or_load("k", slow))
        await asyncio.sleep(0.01)
        impatient.cancel()
        with pytest.raises(asyncio.CancelledError):
            await impatient
        return await patient

    assert asyncio.run(scene()) == "route"
