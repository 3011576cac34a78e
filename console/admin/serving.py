"""Inference servers and the adapters deployed on them (jobs.services.serving). Read-only:
servers are registered with ``manage.py register_server``; deploys go through the API. The API
key a server needs is never shown."""

from django.contrib import admin
from django.db.models import Count, Q, QuerySet
from django.http import HttpRequest

from console.admin.common import ViewOnlyAdmin
from jobs.models import Deployment, InferenceServer


@admin.register(InferenceServer)
class InferenceServerAdmin(ViewOnlyAdmin):
    list_display = ("name", "url", "base_model", "status", "adapters", "max_adapters", "checked_at")
    list_filter = ("status",)
    search_fields = ("name", "base_model", "url")
    exclude = ("api_key_ciphertext",)
    readonly_fields = [
        f.name for f in InferenceServer._meta.fields if f.name != "api_key_ciphertext"
    ]

    def get_queryset(self, request: HttpRequest) -> QuerySet[InferenceServer]:
        held = Count("loaded", filter=Q(loaded__state=Deployment.State.LOADED))
        return InferenceServer.objects.annotate(held=held)

    @admin.display(description="adapters loaded", ordering="held")
    def adapters(self, obj: InferenceServer) -> int:
        return int(getattr(obj, "held", 0))


@admin.register(Deployment)
class DeploymentAdmin(ViewOnlyAdmin):
    list_display = ("name", "job", "state", "server", "last_used_at", "created_at", "undeployed_at")
    list_filter = ("state", "server")
    search_fields = ("name", "job__public_id", "sha256")
    readonly_fields = [f.name for f in Deployment._meta.fields]
