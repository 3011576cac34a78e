"""Which targets a project can use, and with which provider key: one answer for job submission,
placement, the providers API and every provider call."""

from __future__ import annotations

from django.conf import settings

from jobs import storage
from jobs.models import Project
from jobs.services.accounts.projects import credential_secrets
from providers import registry
from providers.base import ProviderAdapter


class MissingCredentials(Exception):
    pass


def provider_secrets(*, project: Project, kind: str) -> dict[str, str] | None:
    """The project's newest credential of ``kind``, else the operator's environment key when
    the project may use it; None when neither exists."""
    credential = project.credentials.filter(provider=kind).order_by("-updated_at").first()
    if credential is not None:
        return credential_secrets(credential=credential)
    key = settings.TRAINHUB_OPERATOR_API_KEYS.get(kind, "")
    if key and kind in project.operator_credential_providers:
        return {"api_key": key}
    return None


def credential_source(*, project: Project, kind: str) -> str | None:
    """'project', 'operator' or None: whose key ``provider_secrets`` would return."""
    if project.credentials.filter(provider=kind).exists():
        return "project"
    if kind in project.operator_credential_providers and settings.TRAINHUB_OPERATOR_API_KEYS.get(
        kind
    ):
        return "operator"
    return None


def target_secrets(target: registry.Target, project: Project) -> dict[str, str]:
    """The secrets the target's adapter is built with ({} for a target needing none)."""
    if not target.credential_kind:
        return {}
    secrets = provider_secrets(project=project, kind=target.credential_kind)
    if secrets is None:
        raise MissingCredentials(
            f"project {project.slug} has no '{target.credential_kind}' credential any more"
        )
    return secrets


def adapter_for(
    target: registry.Target, project: Project, secrets: dict[str, str] | None = None
) -> ProviderAdapter:
    """The target's adapter with the project's key (or ``secrets`` already looked up)."""
    if target.adapter_factory is None:
        raise ValueError(f"target {target.name} has no provider adapter")
    return target.adapter_factory(
        secrets if secrets is not None else target_secrets(target, project)
    )


def target_problem(*, project: Project, target: registry.Target) -> tuple[str, str] | None:
    """Why ``project`` cannot run jobs on ``target`` now, as (error code, message); None if it
    can. Checked before any machine is rented."""
    problem = target.misconfiguration()
    if problem:
        return "target_unavailable", f"target '{target.name}' is not available: {problem}."
    if target.is_cloud and not storage.reachable_from_cloud():
        return (
            "storage_unreachable",
            f"target '{target.name}' runs on rented machines that cannot reach this "
            "installation's local storage; the operator must set TRAINHUB_STORAGE=s3 (with "
            "TRAINHUB_S3_BUCKET) or a public TRAINHUB_PUBLIC_URL.",
        )
    kind = target.credential_kind
    if kind and credential_source(project=project, kind=kind) is None:
        return (
            "missing_credentials",
            f"target '{target.name}' needs a '{kind}' credential in this project "
            "(POST /api/v1/credentials/) or operator credentials enabled for it.",
        )
    return None
