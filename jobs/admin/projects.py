"""Projects, members, API keys and provider credentials (secrets never shown)."""

from __future__ import annotations

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from jobs.models import (
    ApiKey,
    Project,
    ProjectMembership,
    ProviderCredential,
)


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
