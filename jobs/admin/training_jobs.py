"""Jobs: the list, the job page (attempts, latest events) and the job actions."""

from __future__ import annotations

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from jobs.admin.common import ReadOnlyInline, colored, run_job_action
from jobs.models import (
    JobAttempt,
    JobEvent,
    TrainingJob,
)
from jobs.services import jobs as job_services

ADMIN_EVENTS = 50  # events shown on a job's page


class AttemptInline(ReadOnlyInline):
    model = JobAttempt
    fields = (
        "number",
        "target",
        "node_name",
        "provider_instance_id",
        "ssh_host",
        "ssh_port",
        "lease_expires_at",
        "stop_requested_at",
        "started_at",
        "ended_at",
        "end_reason",
        "offer",
        "launched_at",
        "billed_rate_per_hour",
        "estimated_cost",
        "cost",
    )


class EventInline(ReadOnlyInline):
    """The job's latest events, newest first, without the per-second metrics and heartbeats
    (the events API and the live stream have every one): a long job's page stays short."""

    model = JobEvent
    fields = ("number", "attempt", "type", "level", "message", "at")
    ordering = ("-number",)
    verbose_name_plural = f"latest {ADMIN_EVENTS} events (metrics and heartbeats left out)"

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        shown = super().get_queryset(request).exclude(type__in=("metrics", "heartbeat"))
        job_pk = request.resolver_match.kwargs.get("object_id") if request.resolver_match else None
        if job_pk is None:
            return shown.none()
        # By ids: the formset filters by job after this, which a sliced queryset refuses.
        latest = shown.filter(job_id=job_pk).order_by("-number").values_list("pk", flat=True)
        return shown.filter(pk__in=list(latest[:ADMIN_EVENTS])).order_by("-number")

    @admin.display(description="at (UTC)")
    def at(self, obj: JobEvent) -> str:
        return obj.created_at.strftime("%Y-%m-%d %H:%M:%S") if obj.created_at else ""


@admin.action(description="Cancel selected jobs")
def cancel_jobs(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet) -> None:
    run_job_action(modeladmin, request, queryset, job_services.job_cancel, "Cancelled")


@admin.action(description="Pause selected jobs")
def pause_jobs(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet) -> None:
    run_job_action(modeladmin, request, queryset, job_services.job_pause, "Paused")


@admin.action(description="Resume selected jobs")
def resume_jobs(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet) -> None:
    run_job_action(modeladmin, request, queryset, job_services.job_resume, "Resumed")


@admin.action(description="Retry selected jobs")
def retry_jobs(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet) -> None:
    run_job_action(modeladmin, request, queryset, job_services.job_retry, "Requeued")


@admin.register(TrainingJob)
class TrainingJobAdmin(admin.ModelAdmin):
    list_display = (
        "public_id",
        "colored_status",
        "model",
        "target",
        "project",
        "cost",
        "created_at",
        "finished_at",
    )
    list_filter = ("status", "target", "project")
    search_fields = ("public_id", "model", "suffix", "project__slug")
    list_select_related = ("project",)
    inlines = [AttemptInline, EventInline]
    actions = [cancel_jobs, pause_jobs, resume_jobs, retry_jobs]
    # Operators may reprioritise a queued job; everything else goes through the services.
    readonly_fields = [f.name for f in TrainingJob._meta.fields if f.name != "priority"]

    @admin.display(description="status", ordering="status")
    def colored_status(self, obj: TrainingJob) -> str:
        return colored(obj.status)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # jobs are created through the API, which validates them
