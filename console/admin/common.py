"""What every admin page shares: status colours, read-only inlines, job actions through the
services, and who acts.

Every admin change goes through a service with ``admin_actor(request)``, which writes the audit
trail (jobs.services.accounts.audit), and leaves a Django ``LogEntry`` (the index's "Recent actions")."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from django import forms
from django.contrib import admin, messages
from django.db import models, transaction
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html

from jobs.errors import ServiceError
from jobs.models import TrainingJob
from jobs.services.accounts.audit import Actor

M = TypeVar("M", bound=models.Model)

if TYPE_CHECKING:
    ModelAdmin = admin.ModelAdmin
    TabularInline = admin.TabularInline
    ModelForm = forms.ModelForm
else:

    class _Generic:
        """``X[Model]`` is ``X`` itself: django-stubs makes these classes generic in their model,
        Django does not (django_stubs_ext.monkeypatch() would, but that is a dev-only package)."""

        def __init__(self, cls: type) -> None:
            self._cls = cls

        def __getitem__(self, _model: object) -> type:
            return self._cls

    ModelAdmin = _Generic(admin.ModelAdmin)
    TabularInline = _Generic(admin.TabularInline)
    ModelForm = _Generic(forms.ModelForm)

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


class ViewOnlyAdmin(ModelAdmin[models.Model]):
    """A page to look at: rows another path writes (ingest, uploads, the audit trail) are never
    added, changed or deleted here. Subclasses say which path in a comment."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


class ReadOnlyInline(TabularInline[models.Model, models.Model]):
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


def admin_actor(request: HttpRequest) -> Actor:
    """The signed-in staff user, as the audit trail names them (source admin)."""
    return Actor.staff(request.user)


def each_through_service(
    modeladmin: admin.ModelAdmin[M],
    request: HttpRequest,
    objects: QuerySet[M] | list[M],
    action: Callable[[M, Actor], Any],
    *,
    message: str,
    deletion: bool = False,
) -> tuple[int, list[tuple[M, ServiceError]]]:
    """Run ``action(obj, actor)`` on each object, one transaction each, with its Django
    LogEntry (before the row goes, for a deletion). Returns how many succeeded and the
    refusals (nothing is logged for a refused one: its transaction rolled back)."""
    actor = admin_actor(request)
    done, refused = 0, list[tuple[M, ServiceError]]()
    for obj in objects:
        try:
            with transaction.atomic():
                if deletion:
                    modeladmin.log_deletions(request, type(obj)._default_manager.filter(pk=obj.pk))
                action(obj, actor)
                if not deletion:
                    modeladmin.log_change(request, obj, message)
            done += 1
        except ServiceError as exc:
            refused.append((obj, exc))
    return done, refused


def run_job_action(
    modeladmin: admin.ModelAdmin[TrainingJob],
    request: HttpRequest,
    queryset: QuerySet[TrainingJob],
    action: Callable[..., Any],
    verb: str,
) -> None:
    """A job action (``action(job=…, actor=…)``: a jobs.services.core.jobs function) on each selected
    job, by the signed-in staff user: an audit entry and a LogEntry per job it changed."""
    done = 0
    for job in queryset:
        try:
            with transaction.atomic():
                action(job=job, actor=admin_actor(request))
                modeladmin.log_change(request, job, f"{verb} (admin action).")
            done += 1
        except ServiceError as exc:
            # Not "ftjob-…: …": the admin template capitalises a message's first letter, which
            # would misspell the (case-sensitive) id.
            modeladmin.message_user(
                request, f"Skipped {job.public_id}: {exc.message}", messages.WARNING
            )
    if done:
        modeladmin.message_user(request, f"{verb} {done} job(s).", messages.SUCCESS)
