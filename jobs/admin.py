"""Operator views. Actions go through the same services as the API; secrets never show."""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils.html import format_html

from jobs.errors import ServiceError
from jobs.models import (
    ApiKey,
    Artifact,
    GpuNode,
    JobAttempt,
    JobEvent,
    NodeEvent,
    Project,
    ProjectMembership,
    ProviderCredential,
    StorageDeletion,
    TrainingFile,
    TrainingJob,
    WebhookAttempt,
    WebhookDelivery,
    WebhookEndpoint,
)
from jobs.models.webhooks import EVENT_TYPES as WEBHOOK_EVENT_TYPES
from jobs.services import jobs as job_services
from jobs.services import nodes as node_services
from jobs.services import webhook_delivery, webhook_endpoints

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


ADMIN_EVENTS = 50  # events shown on a job's page


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


def _run_service(
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


@admin.action(description="Cancel selected jobs")
def cancel_jobs(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet) -> None:
    _run_service(modeladmin, request, queryset, job_services.job_cancel, "Cancelled")


admin.site.site_header = "trainhub operations"
admin.site.site_title = "trainhub admin"
admin.site.index_title = "Jobs, GPU fleet, providers and webhooks"


@admin.action(description="Pause selected jobs")
def pause_jobs(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet) -> None:
    _run_service(modeladmin, request, queryset, job_services.job_pause, "Paused")


@admin.action(description="Resume selected jobs")
def resume_jobs(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet) -> None:
    _run_service(modeladmin, request, queryset, job_services.job_resume, "Resumed")


@admin.action(description="Retry selected jobs")
def retry_jobs(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet) -> None:
    _run_service(modeladmin, request, queryset, job_services.job_retry, "Requeued")


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
        return _colored(obj.status)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # jobs are created through the API, which validates them


def _colored(status: str) -> str:
    return format_html('<b style="color:{}">{}</b>', STATUS_COLORS.get(status, "#24292f"), status)


class NodeEventInline(ReadOnlyInline):
    model = NodeEvent
    fields = ("created_at", "kind", "message", "actor")
    ordering = ("-id",)


@admin.register(GpuNode)
class GpuNodeAdmin(admin.ModelAdmin):
    """Nodes are created (and tokens rotated) with the API or `manage.py create_node`, which
    show the token once; the admin never shows it."""

    list_display = ("name", "node_status", "draining", "gpus", "labels", "current_attempt",
                    "last_heartbeat_at")  # fmt: skip
    list_filter = ("status", "draining", "ephemeral")
    search_fields = ("name",)
    exclude = ("token_sha256",)
    readonly_fields = [f.name for f in GpuNode._meta.fields if f.name != "token_sha256"]
    inlines = [NodeEventInline]
    actions = ["drain", "undrain", "delete_offline"]

    @admin.display(description="status", ordering="status")
    def node_status(self, obj: GpuNode) -> str:
        return _colored(obj.status)

    @admin.display(description="GPUs")
    def gpus(self, obj: GpuNode) -> str:
        gpus = (obj.capabilities or {}).get("gpus") or []
        return ", ".join(f"{g.get('name')} ({g.get('vram_mb')} MiB)" for g in gpus) or "none"

    def _each(self, request: HttpRequest, queryset: QuerySet, action, verb: str) -> None:
        done = 0
        for node in queryset:
            try:
                action(node=node, actor=request.user.get_username())
                done += 1
            except ServiceError as exc:
                self.message_user(request, f"Skipped {node.name}: {exc.message}", messages.WARNING)
        if done:
            self.message_user(request, f"{verb} {done} node(s).", messages.SUCCESS)

    @admin.action(description="Drain selected nodes (finish the current job, take no new one)")
    def drain(self, request: HttpRequest, queryset: QuerySet) -> None:
        self._each(
            request, queryset,
            lambda **kw: node_services.node_set_draining(draining=True, **kw), "Draining",
        )  # fmt: skip

    @admin.action(description="Undrain selected nodes")
    def undrain(self, request: HttpRequest, queryset: QuerySet) -> None:
        self._each(
            request, queryset,
            lambda **kw: node_services.node_set_draining(draining=False, **kw), "Undrained",
        )  # fmt: skip

    @admin.action(description="Delete selected offline nodes")
    def delete_offline(self, request: HttpRequest, queryset: QuerySet) -> HttpResponse | None:
        if request.POST.get("confirm") != "yes":  # first ask, listing what would go
            return TemplateResponse(
                request,
                "admin/jobs/gpunode/delete_offline_confirmation.html",
                {**self.admin_site.each_context(request), "nodes": list(queryset),
                 "title": "Delete GPU nodes?"},
            )  # fmt: skip
        self._each(request, queryset, node_services.node_delete, "Deleted")
        return None

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False  # delete_offline goes through the service (offline nodes only)


@admin.register(TrainingFile)
class TrainingFileAdmin(admin.ModelAdmin):
    list_display = (
        "public_id",
        "filename",
        "status",
        "format",
        "example_count",
        "bytes",
        "project",
    )
    list_filter = ("status", "format")
    search_fields = ("public_id", "filename", "sha256")
    readonly_fields = [f.name for f in TrainingFile._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


@admin.register(Artifact)
class ArtifactAdmin(admin.ModelAdmin):
    list_display = ("public_id", "job", "kind", "size", "verified", "created_at")
    list_filter = ("kind", "verified")
    readonly_fields = [f.name for f in Artifact._meta.fields]

    # Verified bytes: created by ingest, removed with their job (jobs.services.jobs), never here.
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


@admin.register(StorageDeletion)
class StorageDeletionAdmin(admin.ModelAdmin):
    """Objects of deleted jobs and files, purged by the retention sweep until their URLs expire."""

    list_display = ("key", "reason", "created_at", "last_purged_at")
    search_fields = ("key",)
    readonly_fields = [f.name for f in StorageDeletion._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


class MembershipInline(admin.TabularInline):
    model = ProjectMembership
    extra = 0


@admin.register(Project)
class ProjectAdmin(admin.ModelAdmin):
    list_display = ("slug", "name", "max_concurrent_jobs", "max_spend_per_hour", "created_at")
    search_fields = ("slug", "name")
    inlines = [MembershipInline]


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    """Keys are created with `manage.py create_api_key`; only the prefix is ever shown.
    Revocation is one-way and goes through the service (the action): ``revoked_at`` is never
    editable, so no form can clear it (a leaked key stays dead) nor back-date it."""

    list_display = ("name", "prefix", "user", "project", "created_at", "last_used_at", "revoked_at")
    list_filter = ("project",)
    fields = ("name", "prefix", "user", "project", "created_at", "last_used_at", "revoked_at")
    readonly_fields = ("prefix", "user", "project", "created_at", "last_used_at", "revoked_at")
    actions = ["revoke"]

    @admin.action(description="Revoke selected keys")
    def revoke(self, request: HttpRequest, queryset: QuerySet) -> None:
        from jobs.services.projects import api_key_revoke

        for key in queryset:
            api_key_revoke(key=key)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


@admin.register(ProviderCredential)
class ProviderCredentialAdmin(admin.ModelAdmin):
    """Secrets are write-only: set through the API; the admin shows field names only."""

    list_display = ("provider", "name", "project", "secret_fields", "updated_at")
    list_filter = ("provider",)
    fields = ("project", "provider", "name", "secret_fields", "created_at", "updated_at")
    readonly_fields = ("project", "provider", "secret_fields", "created_at", "updated_at")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


# --- outbound webhooks ------------------------------------------------------------------------


class WebhookEndpointForm(forms.ModelForm):
    """URL, event types, description and enabled; the URL is checked as the API checks it.
    The signing secret is never a field: it is generated on save and shown once."""

    url = forms.URLField(max_length=2048, assume_scheme="https")
    event_types = forms.MultipleChoiceField(
        choices=[(t, t) for t in WEBHOOK_EVENT_TYPES], widget=forms.CheckboxSelectMultiple
    )

    class Meta:
        model = WebhookEndpoint
        fields = ("project", "url", "event_types", "description", "enabled")

    def clean_url(self) -> str:
        try:
            return webhook_endpoints.url_check(self.cleaned_data.get("url"))
        except ServiceError as exc:
            raise forms.ValidationError(exc.message) from None


@admin.register(WebhookEndpoint)
class WebhookEndpointAdmin(admin.ModelAdmin):
    """Created and changed through the same services as the API; the secret is shown once in
    a message after create and after rotate, never on a page or in a list."""

    form = WebhookEndpointForm
    list_display = ("public_id", "url", "project", "enabled", "disabled_reason", "failing_since",
                    "created_at")  # fmt: skip
    list_filter = ("enabled", "project")
    search_fields = ("public_id", "url", "project__slug")
    readonly_fields = ("public_id", "disabled_reason", "failing_since",
                       "previous_secret_expires_at", "created_at", "updated_at")  # fmt: skip
    actions = ["rotate_secret", "enable", "disable"]

    def get_readonly_fields(self, request: HttpRequest, obj: object = None) -> tuple[str, ...]:
        # The project of an existing endpoint never changes.
        return (*self.readonly_fields, "project") if obj is not None else self.readonly_fields

    def save_model(
        self, request: HttpRequest, obj: WebhookEndpoint, form: forms.ModelForm, change: bool
    ) -> None:
        data = {k: form.cleaned_data[k] for k in ("url", "event_types", "description", "enabled")}
        if change:
            webhook_endpoints.endpoint_update(endpoint=obj, data=data)
            return
        endpoint, secret = webhook_endpoints.endpoint_create(project=obj.project, data=data)
        obj.pk, obj.public_id, obj._state.adding = endpoint.pk, endpoint.public_id, False
        self.message_user(
            request,
            f"Signing secret of {endpoint.public_id}, shown this once: {secret}",
            messages.WARNING,
        )

    def delete_model(self, request: HttpRequest, obj: WebhookEndpoint) -> None:
        webhook_endpoints.endpoint_delete(endpoint=obj)

    @admin.action(description="Rotate the signing secret (the old one signs during the overlap)")
    def rotate_secret(self, request: HttpRequest, queryset: QuerySet) -> None:
        for endpoint in queryset:
            secret = webhook_endpoints.endpoint_rotate_secret(endpoint=endpoint)
            self.message_user(
                request,
                f"New signing secret of {endpoint.public_id}, shown this once: {secret}",
                messages.WARNING,
            )

    @admin.action(description="Enable selected endpoints")
    def enable(self, request: HttpRequest, queryset: QuerySet) -> None:
        for endpoint in queryset:
            webhook_endpoints.endpoint_update(endpoint=endpoint, data={"enabled": True})

    @admin.action(description="Disable selected endpoints")
    def disable(self, request: HttpRequest, queryset: QuerySet) -> None:
        for endpoint in queryset:
            webhook_endpoints.endpoint_update(endpoint=endpoint, data={"enabled": False})


class WebhookAttemptInline(ReadOnlyInline):
    model = WebhookAttempt
    fields = ("number", "started_at", "status_code", "latency_ms", "response_excerpt", "error")
    ordering = ("number",)


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(admin.ModelAdmin):
    """The delivery log: every try's status, latency, answer excerpt and error."""

    list_display = ("message_id", "event_type", "job_public_id", "endpoint", "status",
                    "attempts", "last_status_code", "last_error", "created_at")  # fmt: skip
    list_filter = ("status", "event_type")
    search_fields = ("message_id", "event_id", "job_public_id", "endpoint__public_id")
    list_select_related = ("endpoint",)
    readonly_fields = [f.name for f in WebhookDelivery._meta.fields]
    inlines = [WebhookAttemptInline]
    actions = ["redeliver"]

    @admin.action(description="Redeliver selected (same webhook-id)")
    def redeliver(self, request: HttpRequest, queryset: QuerySet) -> None:
        done = 0
        for delivery in queryset.select_related("endpoint"):
            try:
                webhook_delivery.delivery_redeliver(delivery=delivery)
                done += 1
            except ServiceError as exc:
                self.message_user(
                    request, f"Skipped {delivery.message_id}: {exc.message}", messages.WARNING
                )
        if done:
            self.message_user(request, f"Queued {done} delivery(ies) again.", messages.SUCCESS)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False
