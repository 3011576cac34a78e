"""What every admin page shares: status colours, read-only inlines, job actions through the services."""

from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html

from jobs.errors import ServiceError

STATUS_COLORS = {
    "validating_files": "#8250df",
    "queued": "#bf8700",
    "succeeded": "#1a7f37",
    "failed": "#cf222e",
    "cancelled": "#6e7781",
    "cancelling": "#9a6700",
    "paused": "#9a6700",
    "running": "#0969da",
    "finalizing": "#0969da",
    "provisioning": "#8250df",
    "idle": "#1a7f37",
    "busy": "#0969da",
    "draining": "#9a6700",
    "offline": "#6e7781",
}


class ReadOnlyInline(admin.TabularInline):
    extra = 0
    can_delete = False
    show_change_link = False

    def has_add_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def get_readonly_fields(self, request: HttpRequest, obj: object = None) -> tuple[str, ...]:
        # Without this the inline's form is built over every listed field, and a non-editable
        # one (JobEvent.created_at) makes the job's change page fail with a FieldError.
        return tuple(str(f) for f in self.fields or ())


def colored(status: str) -> str:
    return format_html('<b style="color:{}">{}</b>', STATUS_COLORS.get(status, "#24292f"), status)


def run_job_action(
    modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet, action, verb: str
) -> None:
    done = 0
    for job in queryset:
        try:
            action(job=job)
            done += 1
        except ServiceError as exc:
            # Not "ftjob-…: …": the admin template capitalises a message's first letter, which
            # would misspell the (case-sensitive) id.
            modeladmin.message_user(
                request, f"Skipped {job.public_id}: {exc.message}", messages.WARNING
            )
    if done:
        modeladmin.message_user(request, f"{verb} {done} job(s).", messages.SUCCESS)
