"""The leak reconciler: terminate every machine of ours (``trainhub-<job>-a<n>``) that no live
attempt owns, so no rented GPU keeps billing after its attempt ends."""

from __future__ import annotations

import logging

from django.conf import settings

from jobs.models import JobAttempt, Project, TrainingJob
from jobs.services.attempts import parse_machine_name
from jobs.services.events import event_append
from jobs.services.targets import MissingCredentials, adapter_for
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
                adapter = adapter_for(target, project)
                machines = adapter.list_instances()
            except (MissingCredentials, ProviderError) as exc:
                log.warning("reconcile of %s for %s skipped: %s", target.name, project.slug, exc)
                continue
            for handle in machines:
                terminated += _reconcile_machine(target, adapter, handle)
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


def _reconcile_machine(target: registry.Target, adapter: ProviderAdapter, handle: Handle) -> int:
    owner = (
        JobAttempt.objects.select_related("job")
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
    return TrainingJob.objects.filter(public_id=parsed[0]).first() if parsed else None
