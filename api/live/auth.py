"""Who a live connection acts for: the same API keys as the REST API, never from the URL.

A key travels in the ``Authorization: Bearer`` header (any HTTP or WebSocket client), or, for a
browser's WebSocket (which cannot set headers), as the subprotocol ``trainhub.bearer.<key>``
offered beside ``trainhub.v1``. A query string ends up in access logs; headers do not.

Open connections are re-checked: every few seconds each stream process asks once, for all the
keys its connections use, which are still live (not revoked, user active and still a member),
and closes the connections of the others. For the same few seconds a key that was found live
is remembered (by its SHA-256), so a burst of completions or connections costs the database one
look-up: a key revoked now stops opening anything here within ``RECHECK_SECONDS``, as it stops
holding anything open.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from django.db.models import Exists, OuterRef

from api.live.background import ensure_running
from api.live.ttl_cache import TtlCache
from jobs.models import ApiKey, ProjectMembership
from jobs.services.accounts.projects import api_key_authenticate

if TYPE_CHECKING:  # channels ships no type hints: its database_sync_to_async subclasses this
    from asgiref.sync import SyncToAsync as database_sync_to_async
else:
    from channels.db import database_sync_to_async

log = logging.getLogger(__name__)

SUBPROTOCOL = "trainhub.v1"
_BEARER_SUBPROTOCOL = "trainhub.bearer."
RECHECK_SECONDS = 5.0


def scope_headers(scope: dict[str, Any]) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}


def bearer_key(scope: dict[str, Any]) -> str | None:
    """The raw key a connection presents, or None."""
    scheme, _, raw = scope_headers(scope).get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and raw.strip():
        return raw.strip()
    protocol: str
    for protocol in scope.get("subprotocols") or ():
        if protocol.startswith(_BEARER_SUBPROTOCOL):
            return protocol.removeprefix(_BEARER_SUBPROTOCOL)
    return None


def chosen_subprotocol(scope: dict[str, Any]) -> str | None:
    """The subprotocol to accept with: ours when the client offered it (browsers need one)."""
    return SUBPROTOCOL if SUBPROTOCOL in (scope.get("subprotocols") or ()) else None


# Keys found live, by the SHA-256 of the raw key; refused keys are not remembered.
live_keys: TtlCache[str, ApiKey] = TtlCache(seconds=RECHECK_SECONDS, size=10_000)


@database_sync_to_async
def _live_key(raw: str) -> ApiKey | None:
    key = api_key_authenticate(raw=raw)
    if key is None or not key.is_member:  # type: ignore[attr-defined]  # annotated
        return None
    return key


async def authenticate(scope: dict[str, Any]) -> ApiKey | None:
    raw = bearer_key(scope)
    if raw is None:
        return None
    return await live_keys.get_or_load(
        hashlib.sha256(raw.encode()).hexdigest(), lambda: _live_key(raw)
    )


@database_sync_to_async
def _live_key_ids(ids: set[int]) -> set[int]:
    return set(
        ApiKey.objects.filter(pk__in=ids, revoked_at__isnull=True, user__is_active=True)
        .filter(
            Exists(
                ProjectMembership.objects.filter(project=OuterRef("project"), user=OuterRef("user"))
            )
        )
        .values_list("pk", flat=True)
    )


Closer = Callable[[], Awaitable[None]]


class OpenConnections:
    """The connections of this process by key, re-checked together every few seconds."""

    def __init__(self) -> None:
        self._by_key: dict[int, dict[object, Closer]] = {}
        self._task: asyncio.Task[None] | None = None

    def add(self, key_id: int, connection: object, close: Closer) -> None:
        self._by_key.setdefault(key_id, {})[connection] = close
        self._task = ensure_running(self._task, self._recheck_forever)

    def discard(self, key_id: int, connection: object) -> None:
        connections = self._by_key.get(key_id, {})
        connections.pop(connection, None)
        if not connections:
            self._by_key.pop(key_id, None)

    def count(self) -> int:
        return sum(len(c) for c in self._by_key.values())

    async def recheck(self) -> None:
        ids = set(self._by_key)
        if not ids:
            return
        gone = ids - await _live_key_ids(ids)
        for key_id in gone:
            for close in list(self._by_key.pop(key_id, {}).values()):
                with contextlib.suppress(Exception):
                    await close()

    async def _recheck_forever(self) -> None:
        while self._by_key:
            await asyncio.sleep(RECHECK_SECONDS)
            try:
                await self.recheck()
            except Exception:  # a database blip: try again next round
                log.warning("live: could not re-check API keys", exc_info=True)


open_connections = OpenConnections()
