"""Projects, memberships, API keys and provider credentials."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from datetime import timedelta

from django.conf import settings
from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.db.models import Exists, OuterRef
from django.utils import timezone
from django.utils.text import slugify

from jobs import crypto
from jobs.errors import Conflict, InvalidRequest, NotFound
from jobs.models import ApiKey, Project, ProjectMembership, ProviderCredential
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


def api_key_create(*, user: User, name: str, project: Project | None = None) -> tuple[ApiKey, str]:
    """Create a key and return it with its raw value, which is never retrievable again."""
    project = project or project_default_for_user(user=user)
    if not ProjectMembership.objects.filter(project=project, user=user).exists():
        raise NotFound(f"No project '{project.slug}' for this user.", code="project_not_found")
    raw = API_KEY_PREFIX + secrets.token_urlsafe(32)
    key = ApiKey.objects.create(
        user=user, project=project, name=name, prefix=raw[:_PREFIX_CHARS], key_sha256=_hash_key(raw)
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


def api_key_revoke(*, key: ApiKey) -> None:
    ApiKey.objects.filter(pk=key.pk, revoked_at__isnull=True).update(revoked_at=timezone.now())


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
    *, project: Project, provider: str, name: str, secrets: object
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
            return ProviderCredential.objects.create(
                project=project,
                provider=provider,
                name=name,
                secret_ciphertext=crypto.encrypt_json({f: str(secrets[f]) for f in fields}),
                secret_fields=list(fields),
            )
    except IntegrityError:
        raise Conflict(
            f"A {provider} credential named '{name}' already exists.",
            code="duplicate",
            param="name",
        ) from None


def credential_secrets(*, credential: ProviderCredential) -> dict[str, str]:
    return crypto.decrypt_json(credential.secret_ciphertext)


def credentials_reencrypt() -> int:
    """Re-encrypt every credential under the newest key; returns how many were rewritten."""
    count = 0
    for cred in ProviderCredential.objects.only("pk", "secret_ciphertext").iterator():
        ProviderCredential.objects.filter(pk=cred.pk).update(
            secret_ciphertext=crypto.rotate(cred.secret_ciphertext)
        )
        count += 1
    return count
