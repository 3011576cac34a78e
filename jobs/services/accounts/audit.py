"""The audit trail's one writer: who changed what, from where, and what it was before.

Every state-changing service takes ``actor: Actor`` (keyword, default :data:`SYSTEM`) and,
inside the transaction of its change, calls :func:`audit_record` once, only when something
changed: a refused action, a repeat that changes nothing and an idempotent replay write nothing.
Callers build the actor where they know who acts:

- the API: ``Actor.api_key(request.auth)`` (``api.auth.request_actor``);
- the admin: ``Actor.staff(request.user)``;
- management commands: ``Actor.command("create_node")``;
- trainhub itself: ``SYSTEM`` (the default).

``changes`` maps a field to ``{"from": before, "to": after}``. Secrets never appear: a field
named like one (secret, token, key, password, ciphertext) may only say ``"set"`` or
``"rotated"``, and :func:`audit_record` refuses anything else.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any
from urllib.parse import urlsplit

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db import models, transaction

from jobs.models import (
    ApiKey,
    AuditEntry,
    GpuNode,
    Project,
    ProviderCredential,
    TrainingJob,
    WebhookEndpoint,
)

SET = "set"  # a secret was given (created)
ROTATED = "rotated"  # a secret was replaced
_SECRET_MARKERS = (SET, ROTATED, None)
_SECRET_WORDS = ("secret", "token", "password", "ciphertext", "key_sha256", "raw_key")

Source = AuditEntry.Source


@dataclass(frozen=True)
class Actor:
    """Who acts, and through what. ``name`` is a username, a command or ``system``."""

    source: str
    name: str
    api_key_prefix: str = ""

    @classmethod
    def api_key(cls, key: ApiKey) -> Actor:
        """A request authenticated with a bearer key: its user, and the key's public prefix."""
        return cls(Source.API, key.user.get_username(), key.prefix)

    @classmethod
    def api_user(cls, user: AbstractBaseUser | AnonymousUser) -> Actor:
        """An API request on a browser session (no key)."""
        return cls(Source.API, user.get_username())

    @classmethod
    def staff(cls, user: AbstractBaseUser | AnonymousUser) -> Actor:
        """A staff user in the Django admin."""
        return cls(Source.ADMIN, user.get_username())

    @classmethod
    def command(cls, command: str) -> Actor:
        """A ``manage.py`` command (source cli)."""
        return cls(Source.CLI, f"manage.py {command}")

    @classmethod
    def system(cls, name: str = "system") -> Actor:
        return cls(Source.SYSTEM, name)

    @classmethod
    def coerce(cls, value: Actor | str) -> Actor:
        """An actor from older callers that name one as a bare string (``node_create(...,
        actor="ops")``): recorded as a system actor of that name."""
        if isinstance(value, Actor):
            return value
        return cls.system(value or "system")

    @property
    def label(self) -> str:
        """How the actor reads in a short line (NodeEvent.actor)."""
        return self.name


SYSTEM = Actor.system()


@dataclass(frozen=True)
class AuditObject:
    """What an entry is about, for objects that are not one of the models below."""

    type: str
    id: str
    repr: str = ""
    project: Project | None = None


def redacted_url(url: str) -> str:
    """A URL as the audit trail keeps it: scheme and host, and a fingerprint of the rest (a
    webhook URL's path or query often is a secret: Slack's, Discord's, a token parameter)."""
    parts = urlsplit(url)
    digest = hashlib.sha256(url.encode()).hexdigest()[:12]
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}/… (sha256 {digest})"


def _describe(obj: models.Model | AuditObject) -> AuditObject:
    if isinstance(obj, AuditObject):
        return obj
    if isinstance(obj, TrainingJob):
        return AuditObject("fine_tuning.job", obj.public_id, obj.model, obj.project)
    if isinstance(obj, ApiKey):
        return AuditObject("api_key", obj.prefix, obj.name, obj.project)
    if isinstance(obj, ProviderCredential):
        return AuditObject("provider_credential", str(obj.pk), str(obj), obj.project)
    if isinstance(obj, GpuNode):
        return AuditObject("gpu_node", obj.name, obj.name)
    if isinstance(obj, WebhookEndpoint):
        return AuditObject("webhook_endpoint", obj.public_id, redacted_url(obj.url), obj.project)
    if isinstance(obj, Project):
        return AuditObject("project", obj.slug, obj.name, obj)
    raise TypeError(f"audit_record: no description for {type(obj).__name__}; pass an AuditObject.")


def jsonable(value: Any) -> Any:
    """A value as the ``changes`` JSON holds it."""
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, models.Model):
        return getattr(value, "public_id", None) or str(value)
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    return value


def diff(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """``{"field": {"from", "to"}}`` for each field of ``after`` whose value changed."""
    out = {}
    for name, value in after.items():
        old, new = jsonable(before.get(name)), jsonable(value)
        if old != new:
            out[name] = {"from": old, "to": new}
    return out


def created(fields: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The changes of a create: every field from nothing."""
    return {name: {"from": None, "to": jsonable(value)} for name, value in fields.items()}


def deleted(fields: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The changes of a delete: every field to nothing."""
    return {name: {"from": jsonable(value), "to": None} for name, value in fields.items()}


def _refuse_secrets(changes: Mapping[str, Any]) -> None:
    for name, change in changes.items():
        if not any(word in name.lower() for word in _SECRET_WORDS):
            continue
        values = change.values() if isinstance(change, Mapping) else [change]
        if any(v not in _SECRET_MARKERS for v in values):
            raise ValueError(
                f"audit_record: {name!r} looks like a secret; record it as "
                f"{SET!r} or {ROTATED!r}, never its value."
            )


def audit_record(
    *,
    actor: Actor,
    action: str,
    obj: models.Model | AuditObject,
    changes: Mapping[str, Any] | None = None,
    project: Project | None = None,
) -> AuditEntry:
    """Append one entry. Call it inside the transaction of the change it records, so the two
    commit or roll back together (a change never goes unrecorded, nor a refusal recorded).
    ``project`` overrides the object's own (a project's object names it already)."""
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("audit_record runs inside the transaction of the change it records.")
    changes = jsonable(dict(changes or {}))
    _refuse_secrets(changes)
    described = _describe(obj)
    owner = project or described.project
    return AuditEntry.objects.create(
        actor=actor.name[:150],
        source=actor.source,
        api_key_prefix=actor.api_key_prefix if actor.source == Source.API else "",
        action=action,
        object_type=described.type,
        object_id=described.id[:150],
        object_repr=described.repr[:200],
        project_id=owner.pk if owner is not None else None,
        project_slug=owner.slug if owner is not None else "",
        changes=changes,
    )
