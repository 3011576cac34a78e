"""The audit trail: every operator and API change, read-only (append-only in the database)."""

from __future__ import annotations

import json

from django.contrib import admin
from django.http import HttpRequest
from django.utils.html import format_html, format_html_join

from jobs.models import AuditEntry


def _shown(value: object) -> str:
    if value is None:
        return "—"
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True)


@admin.register(AuditEntry)
class AuditEntryAdmin(admin.ModelAdmin):
    list_display = ("created_at", "actor", "source", "api_key_prefix", "action", "object_label",
                    "project_slug", "changes_summary")  # fmt: skip
    list_filter = ("source", "action", "object_type")
    search_fields = ("actor", "api_key_prefix", "action", "object_id", "object_repr",
                     "project_slug", "public_id")  # fmt: skip
    date_hierarchy = "created_at"
    ordering = ("-id",)
    fields = ("public_id", "created_at", "actor", "source", "api_key_prefix", "action",
              "object_type", "object_id", "object_repr", "project_slug", "project_id",
              "changes_table")  # fmt: skip
    readonly_fields = fields

    @admin.display(description="object")
    def object_label(self, obj: AuditEntry) -> str:
        label = f"{obj.object_type} {obj.object_id}"
        return f"{label} ({obj.object_repr})" if obj.object_repr else label

    @admin.display(description="changes")
    def changes_summary(self, obj: AuditEntry) -> str:
        return format_html_join(
            "",
            "<div><b>{}</b>: {} → {}</div>",
            (
                (name, _shown(change.get("from")), _shown(change.get("to")))
                if isinstance(change, dict)
                else (name, "", _shown(change))
                for name, change in (obj.changes or {}).items()
            ),
        )

    @admin.display(description="changes (before → after)")
    def changes_table(self, obj: AuditEntry) -> str:
        rows = self.changes_summary(obj)
        return rows or format_html("<i>{}</i>", "no field changes")

    # Append-only: nobody adds, changes or deletes an entry here (the database refuses too).
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False
