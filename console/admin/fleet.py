"""The own GPU fleet: nodes, their history, drain / undrain / delete."""

from __future__ import annotations

from collections.abc import Callable

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils.html import format_html, format_html_join

from console.admin.common import ModelAdmin, ReadOnlyInline, colored, each_through_service
from jobs.models import (
    GpuNode,
    NodeEvent,
)
from jobs.services.fleet import nodes as node_services


class NodeEventInline(ReadOnlyInline):
    model = NodeEvent
    fields = ("created_at", "kind", "message", "actor")
    ordering = ("-id",)


@admin.register(GpuNode)
class GpuNodeAdmin(ModelAdmin[GpuNode]):
    """Nodes are created (and tokens rotated) with the API or `manage.py create_node`, which
    show the token once; the admin never shows it."""

    list_display = ("name", "node_status", "draining", "gpus", "models", "labels",
                    "current_attempt", "last_heartbeat_at")  # fmt: skip
    list_filter = ("status", "draining", "ephemeral")
    search_fields = ("name",)
    change_list_template = "admin/jobs/wide_change_list.html"
    exclude = ("token_sha256", "cached_models")  # the list is shown by cached_model_list
    readonly_fields = [
        *(f.name for f in GpuNode._meta.fields if f.name not in ("token_sha256", "cached_models")),
        "cached_model_list",
    ]
    inlines = [NodeEventInline]
    actions = ["drain", "undrain", "delete_offline"]

    @admin.display(description="status", ordering="status")
    def node_status(self, obj: GpuNode) -> str:
        return colored(obj.status)

    @admin.display(description="GPUs")
    def gpus(self, obj: GpuNode) -> str:
        gpus = (obj.capabilities or {}).get("gpus") or []
        return ", ".join(f"{g.get('name')} ({g.get('vram_mb')} MiB)" for g in gpus) or "none"

    @admin.display(description="cached models")
    def models(self, obj: GpuNode) -> str:
        """How many, every name on hover (the change page lists them all)."""
        names = obj.cached_models if isinstance(obj.cached_models, list) else []
        if obj.models_reported_at is None:
            return "not reported"
        if not names:
            return "none"
        return format_html(
            '<span title="{}">{} model{}</span>',
            "\n".join(str(n) for n in names),
            len(names),
            "" if len(names) == 1 else "s",
        )

    @admin.display(description="cached models")
    def cached_model_list(self, obj: GpuNode) -> str:
        names = obj.cached_models if isinstance(obj.cached_models, list) else []
        if obj.models_reported_at is None:
            return "Not reported (the node predates model cache reports, or never registered)."
        return format_html_join("\n", "<div>{}</div>", ((str(n),) for n in names)) or "none"

    def _each(
        self,
        request: HttpRequest,
        queryset: QuerySet[GpuNode],
        action: Callable[..., object],
        verb: str,
        deletion: bool = False,
    ) -> None:
        done, refused = each_through_service(
            self,
            request,
            queryset,
            lambda node, actor: action(node=node, actor=actor),
            message=f"{verb} (admin action).",
            deletion=deletion,
        )
        for node, exc in refused:
            self.message_user(request, f"Skipped {node.name}: {exc.message}", messages.WARNING)
        if done:
            self.message_user(request, f"{verb} {done} node(s).", messages.SUCCESS)

    @admin.action(description="Drain selected nodes (finish the current job, take no new one)")
    def drain(self, request: HttpRequest, queryset: QuerySet[GpuNode]) -> None:
        self._each(
            request, queryset,
            lambda **kw: node_services.node_set_draining(draining=True, **kw), "Draining",
        )  # fmt: skip

    @admin.action(description="Undrain selected nodes")
    def undrain(self, request: HttpRequest, queryset: QuerySet[GpuNode]) -> None:
        self._each(
            request, queryset,
            lambda **kw: node_services.node_set_draining(draining=False, **kw), "Undrained",
        )  # fmt: skip

    @admin.action(description="Delete selected offline nodes")
    def delete_offline(
        self, request: HttpRequest, queryset: QuerySet[GpuNode]
    ) -> HttpResponse | None:
        if request.POST.get("confirm") != "yes":  # first ask, listing what would go
            return TemplateResponse(
                request,
                "admin/jobs/gpunode/delete_offline_confirmation.html",
                {**self.admin_site.each_context(request), "nodes": list(queryset),
                 "title": "Delete GPU nodes?"},
            )  # fmt: skip
        self._each(request, queryset, node_services.node_delete, "Deleted", deletion=True)
        return None

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False  # delete_offline goes through the service (offline nodes only)
