"""Celery tasks: ids in, one service call out. Names and queues come from celery_conf.

Periodic tasks that must not overlap (two pollers of one provider would double its API calls)
take a Redis lock through ``single_runner``; a run that finds it held is skipped.
"""

from __future__ import annotations

import logging

from celery import Task, shared_task

from gpu_worker import celery_conf as cc
from jobs.locks import single_runner
from jobs.services import (
    artifacts,
    attempts,
    dispatch,
    files,
    launch,
    messages,
    nodes,
    notifications,
    placement,
    polling,
    reconcile,
    retention,
    stopping,
    webhook_delivery,
)
from providers import registry

log = logging.getLogger(__name__)


@shared_task(name=cc.VALIDATE_FILE, ignore_result=True)
def validate_file(file_pk: int) -> None:
    files.file_validate(file_pk=file_pk)


@shared_task(name=cc.PLACE_JOB, ignore_result=True)
def place_job(job_pk: int) -> None:
    placement.job_place(job_pk=job_pk)


@shared_task(name=cc.PROVISION_ATTEMPT, ignore_result=True)
def provision_attempt(attempt_pk: int, try_number: int = 0) -> None:
    launch.attempt_provision(attempt_pk=attempt_pk, try_number=try_number)


@shared_task(name=cc.POLL_ATTEMPT, ignore_result=True)
def poll_attempt(attempt_pk: int) -> None:
    polling.attempt_poll(attempt_pk=attempt_pk)


@shared_task(name=cc.RECONCILE_PROVIDERS, ignore_result=True)
@single_runner("reconcile", ttl_seconds=cc.RECONCILE_INTERVAL_SECONDS * 2)
def reconcile_providers() -> None:
    terminated = reconcile.providers_reconcile()
    log.info("reconciler: %d orphaned machine(s) terminated", terminated)


@shared_task(name=cc.PLACE_WAITING, ignore_result=True)
@single_runner("place-waiting", ttl_seconds=cc.PLACE_INTERVAL_SECONDS * 6)
def place_waiting() -> None:
    placement.jobs_place_waiting()


@shared_task(name=cc.POLL_ACTIVE_ATTEMPTS, ignore_result=True)
def poll_active_attempts() -> None:
    """Fan out one poll per cloud target. Each expires after one interval, so a slow cycle
    drops stale polls instead of piling them up."""
    for target in registry.cloud_targets():
        messages.send_poll_target(target.name, expires=cc.POLL_INTERVAL_SECONDS)


@shared_task(name=cc.POLL_TARGET, ignore_result=True)
@single_runner(lambda target: f"poll:{target}", ttl_seconds=cc.POLL_INTERVAL_SECONDS * 6)
def poll_target(target: str) -> None:
    polling.attempts_poll_target(target=target)


@shared_task(name=cc.STOP_MACHINES, ignore_result=True)
def stop_machines(job_pk: int) -> None:
    stopping.job_stop_machines(job_pk=job_pk)


@shared_task(name=cc.INGEST_ARTIFACT, ignore_result=True)
def ingest_artifact(attempt_pk: int, reported_sha256: str = "") -> None:
    artifacts.artifact_ingest(attempt_pk=attempt_pk, reported_sha256=reported_sha256)


@shared_task(name=cc.EXPIRE_LEASES, ignore_result=True)
@single_runner("expire-leases", ttl_seconds=cc.EXPIRE_LEASES_INTERVAL_SECONDS * 4)
def expire_leases() -> None:
    attempts.attempts_expire_leases()


# --- the own GPU fleet ------------------------------------------------------------------------


@shared_task(name=cc.DISPATCH, ignore_result=True)
def dispatch_jobs() -> None:
    dispatch.dispatch_queued()


@shared_task(name=cc.FLEET_TICK, ignore_result=True)
@single_runner("fleet-tick", ttl_seconds=cc.FLEET_TICK_INTERVAL_SECONDS * 6)
def fleet_tick() -> None:
    """Beat: nodes gone silent go offline, broker users a restarted Redis forgot come back,
    lost messages are sent again, then dispatch."""
    nodes.nodes_mark_offline()
    nodes.nodes_sync_broker_users()
    dispatch.attempts_resend_unclaimed()
    dispatch.dispatch_queued()


# --- storage retention ------------------------------------------------------------------------


@shared_task(name=cc.PURGE_STORAGE, ignore_result=True)
def purge_storage(deletion_pk: int) -> None:
    retention.storage_purge(deletion_pk=deletion_pk)


@shared_task(name=cc.STORAGE_SWEEP, ignore_result=True)
@single_runner("storage-sweep", ttl_seconds=cc.STORAGE_SWEEP_INTERVAL_SECONDS)
def storage_sweep() -> None:
    report = retention.storage_sweep()
    log.info("storage sweep: %s", report)


# --- notifications ----------------------------------------------------------------------------


@shared_task(bind=True, name=cc.NOTIFY_JOB, ignore_result=True)
def notify_job(self: Task, job_pk: int, status_event_number: int) -> None:
    """A job ended: its creator's notification event (once) and email (retried if deferred)."""
    retries = self.request.retries
    try:
        notifications.job_notify(
            job_pk=job_pk, status_event_number=status_event_number, retrying=retries > 0
        )
    except notifications.EmailDeferred as exc:
        if retries >= notifications.EMAIL_RETRIES:
            log.warning(
                "job %s: notification email given up after %d tries: %s", job_pk, retries + 1, exc
            )
            return
        raise self.retry(
            exc=exc,
            countdown=notifications.retry_delay(retries),
            max_retries=notifications.EMAIL_RETRIES,
        ) from exc


# --- outbound webhooks ------------------------------------------------------------------------


@shared_task(name=cc.DELIVER_WEBHOOK, ignore_result=True)
def deliver_webhook(delivery_pk: int) -> None:
    webhook_delivery.delivery_try(delivery_pk=delivery_pk)


@shared_task(name=cc.WEBHOOKS_DUE, ignore_result=True)
@single_runner("webhooks-due", ttl_seconds=cc.WEBHOOKS_DUE_INTERVAL_SECONDS * 6)
def webhooks_due() -> None:
    webhook_delivery.deliveries_send_due()
