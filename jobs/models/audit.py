"""The audit trail: who changed what, when, from where, and what it was before.

Rows are append-only: the model refuses to update or delete one, and so does the database
(triggers made by migration 0008, on PostgreSQL and SQLite alike). Nothing here points at
another row with a foreign key, so deleting a user, a key, a node or a project never takes
its history with it; objects are named by their public id or name instead. Entries are
written by ``jobs.services.accounts.audit.audit_record`` only.
"""

from __future__ import annotations

from typing import Any, NoReturn

from django.db import models
from django.utils import timezone

from jobs.models.ids import public_id


def new_audit_id() -> str:
    return public_id("audit")


class AppendOnly(Exception):
    """An attempt to change or remove an audit entry."""


class AuditQuerySet(models.QuerySet["AuditEntry"]):
    def update(self, **kwargs: Any) -> NoReturn:
        raise AppendOnly("Audit entries are append-only: they cannot be updated.")

    def delete(self) -> NoReturn:
        raise AppendOnly("Audit entries are append-only: they cannot be deleted.")


class AuditEntry(models.Model):
    class Source(models.TextChoices):
        API = "api", "API"  # a bearer API key (or a browser session on the API)
        ADMIN = "admin", "admin"  # a staff user in the Django admin
        CLI = "cli", "manage.py"  # a management command
        SYSTEM = "system", "system"  # trainhub itself (tasks, defaults)

    public_id = models.CharField(max_length=40, unique=True, default=new_audit_id, editable=False)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    actor = models.CharField(max_length=150, help_text="Username, command, or 'system'.")
    source = models.CharField(max_length=10, choices=Source.choices)
    api_key_prefix = models.CharField(
        max_length=16, blank=True, help_text="The key's public prefix when the source is api."
    )
    action = models.CharField(max_length=64, help_text="<object>.<verb>, e.g. job.cancel.")
    object_type = models.CharField(max_length=40)
    object_id = models.CharField(max_length=150, help_text="Public id, name or key prefix.")
    object_repr = models.CharField(max_length=200, blank=True)
    project_id = models.BigIntegerField(null=True, blank=True)
    project_slug = models.CharField(max_length=100, blank=True)
    changes = models.JSONField(
        default=dict,
        blank=True,
        help_text='{"field": {"from": before, "to": after}}; secrets only as "set"/"rotated".',
    )

    objects = AuditQuerySet.as_manager()

    class Meta:
        verbose_name_plural = "audit entries"
        indexes = [
            models.Index(fields=["object_type", "object_id", "-id"], name="audit_object"),
            models.Index(fields=["action", "-id"], name="audit_action"),
            models.Index(fields=["project_slug", "-id"], name="audit_project"),
            models.Index(fields=["actor", "-id"], name="audit_actor"),
        ]

    def __str__(self) -> str:
        return f"{self.action} {self.object_id} by {self.actor} ({self.source})"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if not self._state.adding:
            raise AppendOnly("Audit entries are append-only: they cannot be updated.")
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise AppendOnly("Audit entries are append-only: they cannot be deleted.")
