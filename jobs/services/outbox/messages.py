"""Every Celery message the control plane sends: one typed function per task.

Each is sent once the current transaction commits (at once outside one): a worker must never
get an id whose row it cannot see yet, nor hear of a change that was rolled back. Messages carry
ids only; names and queues come from ``trainhub_contract.celery_conf``, the wire contract.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.db import transaction

from trainhub.celery import app
from trainhub_contract import celery_conf as cc


def _after_commit(send: Callable[[], None]) -> None:
    # Outside a transaction, at once (a beat fan-out needs no database connection at all).
    if transaction.get_connection().in_atomic_block:
        transaction.on_commit(send)
    else:
        send()


def _send(task: str, *args: Any, countdown: float = 0, **options: Any) -> None:
    def send() -> None:
        app.send_task(task, args=list(args), countdown=countdown or None, **options)

    _after_commit(send)


def send_validate_file(file_pk: int) -> None:
    _send(cc.VALIDATE_FILE, file_pk)


def send_place_job(job_pk: int) -> None:
    """A queued cloud or ``auto`` job: find it a node or an offer."""
    _send(cc.PLACE_JOB, job_pk)


def send_dispatch(countdown: float = 0) -> None:
    """Look for queued own-fleet jobs and idle nodes that fit them."""
    _send(cc.DISPATCH, countdown=countdown)


def send_provision_attempt(attempt_pk: int, try_number: int, countdown: float = 0) -> None:
    _send(cc.PROVISION_ATTEMPT, attempt_pk, try_number, countdown=countdown)


def send_stop_machines(job_pk: int, countdown: float = 0) -> None:
    """Stop the job's rented machines that nothing runs on any more."""
    _send(cc.STOP_MACHINES, job_pk, countdown=countdown)


def send_poll_attempt(attempt_pk: int) -> None:
    _send(cc.POLL_ATTEMPT, attempt_pk)


def send_poll_target(target: str, expires: float) -> None:
    _send(cc.POLL_TARGET, target, expires=expires)


def send_ingest_artifact(attempt_pk: int, reported_sha256: str) -> None:
    _send(cc.INGEST_ARTIFACT, attempt_pk, reported_sha256)


def send_place_deployment(deployment_pk: int) -> None:
    """Load a deployed adapter on an inference server with room."""
    _send(cc.PLACE_DEPLOYMENT, deployment_pk)


def send_place_deployments(base_model: str) -> None:
    """A server of ``base_model`` came online: place the deployments waiting for one."""
    _send(cc.PLACE_DEPLOYMENTS, base_model)


def send_node_servers_lost(node_pk: int) -> None:
    """A node went offline: its inference servers are down, their adapters placed elsewhere."""
    _send(cc.NODE_SERVERS_LOST, node_pk)


def send_run_export(export_pk: int) -> None:
    """Merge a job's adapter into its base (the exports worker)."""
    _send(cc.RUN_EXPORT, export_pk)


def send_purge_storage(deletion_pk: int) -> None:
    _send(cc.PURGE_STORAGE, deletion_pk)


def send_notify_job(job_pk: int, status_event_number: int) -> None:
    """The job entered a terminal status (its ``status`` event numbered so): tell its creator."""
    _send(cc.NOTIFY_JOB, job_pk, status_event_number)


def send_deliver_webhook(delivery_pk: int, expires: float | None = None) -> None:
    """One try of one webhook delivery (the worker claims it; a duplicate finds it taken)."""
    _send(cc.DELIVER_WEBHOOK, delivery_pk, expires=expires)


def send_run_attempt(node_name: str, job_id: str, attempt_number: int) -> None:
    """The attempt's ids, to the one node's own queue: the node claims it over HTTPS and gets
    the spec there (a broker message carries no secret)."""
    message = {"job_id": job_id, "attempt": attempt_number}
    _send(cc.RUN_ATTEMPT, message, queue=cc.node_queue(node_name))
