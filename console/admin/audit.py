"""The audit trail: every operator and API change, read-only (append-only in the database)."""

from __future__ import annotations

import json

from django.contrib import admin
from django.utils.html import format_html, format_html_join
from django.utils.text import Truncator

from console.admin.common import ViewOnlyAdmin
from jobs.models import AuditEntry

SHOWN_CHARS = 60  # a long value (a model path, a URL fingerprint) is cut in the list


def _shown(value: object, limit: int | None) -> str:
    text = (
        "—"
        if value is None
        else value
        if isinstance(value, str)
        else json.dumps(value, sort_keys=True)
    )
    return Truncator(text).chars(limit) if limit else text


def _changes(entry: AuditEntry, limit: int | None) -> str:
    """``field: before → after`` lines (values cut at ``limit`` characters in the list)."""
    return format_html_join(
        "",
        "<div><b>{}</b>: {} → {}</div>",
        (
            (name, _shown(change.get("from"), limit), _shown(change.get("to"), limit))
            if isinstance(change, dict)
            else (name, "", _shown(change, limit))
            for name, change in (entry.changes or {}).items()
        ),
    )


@admin.register(AuditEntry)
class AuditEntryAdmin(ViewOnlyAdmin):
    """Append-only: nobody adds, changes or deletes an entry here (the database refuses too)."""

    change_list_template = "admin/jobs/wide_change_list.html"
    list_display = ("at", "who", "action", "object_label", "project_slug", "changes_summary")
    list_display_links = ("at",)
    list_filter = ("source", "action", "object_type")
    search_fields = ("actor", "api_key_prefix", "action", "object_id", "object_repr",
                     "project_slug", "public_id")  # fmt: skip
    date_hierarchy = "created_at"
    ordering = ("-id",)
    fields = ("public_id", "created_at", "actor", "source", "api_key_prefix", "action",
              "object_type", "object_id", "object_repr", "project_slug", "project_id",
              "changes_table")  # fmt: skip
    readonly_fields = fields

    @admin.display(description="at (UTC)", ordering="created_at")
    def at(self, obj: AuditEntry) -> str:
        return obj.created_at.strftime("%Y-%m-%d %H:%M:%S")

    @admin.display(description="who", ordering="actor")
    def who(self, obj: AuditEntry) -> str:
        # The key prefix says which of the user's keys acted (never the key itself).
        via = f"{obj.get_source_display()} {obj.api_key_prefix}".strip()
        return format_html("{}<div class='quiet'>{}</div>", obj.actor, via)

    @admin.display(description="object", ordering="object_id")
    def object_label(self, obj: AuditEntry) -> str:
        return format_html(
            "{} <code>{}</code><div class='quiet' title='{}'>{}</div>",
            obj.object_type, obj.object_id, obj.object_repr,
            Truncator(obj.object_repr).chars(SHOWN_CHARS),
        )  # fmt: skip

    @admin.display(description="changes")
    def changes_summary(self, obj: AuditEntry) -> str:
        return _changes(obj, SHOWN_CHARS)

    @admin.display(description="changes (before → after)")
    def changes_table(self, obj: AuditEntry) -> str:
        return _changes(obj, None) or format_html("<i>{}</i>", "no field changes")
