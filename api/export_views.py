"""Exports of a succeeded job's adapter (``merged_safetensors``: merged into its base model).
The result is one of the job's artifacts, downloaded like the others."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from api import presenters as p
from api import serializers as sz
from api.auth import request_actor, request_project
from api.schema import responses
from api.views import JSONBodyParser, _body
from jobs import selectors
from jobs.services.core import exports


class JobExportListView(APIView):
    parser_classes = [JSONBodyParser]

    @extend_schema(
        operation_id="fine_tuning_jobs_exports_list",
        tags=["fine_tuning"],
        responses=responses({200: sz.ExportList}, 404),
    )
    def get(self, request: Request, job_id: str) -> Response:
        job = selectors.job_get(project=request_project(request), job_id=job_id)
        rows = selectors.export_list(job=job)
        return Response(p.page_json([p.export_json(e) for e in rows], False))

    @extend_schema(
        operation_id="fine_tuning_jobs_exports_create",
        tags=["fine_tuning"],
        request=sz.ExportCreate,
        responses=responses({201: sz.Export, 200: sz.Export}, 400, 404, 409, 413),
    )
    def post(self, request: Request, job_id: str) -> Response:
        job = selectors.job_get(project=request_project(request), job_id=job_id)
        body = _body(request, ("format",))
        export, made = exports.export_create(
            job=job, format=body.get("format"), actor=request_actor(request)
        )
        code = status.HTTP_201_CREATED if made else status.HTTP_200_OK
        return Response(p.export_json(export), status=code)
