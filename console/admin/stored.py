"""Stored data: training files, artifacts and pending storage deletions (all read-only)."""

from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest

from console.admin.common import ModelAdmin, ViewOnlyAdmin
from jobs.models import (
    Artifact,
    StorageDeletion,
    TrainingFile,
)


# Uploaded through the API, validated by a task, deleted through the API (which also purges the
# stored bytes): never added, changed or deleted here.
@admin.register(TrainingFile)
class TrainingFileAdmin(ViewOnlyAdmin):
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


# Verified bytes: created by ingest, removed with their job (jobs.services.core.jobs), never here.
@admin.register(Artifact)
class ArtifactAdmin(ViewOnlyAdmin):
    list_display = ("public_id", "job", "kind", "size", "verified", "created_at")
    list_filter = ("kind", "verified")
    readonly_fields = [f.name for f in Artifact._meta.fields]


@admin.register(StorageDeletion)
class StorageDeletionAdmin(ModelAdmin[StorageDeletion]):
    """Objects of deleted jobs and files, purged by the retention sweep until their URLs expire."""

    list_display = ("key", "reason", "created_at", "last_purged_at")
    search_fields = ("key",)
    readonly_fields = [f.name for f in StorageDeletion._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False
