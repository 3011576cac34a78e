"""Inference servers and the adapters deployed on them (jobs.services.serving), with each
model's traffic over the last minutes above the servers. Read-only: servers are registered
with ``manage.py register_server`` or by serving nodes; deploys go through the API. The API
key a server needs is never shown."""

from django.contrib import admin
from django.db.models import Count, Q, QuerySet
from django.http import HttpRequest, HttpResponse

from console.admin.common import ViewOnlyAdmin
from jobs.models import Deployment, InferenceCall, InferenceServer
from jobs.services.serving import usage


@admin.register(InferenceServer)
class InferenceServerAdmin(ViewOnlyAdmin):
    list_display = ("name", "url", "base_model", "status", "node", "adapters", "max_adapters",
                    "checked_at")  # fmt: skip
    list_filter = ("status",)
    search_fields = ("name", "base_model", "url")
    exclude = ("api_key_ciphertext",)
    readonly_fields = [
        f.name for f in InferenceServer._meta.fields if f.name != "api_key_ciphertext"
    ]

    def get_queryset(self, request: HttpRequest) -> QuerySet[InferenceServer]:
        held = Count("loaded", filter=Q(loaded__state=Deployment.State.LOADED))
        return InferenceServer.objects.annotate(held=held)

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, object] | None = None
    ) -> HttpResponse:
        figures = {"traffic": usage.traffic(), "traffic_window_minutes": usage.WINDOW_SECONDS // 60}
        return super().changelist_view(request, {**(extra_context or {}), **figures})

    @admin.display(description="adapters loaded", ordering="held")
    def adapters(self, obj: InferenceServer) -> int:
        return int(getattr(obj, "held", 0))


@admin.register(Deployment)
class DeploymentAdmin(ViewOnlyAdmin):
    list_display = ("name", "job", "state", "server", "requests", "completion_tokens",
                    "last_used_at", "created_at", "undeployed_at")  # fmt: skip
    list_filter = ("state", "server")
    search_fields = ("name", "job__public_id", "sha256")
    readonly_fields = [f.name for f in Deployment._meta.fields]


@admin.register(InferenceCall)
class InferenceCallAdmin(ViewOnlyAdmin):
    """Each completion through the relay (api/live/inference.py): usage by project and model."""

    list_display = ("created_at", "project", "model", "status_code", "streamed", "prompt_tokens",
                    "completion_tokens", "first_token_ms", "duration_ms")  # fmt: skip
    list_filter = ("status_code", "streamed", "project")
    search_fields = ("model",)
    date_hierarchy = "created_at"
    list_select_related = ("project",)
    readonly_fields = [f.name for f in InferenceCall._meta.fields]
