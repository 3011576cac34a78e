"""Projects, members, API keys and provider credentials (secrets never shown).

Every change goes through jobs.services.accounts.projects with the signed-in staff user as the actor, so
the audit trail records it; a key's revocation asks first and is one-way."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from console.admin.common import (
    ModelAdmin,
    ModelForm,
    TabularInline,
    admin_actor,
    each_through_service,
)
from jobs.errors import Conflict
from jobs.models import (
    ApiKey,
    Project,
    ProjectMembership,
    ProviderCredential,
)
from jobs.services.accounts import projects as project_services
from jobs.services.accounts.audit import Actor
from providers.registry import CREDENTIAL_KINDS


class MembershipInline(TabularInline[ProjectMembership, Project]):
    model = ProjectMembership
    extra = 0


class ProjectForm(ModelForm[Project]):
    """The operator-credential providers as a choice among the known provider kinds (not a
    JSON text box): only those can be checked, and an empty choice is an empty list."""

    operator_credential_providers = forms.MultipleChoiceField(
        choices=[(kind, kind) for kind in sorted(CREDENTIAL_KINDS)],
        widget=forms.CheckboxSelectMultiple,
        required=False,
        help_text="Provider kinds this project may use with the operator's environment "
        "credentials (TRAINHUB_OPERATOR_API_KEYS).",
    )

    class Meta:
        model = Project
        fields = project_services.PROJECT_SETTINGS


@admin.register(Project)
class ProjectAdmin(ModelAdmin[Project]):
    form = ProjectForm
    list_display = ("slug", "name", "max_concurrent_jobs", "max_spend_per_hour",
                    "operator_credential_providers", "created_at")  # fmt: skip
    search_fields = ("slug", "name")
    inlines = [MembershipInline]

    def save_model(
        self, request: HttpRequest, obj: Project, form: forms.ModelForm[Project], change: bool
    ) -> None:
        # What the members were, for the entry save_related writes once the inline is saved.
        request._members_before = (  # type: ignore[attr-defined]
            project_services.project_members(project=obj) if change else {}
        )
        data = {f: form.cleaned_data[f] for f in project_services.PROJECT_SETTINGS}
        project_services.project_update(project=obj, data=data, actor=admin_actor(request))

    def save_related(
        self, request: HttpRequest, form: forms.ModelForm[Project], formsets: Any, change: bool
    ) -> None:
        super().save_related(request, form, formsets, change)
        project_services.project_members_record(
            project=form.instance,
            before=getattr(request, "_members_before", {}),
            actor=admin_actor(request),
        )

    def delete_model(self, request: HttpRequest, obj: Project) -> None:
        project_services.project_delete(project=obj, actor=admin_actor(request))

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Project]) -> None:
        for project in queryset:
            project_services.project_delete(project=project, actor=admin_actor(request))


@admin.register(ApiKey)
class ApiKeyAdmin(ModelAdmin[ApiKey]):
    """Keys are created with `manage.py create_api_key`; only the prefix is ever shown.
    Revocation is one-way and goes through the service (the action, which asks first):
    ``revoked_at`` is never editable, so no form can clear it (a leaked key stays dead) nor
    back-date it, and a key cannot be deleted (a revoked key's row is what keeps it dead)."""

    list_display = ("name", "prefix", "user", "project", "created_at", "last_used_at", "revoked_at")
    list_filter = ("project",)
    search_fields = ("name", "prefix", "user__username", "project__slug")
    fields = ("name", "prefix", "user", "project", "created_at", "last_used_at", "revoked_at")
    readonly_fields = ("prefix", "user", "project", "created_at", "last_used_at", "revoked_at")
    actions = ["revoke"]

    @admin.action(description="Revoke selected keys (asks first; cannot be undone)")
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> HttpResponse | None:
        if request.POST.get("confirm") != "yes":  # first ask, listing what would stop working
            return TemplateResponse(
                request,
                "admin/jobs/apikey/revoke_confirmation.html",
                {**self.admin_site.each_context(request),
                 "keys": list(queryset.select_related("user", "project")),
                 "title": "Revoke API keys?"},
            )  # fmt: skip

        def revoke_one(key: ApiKey, actor: Actor) -> None:
            if not project_services.api_key_revoke(key=key, actor=actor):
                raise Conflict(f"{key.prefix}… was already revoked.", code="already_revoked")

        done, refused = each_through_service(
            self, request, queryset, revoke_one, message="Revoked (admin action)."
        )
        if done:
            self.message_user(request, f"Revoked {done} key(s).", messages.SUCCESS)
        for _, exc in refused:
            self.message_user(request, f"Skipped: {exc.message}", messages.WARNING)
        return None

    def save_model(
        self, request: HttpRequest, obj: ApiKey, form: forms.ModelForm[ApiKey], change: bool
    ) -> None:
        project_services.api_key_rename(
            key=obj, name=form.cleaned_data["name"], actor=admin_actor(request)
        )

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False  # revoke instead: a deleted key leaves nothing saying it is dead


@admin.register(ProviderCredential)
class ProviderCredentialAdmin(ModelAdmin[ProviderCredential]):
    """Secrets are write-only: set through the API; the admin shows field names only. Renames
    and deletes go through the services (Django's own confirmation page asks before a delete)."""

    list_display = ("provider", "name", "project", "secret_fields", "updated_at")
    list_filter = ("provider",)
    fields = ("project", "provider", "name", "secret_fields", "created_at", "updated_at")
    readonly_fields = ("project", "provider", "secret_fields", "created_at", "updated_at")

    def save_model(
        self,
        request: HttpRequest,
        obj: ProviderCredential,
        form: forms.ModelForm[ProviderCredential],
        change: bool,
    ) -> None:
        project_services.credential_rename(
            credential=obj, name=form.cleaned_data["name"], actor=admin_actor(request)
        )

    def delete_model(self, request: HttpRequest, obj: ProviderCredential) -> None:
        project_services.credential_delete(credential=obj, actor=admin_actor(request))

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[ProviderCredential]) -> None:
        for credential in queryset:
            project_services.credential_delete(credential=credential, actor=admin_actor(request))

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False
