"""Outbound webhooks: endpoints (secret shown once) and the delivery log."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from console.admin.common import (
    ModelAdmin,
    ModelForm,
    ReadOnlyInline,
    admin_actor,
    each_through_service,
)
from jobs.errors import ServiceError
from jobs.models import (
    WebhookAttempt,
    WebhookDelivery,
    WebhookEndpoint,
)
from jobs.models.webhooks import EVENT_TYPES as WEBHOOK_EVENT_TYPES
from jobs.services.outbound import webhook_delivery, webhook_endpoints


class WebhookEndpointForm(ModelForm[WebhookEndpoint]):
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
class WebhookEndpointAdmin(ModelAdmin[WebhookEndpoint]):
    """Created, changed and deleted through the same services as the API, with the signed-in
    staff user as the audit trail's actor; the secret is shown once in a message after create
    and after rotate, never on a page or in a list. A delete asks first (Django's own page)."""

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
        self,
        request: HttpRequest,
        obj: WebhookEndpoint,
        form: forms.ModelForm[WebhookEndpoint],
        change: bool,
    ) -> None:
        data = {k: form.cleaned_data[k] for k in ("url", "event_types", "description", "enabled")}
        actor = admin_actor(request)
        if change:
            # The form has already set the new values on obj; the service compares with the row.
            current = WebhookEndpoint.objects.get(pk=obj.pk)
            webhook_endpoints.endpoint_update(endpoint=current, data=data, actor=actor)
            return
        endpoint, secret = webhook_endpoints.endpoint_create(
            project=obj.project, data=data, actor=actor
        )
        obj.pk, obj.public_id, obj._state.adding = endpoint.pk, endpoint.public_id, False
        self.message_user(
            request,
            f"Signing secret of {endpoint.public_id}, shown this once: {secret}",
            messages.WARNING,
        )

    def delete_model(self, request: HttpRequest, obj: WebhookEndpoint) -> None:
        webhook_endpoints.endpoint_delete(endpoint=obj, actor=admin_actor(request))

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[WebhookEndpoint]) -> None:
        # Django's "delete selected" (after its confirmation page): each through the service.
        for endpoint in queryset:
            webhook_endpoints.endpoint_delete(endpoint=endpoint, actor=admin_actor(request))

    @admin.action(description="Rotate the signing secret (the old one signs during the overlap)")
    def rotate_secret(self, request: HttpRequest, queryset: QuerySet[WebhookEndpoint]) -> None:
        def rotate(endpoint: Any, actor: Any) -> None:
            secret = webhook_endpoints.endpoint_rotate_secret(endpoint=endpoint, actor=actor)
            self.message_user(
                request,
                f"New signing secret of {endpoint.public_id}, shown this once: {secret}",
                messages.WARNING,
            )

        each_through_service(self, request, queryset, rotate, message="Signing secret rotated.")

    def _set_enabled(
        self, request: HttpRequest, queryset: QuerySet[WebhookEndpoint], enabled: bool
    ) -> None:
        each_through_service(
            self,
            request,
            queryset,
            lambda endpoint, actor: webhook_endpoints.endpoint_update(
                endpoint=endpoint, data={"enabled": enabled}, actor=actor
            ),
            message="Enabled." if enabled else "Disabled.",
        )

    @admin.action(description="Enable selected endpoints")
    def enable(self, request: HttpRequest, queryset: QuerySet[WebhookEndpoint]) -> None:
        self._set_enabled(request, queryset, True)

    @admin.action(description="Disable selected endpoints")
    def disable(self, request: HttpRequest, queryset: QuerySet[WebhookEndpoint]) -> None:
        self._set_enabled(request, queryset, False)


class WebhookAttemptInline(ReadOnlyInline):
    model = WebhookAttempt
    fields = ("number", "started_at", "status_code", "latency_ms", "response_excerpt", "error")
    ordering = ("number",)


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(ModelAdmin[WebhookDelivery]):
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
    def redeliver(self, request: HttpRequest, queryset: QuerySet[WebhookDelivery]) -> None:
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
