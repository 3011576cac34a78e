"""A small in-memory cache for the stream process's hot path: each entry lives a fixed number of
seconds after it was put, and the oldest put goes first when the cache is full.

The stream process answers from one event loop, so there is no lock. What it caches (who a
bearer key is, where a model is served) changes rarely, and every use of a cached answer is
checked again on its way: see api/live/auth.py and api/live/inference.py for how long each may
be stale and what drops it early. ``get_or_load`` loads a missing entry once for everyone who
asks meanwhile: when an entry expires under load, a hundred requests wait on one database
look-up, not a hundred in a row."""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class TtlCache(Generic[K, V]):
    def __init__(
        self, seconds: float, size: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.seconds, self.size, self._clock = seconds, size, clock
        self._entries: OrderedDict[K, tuple[float, V]] = OrderedDict()
        self._loading: dict[K, asyncio.Future[V | None]] = {}

    def get(self, key: K) -> V | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        expires, value = entry
        if self._clock() >= expires:
            del self._entries[key]
            return None
        return value

    async def get_or_load(self, key: K, load: Callable[[], Awaitable[V | None]]) -> V | None:
        """The entry, else what ``load()`` gives (kept unless None), loaded once for all who
        ask while it loads; its exception reaches each of them."""
        value = self.get(key)
        if value is not None:
            return value
        loading = self._loading.get(key)
        if loading is None:
            loading = asyncio.ensure_future(load())
            self._loading[key] = loading
            loading.add_done_callback(lambda done: self._loaded(key, done))
        return await asyncio.shield(loading)  # one asker gone does not cancel the others' load

    def _loaded(self, key: K, done: asyncio.Future[V | None]) -> None:
        self._loading.pop(key, None)
        if not done.cancelled() and done.exception() is None:
            value = done.result()
            if value is not None:
                self.put(key, value)

    def put(self, key: K, value: V) -> None:
        self._entries[key] = (self._clock() + self.seconds, value)
        self._entries.move_to_end(key)
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)

    def drop(self, key: K) -> None:
        self._entries.pop(key, None)

    def drop_where(self, stale: Callable[[V], bool]) -> None:
        for key in [k for k, (_, value) in self._entries.items() if stale(value)]:
            del self._entries[key]

    def __len__(self) -> int:
        return len(self._entries)
