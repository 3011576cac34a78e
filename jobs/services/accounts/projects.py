"""Projects (settings, members), API keys and provider credentials.

Every operator and user change here is recorded in the audit trail (services.audit) in its
own transaction; secrets only as "set"."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Mapping
from datetime import timedelta
from decimal import Decimal, InvalidOperation
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import IntegrityError, models, transaction
from django.db.models import Exists, OuterRef
from django.utils import timezone
from django.utils.text import slugify

from jobs import crypto
from jobs.errors import Conflict, InvalidRequest, NotFound
from jobs.models import (
    ApiKey,
    JobAttempt,
    Project,
    ProjectMembership,
    ProviderCredential,
    WebhookEndpoint,
)
from jobs.services.accounts.audit import SYSTEM, Actor, audit_record, created, deleted, diff
from providers.registry import CREDENTIAL_KINDS

API_KEY_PREFIX = "th-"
_PREFIX_CHARS = 12  # th- + 9 random chars: the public, indexed part of a key
LAST_USED_RESOLUTION = timedelta(minutes=1)  # bounds writes from hot keys


def project_create(*, name: str, owner: User, default: bool = False) -> Project:
    base = slugify(name)[:80] or "project"
    slug, n = base, 1
    while Project.objects.filter(slug=slug).exists():
        n += 1
        slug = f"{base}-{n}"
    with transaction.atomic():
        project = Project.objects.create(
            name=name, slug=slug, max_concurrent_jobs=settings.TRAINHUB_DEFAULT_MAX_CONCURRENT_JOBS
        )
        ProjectMembership.objects.create(
            project=project, user=owner, role=ProjectMembership.Role.OWNER, is_default=default
        )
    return project


def project_default_for_user(*, user: User) -> Project:
    """The user's default project, created on first use."""
    membership = (
        ProjectMembership.objects.select_related("project")
        .filter(user=user, is_default=True)
        .first()
    )
    if membership:
        return membership.project
    try:
        return project_create(name=f"{user.get_username()}-default", owner=user, default=True)
    except IntegrityError:  # a concurrent request created it first
        return ProjectMembership.objects.get(user=user, is_default=True).project


def project_member_add(*, project: Project, user: User, role: str = "member") -> None:
    ProjectMembership.objects.get_or_create(project=project, user=user, defaults={"role": role})


def _hash_key(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


def api_key_create(
    *, user: User, name: str, project: Project | None = None, actor: Actor = SYSTEM
) -> tuple[ApiKey, str]:
    """Create a key and return it with its raw value, which is never retrievable again."""
    project = project or project_default_for_user(user=user)
    if not ProjectMembership.objects.filter(project=project, user=user).exists():
        raise NotFound(f"No project '{project.slug}' for this user.", code="project_not_found")
    raw = API_KEY_PREFIX + secrets.token_urlsafe(32)
    with transaction.atomic():
        key = ApiKey.objects.create(
            user=user,
            project=project,
            name=name,
            prefix=raw[:_PREFIX_CHARS],
            key_sha256=_hash_key(raw),
        )
        audit_record(
            actor=actor,
            action="api_key.create",
            obj=key,
            changes=created({"name": name, "user": user.get_username(), "secret": "set"}),
        )
    return key, raw


def api_key_authenticate(*, raw: str) -> ApiKey | None:
    """The live key for ``raw``, or None. Constant-time compare on the hash."""
    if not raw.startswith(API_KEY_PREFIX) or len(raw) < _PREFIX_CHARS + 8:
        return None
    key = (
        ApiKey.objects.select_related("user", "project")
        .annotate(
            # A key acts in one project; once its user leaves that project it opens nothing.
            is_member=Exists(
                ProjectMembership.objects.filter(project=OuterRef("project"), user=OuterRef("user"))
            )
        )
        .filter(prefix=raw[:_PREFIX_CHARS], revoked_at__isnull=True)
        .first()
    )
    if key is None or not hmac.compare_digest(key.key_sha256, _hash_key(raw)):
        return None
    if not key.user.is_active:
        return None
    now = timezone.now()
    if key.last_used_at is None or now - key.last_used_at > LAST_USED_RESOLUTION:
        ApiKey.objects.filter(pk=key.pk).update(last_used_at=now)
        key.last_used_at = now
    return key


def api_key_revoke(*, key: ApiKey, actor: Actor = SYSTEM) -> bool:
    """Revoke a key for good (nothing un-revokes one). True if this call revoked it; a key
    already revoked stays as it was and nothing is recorded."""
    now = timezone.now()
    with transaction.atomic():
        revoked = ApiKey.objects.filter(pk=key.pk, revoked_at__isnull=True).update(revoked_at=now)
        if revoked:
            key.revoked_at = now
            audit_record(
                actor=actor,
                action="api_key.revoke",
                obj=key,
                changes={"revoked_at": {"from": None, "to": now}},
            )
    return bool(revoked)


def api_key_rename(*, key: ApiKey, name: str, actor: Actor = SYSTEM) -> ApiKey:
    """Change a key's label (the only thing about a key that may change but its revocation)."""
    if not isinstance(name, str) or not 0 < len(name) <= 100:
        raise InvalidRequest(
            "name must be 1 to 100 characters.", code="invalid_value", param="name"
        )
    with transaction.atomic():
        before = ApiKey.objects.select_for_update().values_list("name", flat=True).get(pk=key.pk)
        changes = diff({"name": before}, {"name": name})
        if changes:
            ApiKey.objects.filter(pk=key.pk).update(name=name)
            key.name = name
            audit_record(actor=actor, action="api_key.update", obj=key, changes=changes)
    return key


SECRET_MAX_CHARS = 1024


def _header_safe(value: object) -> bool:
    """A key the adapters can send: it travels in an HTTP header (printable ASCII, no space)."""
    return (
        isinstance(value, str)
        and 0 < len(value) <= SECRET_MAX_CHARS
        and value.isascii()
        and value.isprintable()
        and " " not in value
    )


def credential_create(
    *, project: Project, provider: str, name: str, secrets: object, actor: Actor = SYSTEM
) -> ProviderCredential:
    fields = CREDENTIAL_KINDS.get(provider)
    if fields is None:
        raise InvalidRequest(
            f"Unknown provider '{provider}'; known: {', '.join(sorted(CREDENTIAL_KINDS))}.",
            code="invalid_provider",
            param="provider",
        )
    if not isinstance(secrets, dict):
        raise InvalidRequest("secrets must be an object.", code="invalid_type", param="secrets")
    missing = [f for f in fields if not _header_safe(secrets.get(f))]
    unknown = sorted(set(secrets) - set(fields))
    if missing or unknown:
        problem = (
            f"missing or not 1-{SECRET_MAX_CHARS} printable ASCII characters: {', '.join(missing)}"
            if missing
            else f"unknown {', '.join(unknown)}"
        )
        raise InvalidRequest(
            f"{provider} credentials need exactly: {', '.join(fields)} ({problem}).",
            code="invalid_secrets",
            param="secrets",
        )
    try:
        with (
            transaction.atomic()
        ):  # a savepoint, so a duplicate leaves the caller's transaction usable
            credential = ProviderCredential.objects.create(
                project=project,
                provider=provider,
                name=name,
                secret_ciphertext=crypto.encrypt_json({f: str(secrets[f]) for f in fields}),
                secret_fields=list(fields),
            )
            audit_record(
                actor=actor,
                action="credential.create",
                obj=credential,
                changes=created({"provider": provider, "name": name, "stored_fields": list(fields)})
                | {"secrets": {"from": None, "to": "set"}},
            )
            return credential
    except IntegrityError:
        raise Conflict(
            f"A {provider} credential named '{name}' already exists.",
            code="duplicate",
            param="name",
        ) from None


def credential_rename(
    *, credential: ProviderCredential, name: str, actor: Actor = SYSTEM
) -> ProviderCredential:
    if not isinstance(name, str) or not 0 < len(name) <= 100:
        raise InvalidRequest(
            "name must be 1 to 100 characters.", code="invalid_value", param="name"
        )
    try:
        with transaction.atomic():
            row = ProviderCredential.objects.select_for_update().get(pk=credential.pk)
            changes = diff({"name": row.name}, {"name": name})
            if changes:
                ProviderCredential.objects.filter(pk=row.pk).update(name=name)
                credential.name = name
                audit_record(
                    actor=actor, action="credential.update", obj=credential, changes=changes
                )
    except IntegrityError:
        raise Conflict(
            f"A {credential.provider} credential named '{name}' already exists.",
            code="duplicate",
            param="name",
        ) from None
    return credential


def credential_delete(*, credential: ProviderCredential, actor: Actor = SYSTEM) -> None:
    """Delete a credential: its secrets are gone; jobs on its provider need another one."""
    with transaction.atomic():
        audit_record(
            actor=actor,
            action="credential.delete",
            obj=credential,
            changes=deleted({"provider": credential.provider, "name": credential.name})
            | {"secrets": {"from": "set", "to": None}},
        )
        credential.delete()


def credential_secrets(*, credential: ProviderCredential) -> dict[str, str]:
    return crypto.decrypt_json(credential.secret_ciphertext)


# Every secret stored encrypted (jobs.crypto), by model and field: what a key rotation rewrites.
ENCRYPTED_FIELDS: tuple[tuple[type[models.Model], str], ...] = (
    (ProviderCredential, "secret_ciphertext"),
    (WebhookEndpoint, "secret_ciphertext"),
    (WebhookEndpoint, "previous_secret_ciphertext"),
    (JobAttempt, "ssh_private_key_ciphertext"),
)


def secrets_reencrypt() -> dict[str, int]:
    """Re-encrypt every stored secret under the newest key: provider credentials, webhook
    endpoints' signing secrets (and a rotated one's previous secret), rented machines' SSH
    keys. Returns how many were rewritten per field, named ``model.field``; after it, the old
    key can go."""
    counts: dict[str, int] = {}
    for model, field in ENCRYPTED_FIELDS:
        rows = model._default_manager.exclude(**{field: ""}).values_list("pk", field)
        count = 0
        for pk, token in rows.iterator():
            # Only if unchanged meanwhile (a secret rotated since was written under the new key).
            count += model._default_manager.filter(pk=pk, **{field: token}).update(
                **{field: crypto.rotate(token)}
            )
        counts[f"{model._meta.model_name}.{field}"] = count
    return counts


# --- project settings -------------------------------------------------------------------------

PROJECT_SETTINGS = (
    "name",
    "slug",
    "max_concurrent_jobs",
    "max_spend_per_hour",
    "operator_credential_providers",
)


def _project_settings(data: Mapping[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(data) - set(PROJECT_SETTINGS))
    if unknown:
        raise InvalidRequest(
            f"Unknown project setting {unknown[0]!r}; settings: {', '.join(PROJECT_SETTINGS)}.",
            code="invalid_value",
            param=unknown[0],
        )
    fields = dict(data)
    if "operator_credential_providers" in fields:
        kinds = fields["operator_credential_providers"]
        if not isinstance(kinds, list | tuple) or any(k not in CREDENTIAL_KINDS for k in kinds):
            raise InvalidRequest(
                "operator_credential_providers must be a list of provider kinds among: "
                f"{', '.join(sorted(CREDENTIAL_KINDS))}.",
                code="invalid_value",
                param="operator_credential_providers",
            )
        fields["operator_credential_providers"] = sorted(set(kinds))
    if "max_concurrent_jobs" in fields:
        value = fields["max_concurrent_jobs"]
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise InvalidRequest(
                "max_concurrent_jobs must be a whole number, 0 or more.",
                code="invalid_value",
                param="max_concurrent_jobs",
            )
    if fields.get("max_spend_per_hour") is not None:
        try:
            spend = Decimal(str(fields["max_spend_per_hour"]))
        except InvalidOperation:
            spend = Decimal(-1)
        if not spend.is_finite() or spend < 0:
            raise InvalidRequest(
                "max_spend_per_hour must be a number of USD, 0 or more (empty: no ceiling).",
                code="invalid_value",
                param="max_spend_per_hour",
            )
        fields["max_spend_per_hour"] = spend
    return fields


def project_update(*, project: Project, data: Mapping[str, Any], actor: Actor = SYSTEM) -> Project:
    """Change a project's settings (PROJECT_SETTINGS); a project not saved yet is created.
    One audit entry with what changed (none when nothing did)."""
    fields = _project_settings(data)
    with transaction.atomic():
        if project.pk is None:
            for name, value in fields.items():
                setattr(project, name, value)
            project.save()
            audit_record(
                actor=actor,
                action="project.create",
                obj=project,
                changes=created(
                    {
                        f: value
                        for f in PROJECT_SETTINGS
                        if (value := getattr(project, f)) not in (None, "", [])
                    }
                ),
            )
            return project
        row = Project.objects.select_for_update().get(pk=project.pk)
        changes = diff({f: getattr(row, f) for f in fields}, fields)
        if changes:
            Project.objects.filter(pk=row.pk).update(**fields)
            for name, value in fields.items():
                setattr(project, name, value)
            audit_record(actor=actor, action="project.update", obj=project, changes=changes)
    return project


def project_members(*, project: Project) -> dict[str, str]:
    """The project's members as ``{username: role}`` (what a members change is recorded as)."""
    return dict(
        ProjectMembership.objects.filter(project=project)
        .order_by("user__username")
        .values_list("user__username", "role")
    )


def project_members_record(
    *, project: Project, before: Mapping[str, str], actor: Actor = SYSTEM
) -> None:
    """Record a change of members made by a form (the admin's inline) in the transaction
    that saved it: ``before`` is project_members() read before the save."""
    after = project_members(project=project)
    if dict(before) != after:
        audit_record(
            actor=actor,
            action="project.members",
            obj=project,
            changes={"members": {"from": dict(before), "to": after}},
        )


def project_delete(*, project: Project, actor: Actor = SYSTEM) -> None:
    """Delete a project with everything in it (jobs, files, keys, credentials); its audit
    trail stays."""
    with transaction.atomic():
        audit_record(
            actor=actor,
            action="project.delete",
            obj=project,
            changes=deleted({"name": project.name, "slug": project.slug}),
        )
        project.delete()
