"""The operations OpenAI's fine-tuning API has and trainhub's first API lacked: file content,
pause, resume and checkpoints. Thin like the rest: parse, one selector or service, present."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from django.http import HttpResponse, HttpResponseBase
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.renderers import BaseRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from jobs import result_files, selectors, storage
from jobs.api import presenters as p
from jobs.api import serializers as sz
from jobs.api.auth import request_project
from jobs.api.schema import responses
from jobs.api.views import LIST_PARAMS
from jobs.errors import Unavailable
from jobs.services import jobs as job_services

log = logging.getLogger(__name__)


def _stored_object(request: Request, key: str, filename: str, what: str) -> HttpResponseBase:
    try:
        return storage.download_response(request, key, filename=filename)
    except storage.ObjectMissing:
        log.error("%s: %s is missing from storage", what, key)
        raise Unavailable(
            f"The bytes of {what} are missing from storage; the operator has been alerted "
            "in the server log.",
            code="file_unavailable",
        ) from None


class AnyAccept(DefaultContentNegotiation):
    """Bytes whatever the client accepts (OpenAI's SDK asks for ``application/binary``); an
    error still comes back as JSON."""

    def select_renderer(
        self, request: Request, renderers: Iterable[BaseRenderer], format_suffix: str | None = None
    ) -> tuple[BaseRenderer, str]:
        first = next(iter(renderers))
        return first, first.media_type


class FileContentView(APIView):
    """``GET /files/{id}/content``: an uploaded dataset, or a job's result file."""

    content_negotiation_class = AnyAccept

    @extend_schema(
        operation_id="files_content",
        tags=["files"],
        responses=responses(
            {
                (200, "application/octet-stream"): OpenApiTypes.BINARY,
                (206, "application/octet-stream"): OpenApiTypes.BINARY,
                302: None,
            },
            404,
            416,
            503,
        ),
    )
    def get(self, request: Request, file_id: str) -> HttpResponseBase:
        project = request_project(request)
        if not result_files.is_result_file_id(file_id):
            record = selectors.file_get(project=project, file_id=file_id)
            response = _stored_object(request, record.storage_key, record.filename, file_id)
            response["X-Checksum-SHA256"] = record.sha256
            return response
        found = selectors.result_file_get(project, file_id)
        if found.kind == result_files.METRICS:
            response = HttpResponse(result_files.metrics_csv(found.job), content_type="text/csv")
            response["Content-Disposition"] = f'attachment; filename="{found.filename}"'
            return response
        adapter = result_files.adapter_of(found.job)
        if adapter is None:
            raise Unavailable(f"{file_id} has no verified adapter.", code="file_unavailable")
        response = _stored_object(request, adapter.storage_key, found.filename, file_id)
        response["X-Checksum-SHA256"] = adapter.sha256
        return response


class JobPauseView(APIView):
    @extend_schema(
        operation_id="fine_tuning_jobs_pause",
        tags=["fine_tuning"],
        request=None,
        responses=responses({200: sz.Job}, 404, 409),
    )
    def post(self, request: Request, job_id: str) -> Response:
        job = selectors.job_get(project=request_project(request), job_id=job_id)
        job_services.job_pause(job=job)
        return Response(p.job_json(selectors.job_get(project=job.project, job_id=job_id)))


class JobResumeView(APIView):
    @extend_schema(
        operation_id="fine_tuning_jobs_resume",
        tags=["fine_tuning"],
        request=None,
        responses=responses({200: sz.Job}, 404, 409),
    )
    def post(self, request: Request, job_id: str) -> Response:
        job = selectors.job_get(project=request_project(request), job_id=job_id)
        job_services.job_resume(job=job)
        return Response(p.job_json(selectors.job_get(project=job.project, job_id=job_id)))


class JobCheckpointListView(APIView):
    @extend_schema(
        operation_id="fine_tuning_jobs_checkpoints_list",
        tags=["fine_tuning"],
        parameters=LIST_PARAMS,
        responses=responses({200: sz.CheckpointList}, 400, 404),
    )
    def get(self, request: Request, job_id: str) -> Response:
        job = selectors.job_get(project=request_project(request), job_id=job_id)
        rows, more = selectors.checkpoint_list(
            job=job,
            after=request.query_params.get("after"),
            limit=selectors.parse_limit(request.query_params.get("limit"), default=10),
        )
        return Response(p.page_json([p.checkpoint_json(e, job, m) for e, m in rows], more))
