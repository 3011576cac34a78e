"""The control plane's Celery app (queue ``default`` + beat)."""

from __future__ import annotations

import logging
import os
import socket
import threading

import redis
from celery import Celery
from celery.signals import beat_init, task_prerun

from trainhub_contract import celery_conf

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "trainhub.settings")

app = Celery("trainhub")
app.config_from_object("django.conf:settings", namespace="CELERY")


@app.on_after_configure.connect
def _apply_shared_conventions(sender: Celery, **_: object) -> None:
    from django.conf import settings

    shared = celery_conf.base_config(settings.CELERY_BROKER_URL)
    for key, value in shared.items():
        if key not in ("broker_url",):
            sender.conf[key] = value


app.autodiscover_tasks(["jobs"])


@task_prerun.connect
def _drop_broken_database_connections(task: object = None, **_: object) -> None:
    """With CELERY_DB_REUSE_MAX (settings) a task reuses the connection of the last one: drop
    it first if it broke (a PostgreSQL restart) or outlived CONN_MAX_AGE, as Django does at the
    start of every request (no query unless the last one failed). Not for a task run eagerly
    (``apply()``) inside a caller's transaction."""
    from django.db import connections

    if getattr(getattr(task, "request", None), "is_eager", False):
        return
    for conn in connections.all(initialized_only=True):
        if not conn.in_atomic_block:
            conn.close_if_unusable_or_obsolete()


log = logging.getLogger(__name__)
BEAT_LOCK_KEY = "trainhub:beat-lock"
BEAT_LOCK_TTL_SECONDS = 60
# Extend the key only while it is still ours: after a stall past the TTL another beat may hold
# it, and overwriting it would leave two beats that each believe they are the only one.
_EXTEND_IF_OWNER = """
if redis.call('get', KEYS[1]) == ARGV[1] then
    return redis.call('expire', KEYS[1], ARGV[2])
end
return 0
"""


@beat_init.connect
def _refuse_second_beat(sender: object = None, **_: object) -> None:
    """Exactly one beat may run: a second would double every periodic fan-out.

    The lock is a Redis key with a TTL refreshed by a daemon thread, so a beat that dies
    frees it within a minute.
    """
    from trainhub.shared_redis import redis_client

    client = redis_client()
    owner = f"{socket.gethostname()}:{os.getpid()}"
    if not client.set(BEAT_LOCK_KEY, owner, nx=True, ex=BEAT_LOCK_TTL_SECONDS):
        holder = client.get(BEAT_LOCK_KEY)
        raise SystemExit(f"another celery beat is already running ({holder!r}); run exactly one")

    extend = client.register_script(_EXTEND_IF_OWNER)

    def refresh() -> None:
        while True:
            threading.Event().wait(BEAT_LOCK_TTL_SECONDS / 3)
            try:
                if not extend(keys=[BEAT_LOCK_KEY], args=[owner, BEAT_LOCK_TTL_SECONDS]):
                    holder = client.get(BEAT_LOCK_KEY)
                    log.error("beat lock lost to %r; stop this beat, another one runs", holder)
                    return
            except redis.RedisError as exc:  # transient: try again before the TTL runs out
                log.warning("could not refresh the beat lock: %s", exc)

    threading.Thread(target=refresh, name="beat-lock", daemon=True).start()
    log.info("beat lock held by %s", owner)
