"""Celery tasks: ids in, one service call out. Names and queues come from celery_conf.

Periodic tasks that must not overlap (two pollers of one provider would double its API calls)
take a Redis lock through ``single_runner``; a run that finds it held is skipped.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from celery import Task, shared_task

from jobs.locks import single_runner
from jobs.services.cloud import launch, polling, reconcile
from jobs.services.core import artifacts, attempts, exports, files, retention, runner, stopping
from jobs.services.fleet import nodes
from jobs.services.outbound import notifications, webhook_delivery
from jobs.services.outbox import messages
from jobs.services.scheduling import dispatch, placement
from jobs.services.serving import deployments, node_servers, usage
from providers import registry
from trainhub_contract import celery_conf as cc

log = logging.getLogger(__name__)


def task(name: str, **options: Any) -> Callable[[Callable[..., Any]], Any]:
    """A control-plane task under its wire name; quiet ones send no events (celery_conf)."""
    return shared_task(
        name=name, ignore_result=True, send_events=name not in cc.QUIET_TASKS, **options
    )


@task(cc.VALIDATE_FILE)
def validate_file(file_pk: int) -> None:
    files.file_validate(file_pk=file_pk)


@task(cc.PLACE_JOB)
def place_job(job_pk: int) -> None:
    placement.job_place(job_pk=job_pk)


@task(cc.PROVISION_ATTEMPT)
def provision_attempt(attempt_pk: int, try_number: int = 0) -> None:
    launch.attempt_provision(attempt_pk=attempt_pk, try_number=try_number)


@task(cc.POLL_ATTEMPT)
def poll_attempt(attempt_pk: int) -> None:
    polling.attempt_poll(attempt_pk=attempt_pk)


@task(cc.RECONCILE_PROVIDERS)
@single_runner("reconcile", ttl_seconds=cc.RECONCILE_INTERVAL_SECONDS * 2)
def reconcile_providers() -> None:
    terminated = reconcile.providers_reconcile()
    log.info("reconciler: %d orphaned machine(s) terminated", terminated)


@task(cc.PLACE_WAITING)
@single_runner("place-waiting", ttl_seconds=cc.PLACE_INTERVAL_SECONDS * 6)
def place_waiting() -> None:
    placement.jobs_place_waiting()


@task(cc.POLL_ACTIVE_ATTEMPTS)
def poll_active_attempts() -> None:
    """Fan out one poll per cloud target. Each expires after one interval, so a slow cycle
    drops stale polls instead of piling them up."""
    for target in registry.cloud_targets():
        messages.send_poll_target(target.name, expires=cc.POLL_INTERVAL_SECONDS)


@task(cc.POLL_TARGET)
@single_runner(lambda target: f"poll:{target}", ttl_seconds=cc.POLL_INTERVAL_SECONDS * 6)
def poll_target(target: str) -> None:
    runner.target_observe(target=target)


@task(cc.STOP_MACHINES)
def stop_machines(job_pk: int) -> None:
    stopping.job_stop_machines(job_pk=job_pk)


@task(cc.INGEST_ARTIFACT)
def ingest_artifact(attempt_pk: int, reported_sha256: str = "") -> None:
    artifacts.artifact_ingest(attempt_pk=attempt_pk, reported_sha256=reported_sha256)


@task(cc.PLACE_DEPLOYMENT)
def place_deployment(deployment_pk: int) -> None:
    deployments.deployment_place(deployment_pk=deployment_pk)


@task(cc.PLACE_DEPLOYMENTS)
def place_deployments(base_model: str) -> None:
    for pk in deployments.deployments_waiting(base_model):
        deployments.deployment_place(deployment_pk=pk)


@task(cc.RUN_EXPORT)
def run_export(export_pk: int) -> None:
    exports.export_run(export_pk=export_pk)


@task(cc.NODE_SERVERS_LOST)
def node_servers_lost(node_pk: int) -> None:
    node_servers.node_servers_lost(node_pk=node_pk)


@task(cc.EXPIRE_LEASES)
@single_runner("expire-leases", ttl_seconds=cc.EXPIRE_LEASES_INTERVAL_SECONDS * 4)
def expire_leases() -> None:
    attempts.attempts_expire_leases()
    attempts.attempts_end_stalled()


# --- the own GPU fleet ------------------------------------------------------------------------


@task(cc.DISPATCH)
def dispatch_jobs() -> None:
    dispatch.dispatch_queued()


@task(cc.FLEET_TICK)
@single_runner("fleet-tick", ttl_seconds=cc.FLEET_TICK_INTERVAL_SECONDS * 6)
def fleet_tick() -> None:
    """Beat: nodes gone silent go offline, broker users a restarted Redis forgot come back,
    lost messages are sent again, then dispatch."""
    nodes.nodes_mark_offline()
    nodes.nodes_sync_broker_users()
    runner.target_observe(target=registry.OWN_FLEET_TARGET)  # resends what no node claimed
    dispatch.dispatch_queued()


# --- storage retention ------------------------------------------------------------------------


@task(cc.PURGE_STORAGE)
def purge_storage(deletion_pk: int) -> None:
    retention.storage_purge(deletion_pk=deletion_pk)


@task(cc.STORAGE_SWEEP)
@single_runner("storage-sweep", ttl_seconds=cc.STORAGE_SWEEP_INTERVAL_SECONDS)
def storage_sweep() -> None:
    report = retention.storage_sweep()
    log.info("storage sweep: %s", report)
    log.info("inference calls pruned: %d", usage.calls_prune())


# --- notifications ----------------------------------------------------------------------------


@task(cc.NOTIFY_JOB, bind=True)
def notify_job(self: Task[[int, int], None], job_pk: int, status_event_number: int) -> None:
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


@task(cc.DELIVER_WEBHOOK)
def deliver_webhook(delivery_pk: int) -> None:
    webhook_delivery.delivery_try(delivery_pk=delivery_pk)


@task(cc.WEBHOOKS_DUE)
@single_runner("webhooks-due", ttl_seconds=cc.WEBHOOKS_DUE_INTERVAL_SECONDS * 6)
def webhooks_due() -> None:
    webhook_delivery.deliveries_send_due()
