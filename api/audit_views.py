"""``GET /api/v1/audit``: the audit trail, for operators only (staff holding
``jobs.view_auditentry``; a superuser holds every permission). Newest first, keyset pages."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.permissions import BasePermission
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from api import serializers as sz
from api.presenters import page_json, ts
from api.schema import responses
from api.views import LIST_PARAMS
from jobs import audit_selectors, selectors
from jobs.models import AuditEntry

_FILTER = {"type": "string", "maxLength": audit_selectors.MAX_FILTER_CHARS}


class AuditPermission(BasePermission):
    """Staff with the model's view permission: the trail names every project's objects."""

    def has_permission(self, request: Request, view: APIView) -> bool:
        user = request.user
        return bool(user and user.is_staff and user.has_perm("jobs.view_auditentry"))


def audit_json(e: AuditEntry) -> dict[str, Any]:
    return {
        "id": e.public_id,
        "object": "audit_entry",
        "created_at": ts(e.created_at),
        "actor": e.actor,
        "source": e.source,
        "api_key_prefix": e.api_key_prefix or None,
        "action": e.action,
        "object_type": e.object_type,
        "object_id": e.object_id,
        "object_repr": e.object_repr,
        "project": e.project_slug or None,
        "changes": e.changes,
    }


class AuditListView(APIView):
    permission_classes = [AuditPermission]

    @extend_schema(
        operation_id="audit_list",
        tags=["audit (operators)"],
        parameters=[
            *LIST_PARAMS,
            OpenApiParameter("action", _FILTER, description="e.g. job.cancel"),
            OpenApiParameter("object_id", _FILTER, description="public id, name or key prefix"),
            OpenApiParameter("actor", _FILTER, description="username, command or API key prefix"),
            OpenApiParameter("project", _FILTER, description="project slug"),
            OpenApiParameter("source", str, enum=list(AuditEntry.Source.values)),
        ],
        responses=responses({200: sz.AuditEntryList}, 400, 403),
    )
    def get(self, request: Request) -> Response:
        q = request.query_params
        rows, more = audit_selectors.audit_list(
            after=q.get("after"),
            limit=selectors.parse_limit(q.get("limit")),
            action=q.get("action"),
            object_id=q.get("object_id"),
            actor=q.get("actor"),
            project=q.get("project"),
            source=q.get("source"),
        )
        return Response(page_json([audit_json(e) for e in rows], more))
