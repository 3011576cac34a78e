"""The leak reconciler: terminate every machine of ours (``trainhub-<job>-a<n>``) that no live
attempt owns, so no rented GPU keeps billing after its attempt ends.

A machine's name is chosen by whoever holds the account it runs in: a project with its own key
can name a machine after another project's job. So a job hears about a machine only when the
machine was listed under the provider account that job's project uses; any other is terminated
in its own account and logged, and no job is touched.

Provider jobs that cannot be listed (RunPod serverless) but that a webhook showed to be owned
by no attempt (``webhooks.webhook_job_seen``: a duplicate run of an ambiguous launch) are
cancelled here too, with the key of the attempt whose webhook named them."""

from __future__ import annotations

import logging

from django.conf import settings

from jobs.models import JobAttempt, Project, TrainingJob
from jobs.services.accounts.targets import MissingCredentials, adapter_for, target_secrets
from jobs.services.cloud.offers import provider_account
from jobs.services.cloud.provider_webhooks import orphan_job_done, orphan_jobs_pending
from jobs.services.core.attempts import parse_machine_name
from jobs.services.core.events import event_append
from providers import registry
from providers.base import Handle, ProviderAdapter
from providers.errors import ProviderError

log = logging.getLogger(__name__)


def providers_reconcile() -> int:
    """Terminate every machine of ours (``trainhub-<job>-a<n>``) that no live attempt owns,
    and cancel the orphan provider jobs webhooks showed; returns how many were ended. One
    listing per target and credential."""
    terminated = orphan_jobs_cancel()
    for target in registry.cloud_targets():
        if target.misconfiguration():
            continue  # nothing can have been launched on it as configured
        for project in _projects_with_credentials(target):
            try:
                secrets = target_secrets(target, project)
                adapter = adapter_for(target, project, secrets)
                machines = adapter.list_instances()
            except (MissingCredentials, ProviderError) as exc:
                log.warning("reconcile of %s for %s skipped: %s", target.name, project.slug, exc)
                continue
            account = provider_account(secrets)
            for handle in machines:
                terminated += _reconcile_machine(target, adapter, handle, account)
    return terminated


def orphan_jobs_cancel() -> int:
    """Cancel each provider job a webhook showed to be owned by no attempt (a duplicate run of
    an ambiguous launch), with the key of the attempt whose webhook named it; returns how many
    were cancelled. Cancelling twice is harmless, so one that fails is tried again next run;
    one an attempt has come to own meanwhile is left alone."""
    cancelled = 0
    for job_id, attempt_pk in orphan_jobs_pending().items():
        attempt = JobAttempt.objects.select_related("job__project").filter(pk=attempt_pk).first()
        target = registry.cloud(attempt.target) if attempt is not None else None
        if (
            attempt is None
            or target is None
            or JobAttempt.objects.filter(
                target=attempt.target, provider_instance_id=job_id
            ).exists()
        ):
            orphan_job_done(job_id=job_id, cancelled=False)
            continue
        try:
            adapter_for(target, attempt.job.project).cancel(Handle(instance_id=job_id))
        except (MissingCredentials, ProviderError) as exc:
            log.warning("orphan %s job %s not cancelled yet: %s", target.name, job_id, exc)
            continue
        orphan_job_done(job_id=job_id, cancelled=True)
        cancelled += 1
        log.warning("reconciler cancelled orphan %s job %s", target.name, job_id)
        event_append(
            job=attempt.job,
            type="log",
            level="warning",
            message=f"Reconciler cancelled {target.name} job {job_id}: a second run of attempt "
            f"{attempt.number} that no attempt owns (the provider ran a launch twice).",
            data={"instance": job_id, "reason": "orphan provider job"},
        )
    return cancelled


def _projects_with_credentials(target: registry.Target) -> list[Project]:
    kind = target.credential_kind
    if kind is None:
        return list(Project.objects.order_by("pk")[:1])
    projects = list(Project.objects.filter(credentials__provider=kind).distinct().order_by("pk"))
    if settings.TRAINHUB_OPERATOR_API_KEYS.get(kind):
        own = {p.pk for p in projects}
        for project in Project.objects.exclude(pk__in=own).order_by("pk"):
            if kind in project.operator_credential_providers:
                projects.append(project)  # one listing covers the operator's account
                break
    return projects


def _reconcile_machine(
    target: registry.Target, adapter: ProviderAdapter, handle: Handle, account: str
) -> int:
    """Terminate ``handle`` (listed under ``account``) unless a live attempt owns it; 1 if it
    was terminated. Which machine to spare goes by instance id (the provider's, so a tenant
    cannot choose it); which job to tell goes by account too (the name is the tenant's)."""
    owner = (
        JobAttempt.objects.select_related("job__project")
        .filter(target=target.name, provider_instance_id=handle.instance_id)
        .first()
    )
    if owner is not None and owner.ended_at is None:
        return 0
    if owner is None and _launch_in_flight(handle.name):
        return 0  # created a moment ago; its id is about to be stored
    reason = (
        f"attempt {owner.number} ended ({owner.end_reason})"
        if owner is not None
        else "no attempt owns it"
    )
    try:
        adapter.cancel(handle)
    except ProviderError as exc:
        log.warning("reconciler could not terminate %s: %s", handle.name, exc)
        return 0
    log.warning(
        "reconciler terminated %s %s (%s): %s", target.name, handle.instance_id, handle.name, reason
    )
    job = owner.job if owner is not None else _job_of(handle.name)
    if job is not None and not _uses_account(target, job, account):
        log.warning(
            "reconciler: %s is not told about %s machine %s (%s): its project is not on the "
            "account the machine was listed under",
            job.public_id, target.name, handle.instance_id, handle.name,
        )  # fmt: skip
        job = None
    if job is not None:
        event_append(
            job=job,
            type="log",
            level="warning",
            message=f"Reconciler terminated {target.name} machine {handle.instance_id} "
            f"({handle.name}): {reason}.",
            data={"instance": handle.instance_id, "reason": reason},
        )
    return 1


def _uses_account(target: registry.Target, job: TrainingJob, account: str) -> bool:
    """Whether ``job``'s project calls ``target`` with the key of ``account`` now."""
    try:
        return provider_account(target_secrets(target, job.project)) == account
    except MissingCredentials:
        return False  # the project has no key for it any more: the machine is not its


def _launch_in_flight(name: str) -> bool:
    parsed = parse_machine_name(name)
    return parsed is not None and (
        JobAttempt.objects.filter(
            job__public_id=parsed[0],
            number=parsed[1],
            ended_at__isnull=True,
            provider_instance_id="",
        ).exists()
    )


def _job_of(name: str) -> TrainingJob | None:
    parsed = parse_machine_name(name)
    if parsed is None:
        return None
    return TrainingJob.objects.select_related("project").filter(public_id=parsed[0]).first()
