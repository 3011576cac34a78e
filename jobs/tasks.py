"""Celery tasks: ids in, one service call out. Names and queues come from celery_conf."""

from __future__ import annotations

import logging

from celery import shared_task

from gpu_worker import celery_conf as cc
from jobs.locks import try_lock
from jobs.services import (
    artifacts,
    attempts,
    cloud,
    dispatch,
    files,
    launch,
    nodes,
    placing,
    retention,
)
from providers import registry

log = logging.getLogger(__name__)


@shared_task(name=cc.VALIDATE_FILE, ignore_result=True)
def validate_file(file_pk: int) -> None:
    files.file_validate(file_pk=file_pk)


@shared_task(name=cc.SUBMIT_ATTEMPT, ignore_result=True)
def submit_attempt(job_pk: int) -> None:
    placing.job_place(job_pk=job_pk)


@shared_task(name=cc.PROVISION_ATTEMPT, ignore_result=True)
def provision_attempt(attempt_pk: int, try_number: int = 0) -> None:
    launch.attempt_provision(attempt_pk=attempt_pk, try_number=try_number)


@shared_task(name=cc.POLL_ATTEMPT, ignore_result=True)
def poll_attempt(attempt_pk: int) -> None:
    cloud.attempt_poll(attempt_pk=attempt_pk)


@shared_task(name=cc.RECONCILE_PROVIDERS, ignore_result=True)
def reconcile_providers() -> None:
    with try_lock("reconcile", ttl_seconds=cc.RECONCILE_INTERVAL_SECONDS * 2) as acquired:
        if acquired:
            terminated = cloud.providers_reconcile()
            log.info("reconciler: %d orphaned machine(s) terminated", terminated)


@shared_task(name=cc.PLACE_WAITING, ignore_result=True)
def place_waiting() -> None:
    with try_lock("place-waiting", ttl_seconds=cc.PLACE_INTERVAL_SECONDS * 6) as acquired:
        if acquired:
            placing.jobs_place_waiting()


@shared_task(name=cc.POLL_ACTIVE_ATTEMPTS, ignore_result=True)
def poll_active_attempts() -> None:
    """Fan out one poll per cloud target. Each expires after one interval, so a slow cycle
    drops stale polls instead of piling them up."""
    for target in registry.cloud_targets():
        poll_target.apply_async(args=[target.name], expires=cc.POLL_INTERVAL_SECONDS)


@shared_task(name=cc.POLL_TARGET, ignore_result=True)
def poll_target(target: str) -> None:
    # One poller per target across all workers: overlapping cycles would double API calls.
    with try_lock(f"poll:{target}", ttl_seconds=cc.POLL_INTERVAL_SECONDS * 6) as acquired:
        if acquired:
            cloud.attempts_poll_target(target=target)
        else:
            log.info("poll of %s skipped: previous cycle still running", target)


@shared_task(name=cc.CANCEL_JOB, ignore_result=True)
def cancel_job(job_pk: int) -> None:
    cloud.attempts_stop(job_pk=job_pk)


@shared_task(name=cc.INGEST_ARTIFACT, ignore_result=True)
def ingest_artifact(attempt_pk: int, reported_sha256: str = "") -> None:
    artifacts.artifact_ingest(attempt_pk=attempt_pk, reported_sha256=reported_sha256)


@shared_task(name=cc.EXPIRE_LEASES, ignore_result=True)
def expire_leases() -> None:
    with try_lock("expire-leases", ttl_seconds=cc.EXPIRE_LEASES_INTERVAL_SECONDS * 4) as acquired:
        if acquired:
            attempts.attempts_expire_leases()


@shared_task(name=cc.RECORD_EVENTS, ignore_result=True)
def record_events(
    job_id: str, attempt: int, events: list[dict], node: str | None = None, token: str | None = None
) -> None:
    attempts.attempt_record_events(
        job_id=job_id, attempt_number=attempt, events=events, node=node, token=token
    )


# --- the own GPU fleet ------------------------------------------------------------------------


@shared_task(name=cc.DISPATCH, ignore_result=True)
def dispatch_jobs() -> None:
    dispatch.dispatch_queued()


@shared_task(name=cc.FLEET_TICK, ignore_result=True)
def fleet_tick() -> None:
    """Beat: nodes gone silent go offline, lost messages are sent again, then dispatch."""
    with try_lock("fleet-tick", ttl_seconds=cc.FLEET_TICK_INTERVAL_SECONDS * 6) as acquired:
        if acquired:
            nodes.nodes_mark_offline()
            dispatch.attempts_resend_unclaimed()
            dispatch.attempts_resend_cancels()
            dispatch.dispatch_queued()


@shared_task(name=cc.NODE_REGISTER, ignore_result=True)
def node_register(name: str, token: str, report: dict) -> None:
    nodes.node_register(name=name, token=token, report=report)


@shared_task(name=cc.NODE_HEARTBEAT, ignore_result=True)
def node_heartbeat(name: str, token: str) -> None:
    nodes.node_heartbeat(name=name, token=token)


@shared_task(name=cc.NODE_STOPPING, ignore_result=True)
def node_stopping(name: str, token: str) -> None:
    nodes.node_stopping(name=name, token=token)


# --- storage retention ------------------------------------------------------------------------


@shared_task(name=cc.PURGE_STORAGE, ignore_result=True)
def purge_storage(deletion_pk: int) -> None:
    retention.storage_purge(deletion_pk=deletion_pk)


@shared_task(name=cc.STORAGE_SWEEP, ignore_result=True)
def storage_sweep() -> None:
    with try_lock("storage-sweep", ttl_seconds=cc.STORAGE_SWEEP_INTERVAL_SECONDS) as acquired:
        if acquired:
            report = retention.storage_sweep()
            log.info("storage sweep: %s", report)
