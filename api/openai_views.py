"""The reads OpenAI's fine-tuning API has and trainhub's first API lacked: file content and
checkpoints. Thin like the rest: parse, one selector, present."""

from __future__ import annotations

from django.http import HttpResponse, HttpResponseBase
from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from api import presenters as p
from api import serializers as sz
from api.auth import request_project
from api.schema import responses
from api.views import DOWNLOAD_RESPONSES, LIST_PARAMS, AnyAccept, stored_download
from jobs import result_files, selectors
from jobs.errors import Unavailable


class FileContentView(APIView):
    """``GET /files/{id}/content``: an uploaded dataset, or a job's result file."""

    content_negotiation_class = AnyAccept

    @extend_schema(operation_id="files_content", tags=["files"], responses=DOWNLOAD_RESPONSES)
    def get(self, request: Request, file_id: str) -> HttpResponseBase:
        project = request_project(request)
        if not result_files.is_result_file_id(file_id):
            record = selectors.file_get(project=project, file_id=file_id)
            stored = (record.storage_key, record.filename, record.sha256)
        else:
            found = selectors.result_file_get(project, file_id)
            if found.kind == result_files.METRICS:  # built from the events, never stored
                csv = HttpResponse(result_files.metrics_csv(found.job), content_type="text/csv")
                csv["Content-Disposition"] = f'attachment; filename="{found.filename}"'
                return csv
            adapter = result_files.adapter_of(found.job)
            if adapter is None:
                raise Unavailable(f"{file_id} has no verified adapter.", code="file_unavailable")
            stored = (adapter.storage_key, found.filename, adapter.sha256)
        key, filename, sha256 = stored
        return stored_download(
            request,
            key=key,
            filename=filename,
            sha256=sha256,
            what=file_id,
            code="file_unavailable",
        )


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
