"""Celery conventions shared by the control plane and the GPU nodes (no Django here).

Both apps (``trainhub.celery`` and the GPU node's app) build their configuration from
``base_config`` so queue names, task names and serialisation can never drift apart.
The control plane sends GPU work by task *name* (``send_task``), so GPU nodes never import
control-plane code and vice versa.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

DEFAULT_QUEUE = "default"
# Outbound webhook deliveries wait on other people's servers (up to 10 s a try): their own
# queue and worker (Procfile ``webhooks``), so a slow receiver never delays a poll or a stop.
WEBHOOKS_QUEUE = "webhooks"
# Exports merge an adapter into its base: minutes of CPU and a whole model in memory, on a
# worker of their own (Procfile ``exports``) where the base models are.
EXPORTS_QUEUE = "exports"
NODE_QUEUE_PREFIX = "gpu.node."

# Task names: the wire contract between processes.
VALIDATE_FILE = "trainhub.validate_file"
PLACE_JOB = "trainhub.place_job"  # a queued cloud or auto job: a node or an offer
POLL_ACTIVE_ATTEMPTS = "trainhub.poll_active_attempts"
POLL_TARGET = "trainhub.poll_target"
STOP_MACHINES = "trainhub.stop_machines"  # sent on every attempt end and every cancel
PROVISION_ATTEMPT = "trainhub.provision_attempt"
POLL_ATTEMPT = "trainhub.poll_attempt"
RECONCILE_PROVIDERS = "trainhub.reconcile_providers"
PLACE_WAITING = "trainhub.place_waiting"
INGEST_ARTIFACT = "trainhub.ingest_artifact"
EXPIRE_LEASES = "trainhub.expire_leases"
DISPATCH = "trainhub.dispatch"
FLEET_TICK = "trainhub.fleet_tick"
STORAGE_SWEEP = "trainhub.storage_sweep"
PURGE_STORAGE = "trainhub.purge_storage"
NOTIFY_JOB = "trainhub.notify_job"  # a job ended: its creator's notification (event + email)
# Inference: load a deployment on a server; place every waiting one of a base model.
PLACE_DEPLOYMENT = "trainhub.place_deployment"
PLACE_DEPLOYMENTS = "trainhub.place_deployments"
NODE_SERVERS_LOST = "trainhub.node_servers_lost"  # a serving node went offline
RUN_EXPORT = "trainhub.run_export"  # a job's adapter merged into its base (EXPORTS_QUEUE)
# Outbound webhooks: one try of one delivery; beat sends the due retries.
DELIVER_WEBHOOK = "trainhub.deliver_webhook"
WEBHOOKS_DUE = "trainhub.webhooks_due"
# Executed on a node queue. Its message carries ids only ({"job_id", "attempt"}): a node
# fetches the spec (signed URLs and all) over HTTPS when it claims the attempt.
RUN_ATTEMPT = "gpu_worker.run_attempt"

POLL_INTERVAL_SECONDS = 10
EXPIRE_LEASES_INTERVAL_SECONDS = 30
FLEET_TICK_INTERVAL_SECONDS = 10
NODE_HEARTBEAT_SECONDS = 30
STORAGE_SWEEP_INTERVAL_SECONDS = 3600
RECONCILE_INTERVAL_SECONDS = 180
PLACE_INTERVAL_SECONDS = 30  # queued jobs waiting for a cloud offer are placed again
WEBHOOKS_DUE_INTERVAL_SECONDS = 5  # webhook retries are sent this close to when they are due


@dataclass(frozen=True)
class Periodic:
    """A beat entry: the task and how often beat sends it."""

    key: str
    task: str
    every_seconds: int


# The one table beat is built from (trainhub.settings.CELERY_BEAT_SCHEDULE).
PERIODIC = (
    Periodic("poll-active-attempts", POLL_ACTIVE_ATTEMPTS, POLL_INTERVAL_SECONDS),
    Periodic("expire-leases", EXPIRE_LEASES, EXPIRE_LEASES_INTERVAL_SECONDS),
    Periodic("fleet-tick", FLEET_TICK, FLEET_TICK_INTERVAL_SECONDS),
    Periodic("place-waiting", PLACE_WAITING, PLACE_INTERVAL_SECONDS),
    Periodic("reconcile-providers", RECONCILE_PROVIDERS, RECONCILE_INTERVAL_SECONDS),
    Periodic("storage-sweep", STORAGE_SWEEP, STORAGE_SWEEP_INTERVAL_SECONDS),
    Periodic("webhooks-due", WEBHOOKS_DUE, WEBHOOKS_DUE_INTERVAL_SECONDS),
)


# Housekeeping every few seconds, and the per-target polls it fans out: these send no task
# events (Task.send_events), so Flower's task list shows work, not ticks. Their failures
# still reach the worker's log.
QUIET_TASKS = frozenset({p.task for p in PERIODIC if p.every_seconds <= 60} | {POLL_TARGET})


def beat_schedule() -> dict[str, dict[str, object]]:
    """Celery's beat_schedule from PERIODIC. A tick not run within its own interval expires,
    so a backed-up worker never runs a pile of stale ones."""
    return {
        p.key: {
            "task": p.task,
            "schedule": p.every_seconds,
            "options": {"expires": p.every_seconds},
        }
        for p in PERIODIC
    }


# The longest job trainhub accepts (mirrors spec.MAX_RUNTIME_LIMIT_SECONDS). Redis redelivers an
# unacked message after visibility_timeout, so it must exceed any training run; the database
# lease, not redelivery, is what detects a lost worker.
LONGEST_JOB_SECONDS = 7 * 24 * 3600
VISIBILITY_TIMEOUT_SECONDS = LONGEST_JOB_SECONDS + 3600


def node_queue(node_name: str) -> str:
    """The queue a GPU node consumes; one per node so dispatch can pick the machine."""
    return f"{NODE_QUEUE_PREFIX}{node_name}"


# kombu's Redis transport keeps a queue's priority levels in keys "<queue>" + this + level.
_PRIORITY_SEP = "\x06\x16"


# Redis ACL users are server-wide (every database of the server): installations that share one
# Redis on different databases (and parallel test workers) keep their nodes' users apart by
# setting this to their own prefix, the same on the control plane and on its nodes.
BROKER_USER_PREFIX_ENV = "TRAINHUB_BROKER_USER_PREFIX"
DEFAULT_BROKER_USER_PREFIX = "trainhub-node-"


def node_broker_username(node_name: str) -> str:
    """The Redis ACL user a node connects as (``trainhub-node-<name>`` unless
    TRAINHUB_BROKER_USER_PREFIX says otherwise); its password is the node's token."""
    return f"{os.environ.get(BROKER_USER_PREFIX_ENV) or DEFAULT_BROKER_USER_PREFIX}{node_name}"


def node_broker_keys(node_name: str) -> tuple[str, ...]:
    """Key patterns (Redis ACL globs) of the node's own queue: the list, its priority levels
    and kombu's binding sets. Node names are [A-Za-z0-9_.-], so they hold no glob syntax."""
    queue = node_queue(node_name)
    bindings = (f"_kombu.binding.{queue}", f"_kombu.binding_permanent.{queue}")
    return (queue, f"{queue}{_PRIORITY_SEP}*", *bindings)


def base_config(broker_url: str) -> dict[str, object]:
    """Celery settings common to every trainhub process."""
    return {
        "broker_url": broker_url,
        "broker_connection_retry_on_startup": True,
        "broker_transport_options": {"visibility_timeout": VISIBILITY_TIMEOUT_SECONDS},
        "result_backend": None,
        "task_ignore_result": True,
        "task_serializer": "json",
        "result_serializer": "json",
        "accept_content": ["json"],
        "task_default_queue": DEFAULT_QUEUE,
        # An exact task name wins over the pattern (celery's MapRoute).
        "task_routes": {
            DELIVER_WEBHOOK: {"queue": WEBHOOKS_QUEUE},
            RUN_EXPORT: {"queue": EXPORTS_QUEUE},
            "trainhub.*": {"queue": DEFAULT_QUEUE},
        },
        "worker_prefetch_multiplier": 1,
        "worker_hijack_root_logger": False,
        "timezone": "UTC",
        "enable_utc": True,
    }
