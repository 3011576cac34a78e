"""The leak reconciler: terminate every machine of ours (``trainhub-<job>-a<n>``) that no live
attempt owns, so no rented GPU keeps billing after its attempt ends.

A machine's name is chosen by whoever holds the account it runs in: a project with its own key
can name a machine after another project's job. So a job hears about a machine only when the
machine was listed under the provider account that job's project uses; any other is terminated
in its own account and logged, and no job is touched."""

from __future__ import annotations

import logging

from django.conf import settings

from jobs.models import JobAttempt, Project, TrainingJob
from jobs.services.attempts import parse_machine_name
from jobs.services.events import event_append
from jobs.services.offers import provider_account
from jobs.services.targets import MissingCredentials, adapter_for, target_secrets
from providers import registry
from providers.base import Handle, ProviderAdapter
from providers.errors import ProviderError

log = logging.getLogger(__name__)


def providers_reconcile() -> int:
    """Terminate every machine of ours (``trainhub-<job>-a<n>``) that no live attempt owns;
    returns how many were terminated. One listing per target and credential."""
    terminated = 0
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
