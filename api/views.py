"""Thin views: parse the request, call one selector or service, present the result."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from django.conf import settings
from django.http import HttpResponseBase
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiExample,
    OpenApiParameter,
    extend_schema,
    extend_schema_view,
)
from rest_framework import status
from rest_framework.exceptions import ParseError
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.parsers import FormParser, JSONParser, MultiPartParser
from rest_framework.renderers import BaseRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from api import presenters as p
from api import serializers as sz
from api import uploads
from api.auth import request_actor, request_project, request_user
from api.schema import responses
from jobs import result_files, selectors, storage
from jobs.errors import Conflict, InvalidRequest, Unavailable
from jobs.services.accounts import projects as project_services
from jobs.services.core import files as file_services
from jobs.services.core import jobs as job_services
from jobs.states import JobStatus

log = logging.getLogger(__name__)

LIST_PARAMS = [
    OpenApiParameter(
        "limit", {"type": "integer", "minimum": 1, "maximum": 100}, description="default 20"
    ),
    OpenApiParameter("after", str, description="id of the last object of the previous page"),
]


JOB_CREATE_EXAMPLE = OpenApiExample(
    "LoRA on the own fleet",
    request_only=True,
    value={
        "model": "meta-llama/Llama-3.2-1B-Instruct",
        "training_file": "file-abc123",
        "method": {
            "type": "supervised",
            "supervised": {"hyperparameters": {"n_epochs": 3, "batch_size": "auto"}},
        },
        "suffix": "support-bot",
        "metadata": {"team": "search"},
        "adapter": {"type": "qlora", "r": 16, "alpha": 32},
        "target": "local",
        "gpu": {"count": 1, "min_vram_gb": 24},
    },
)


class JSONBodyParser(JSONParser):
    """JSONParser that answers a too deeply nested body with a 400, not a RecursionError (500)."""

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        try:
            return super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError("JSON parse error - the body is nested too deeply.") from None


def _nul_at(data: dict[str, Any]) -> str | None:
    """The path of the first key or string holding a NUL character, which PostgreSQL refuses
    in text and jsonb (a 500 otherwise). Iterative: a body may be nested hundreds deep."""
    stack: list[tuple[str, object]] = [("", data)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, str):
            if "\x00" in value:
                return path
            continue
        if isinstance(value, dict):
            pairs = list(value.items())
        elif isinstance(value, list):
            pairs = list(enumerate(value))
        else:
            continue
        for key, item in reversed(pairs):
            where = f"{path}.{key}" if path else str(key)
            if "\x00" in str(key):
                return where
            stack.append((where, item))
    return None


def _form_field(request: Request, name: str, default: str) -> object:
    data = request.data
    return data.get(name, default) if isinstance(data, Mapping) else default


def _body(request: Request, fields: tuple[str, ...] | None = None) -> dict[str, Any]:
    """The JSON object body; with ``fields``, any other key is refused (a typo is not ignored)."""
    if not isinstance(request.data, dict):
        raise InvalidRequest("The request body must be a JSON object.", code="invalid_type")
    unknown = sorted(set(request.data) - set(fields)) if fields is not None else []
    if unknown:
        raise InvalidRequest(
            f"Unknown field {unknown[0]!r}; accepted fields: {', '.join(fields or ())}.",
            code="invalid_value",
            param=unknown[0] if unknown[0].isprintable() else None,
        )
    bad = _nul_at(request.data)
    if bad:
        raise InvalidRequest(
            f"{bad} must not contain NUL (\\u0000) characters.", code="invalid_value", param=bad
        )
    return dict(request.data)


class FileListView(APIView):
    parser_classes = [MultiPartParser, FormParser]

    @extend_schema(
        operation_id="files_list",
        tags=["files"],
        parameters=[*LIST_PARAMS, OpenApiParameter("purpose", str)],
        responses=responses({200: sz.FileList}, 400),
    )
    def get(self, request: Request) -> Response:
        rows, more = selectors.file_list(
            project=request_project(request),
            purpose=request.query_params.get("purpose"),
            after=request.query_params.get("after"),
            limit=selectors.parse_limit(request.query_params.get("limit")),
        )
        return Response(p.page_json([p.file_json(f) for f in rows], more))

    @extend_schema(
        operation_id="files_create",
        tags=["files"],
        request={"multipart/form-data": sz.FileUpload},
        responses=responses({201: sz.File}, 400, 403, 411, 413),
    )
    def post(self, request: Request) -> Response:
        project = request_project(request)
        # Before the body is read: a full quota or an oversized body is refused unread.
        uploads.restrict(request, file_services.file_upload_allowance(project=project))
        upload = request.FILES.get("file")
        # A part without a filename (curl -F 'file=<data.jsonl') arrives as a form field.
        text = _form_field(request, "file", "") if upload is None else ""
        if upload is None and not (isinstance(text, str) and text):
            raise InvalidRequest(
                "Send the dataset as multipart field 'file'.", code="missing_file", param="file"
            )
        record = file_services.file_create(
            project=project,
            user=request_user(request),
            filename=(upload.name if upload else "") or "upload.jsonl",
            chunks=upload.chunks(storage.CHUNK_BYTES) if upload else [str(text).encode()],
            purpose=_form_field(request, "purpose", "fine-tune"),
        )
        return Response(p.file_json(record), status=status.HTTP_201_CREATED)


class FileDetailView(APIView):
    @extend_schema(
        operation_id="files_retrieve", tags=["files"], responses=responses({200: sz.File}, 404)
    )
    def get(self, request: Request, file_id: str) -> Response:
        project = request_project(request)
        if result_files.is_result_file_id(file_id):
            return Response(p.result_file_json(selectors.result_file_get(project, file_id)))
        return Response(p.file_json(selectors.file_get(project=project, file_id=file_id)))

    @extend_schema(
        operation_id="files_delete",
        tags=["files"],
        responses=responses({200: sz.Deleted}, 404, 409),
    )
    def delete(self, request: Request, file_id: str) -> Response:
        project = request_project(request)
        if result_files.is_result_file_id(file_id):
            selectors.result_file_get(project, file_id)  # 404 unless it is this project's
            raise Conflict(
                f"{file_id} is a result file of its job and lives as long as the job; delete "
                "the job to remove it.",
                code="result_file_not_deletable",
            )
        record = selectors.file_get(project=project, file_id=file_id)
        file_services.file_delete(record=record)
        return Response({"id": file_id, "object": "file", "deleted": True})


class JobListView(APIView):
    parser_classes = [JSONBodyParser]

    @extend_schema(
        operation_id="fine_tuning_jobs_list",
        tags=["fine_tuning"],
        parameters=[
            *LIST_PARAMS,
            OpenApiParameter("status", str, enum=[str(v) for v in JobStatus]),
            OpenApiParameter("target", {"type": "string", "pattern": "^[A-Za-z0-9_-]{0,64}$"}),
            OpenApiParameter(
                "metadata",
                {"type": "object", "additionalProperties": {"type": "string"}},
                style="deepObject",
                explode=True,
                description="metadata[key]=value: jobs whose metadata has that pair",
            ),
        ],
        responses=responses({200: sz.JobList}, 400),
    )
    def get(self, request: Request) -> Response:
        q = request.query_params
        rows, more = selectors.job_list(
            project=request_project(request),
            status=q.get("status"),
            target=q.get("target"),
            metadata=selectors.parse_metadata_filter(q),
            after=q.get("after"),
            limit=selectors.parse_limit(q.get("limit")),
        )
        return Response(p.page_json([p.job_json(j) for j in rows], more))

    @extend_schema(
        operation_id="fine_tuning_jobs_create",
        tags=["fine_tuning"],
        request=sz.JobCreate,
        responses=responses({201: sz.Job, 200: sz.Job}, 400, 409, 413),
        parameters=[
            OpenApiParameter(
                "Idempotency-Key",
                str,
                OpenApiParameter.HEADER,
                description="a repeat with the same key and body returns the first job (200)",
            )
        ],
        examples=[JOB_CREATE_EXAMPLE],
    )
    def post(self, request: Request) -> Response:
        job, created = job_services.job_create(
            project=request_project(request),
            user=request_user(request),
            data=_body(request),
            idempotency_key=request.headers.get("Idempotency-Key"),
            actor=request_actor(request),
        )
        job = selectors.job_get(project=job.project, job_id=job.public_id)
        return Response(
            p.job_json(job), status=status.HTTP_201_CREATED if created else status.HTTP_200_OK
        )


class JobDetailView(APIView):
    @extend_schema(
        operation_id="fine_tuning_jobs_retrieve",
        tags=["fine_tuning"],
        responses=responses({200: sz.Job}, 404),
    )
    def get(self, request: Request, job_id: str) -> Response:
        return Response(
            p.job_json(selectors.job_get(project=request_project(request), job_id=job_id))
        )

    @extend_schema(
        operation_id="fine_tuning_jobs_delete",
        tags=["fine_tuning"],
        responses=responses({200: sz.Deleted}, 404, 409),
    )
    def delete(self, request: Request, job_id: str) -> Response:
        job_services.job_delete(
            job=selectors.job_get(project=request_project(request), job_id=job_id),
            actor=request_actor(request),
        )
        return Response({"id": job_id, "object": "fine_tuning.job", "deleted": True})


def job_action_view(service: Callable[..., object], operation_id: str) -> type[APIView]:
    """``POST …/jobs/{id}/<action>``: one service call on the caller's job, the job back."""

    @extend_schema_view(
        post=extend_schema(
            operation_id=operation_id,
            tags=["fine_tuning"],
            request=None,
            responses=responses({200: sz.Job}, 404, 409),
        )
    )
    class JobActionView(APIView):
        def post(self, request: Request, job_id: str) -> Response:
            job = selectors.job_get(project=request_project(request), job_id=job_id)
            service(job=job, actor=request_actor(request))
            return Response(p.job_json(selectors.job_get(project=job.project, job_id=job_id)))

    return JobActionView


JobCancelView = job_action_view(job_services.job_cancel, "fine_tuning_jobs_cancel")
JobRetryView = job_action_view(job_services.job_retry, "fine_tuning_jobs_retry")
JobPauseView = job_action_view(job_services.job_pause, "fine_tuning_jobs_pause")
JobResumeView = job_action_view(job_services.job_resume, "fine_tuning_jobs_resume")


STREAM_PARAM = OpenApiParameter(
    "stream",
    {"type": "boolean"},
    description="true: the events as Server-Sent Events (`id:` = the event's seq; resume with "
    "Last-Event-ID or after=<seq>), stored ones then live ones. Served by the stream process "
    "(Procfile `stream`, TRAINHUB_STREAM_URL); this server answers it with a 400 naming it.",
)


class JobEventListView(APIView):
    # trainhub's event shape here; OpenAI's paths pass presenters.openai_event_json
    present = staticmethod(p.event_json)

    @extend_schema(
        operation_id="fine_tuning_jobs_list_events",
        tags=["fine_tuning"],
        parameters=[*LIST_PARAMS, STREAM_PARAM],
        responses=responses({200: sz.EventList}, 400, 404),
    )
    def get(self, request: Request, job_id: str) -> Response:
        project = request_project(request)
        job = selectors.job_get(project=project, job_id=job_id)
        if request.query_params.get("stream", "").lower() in ("true", "1"):
            raise InvalidRequest(
                "stream=true is served by the stream process, at "
                f"{settings.TRAINHUB_STREAM_URL or '(TRAINHUB_STREAM_URL is not set)'}: "
                "connect there with the same path and key.",
                code="stream_not_served_here",
                param="stream",
            )
        rows, more = selectors.event_list(
            job=job,
            after=request.query_params.get("after"),
            limit=selectors.parse_limit(request.query_params.get("limit")),
        )
        return Response(p.page_json([self.present(e, job.public_id) for e in rows], more))


class JobArtifactListView(APIView):
    @extend_schema(
        operation_id="fine_tuning_jobs_artifacts_list",
        tags=["fine_tuning"],
        responses=responses({200: sz.ArtifactList}, 404),
    )
    def get(self, request: Request, job_id: str) -> Response:
        job = selectors.job_get(project=request_project(request), job_id=job_id)
        return Response(
            p.page_json([p.artifact_json(a) for a in selectors.artifact_list(job=job)], False)
        )


class AnyAccept(DefaultContentNegotiation):
    """Bytes whatever the client accepts (OpenAI's SDK asks for ``application/binary``, curl
    for ``*/*``, others for ``application/octet-stream``); an error still comes back as JSON."""

    def select_renderer(
        self, request: Request, renderers: Iterable[BaseRenderer], format_suffix: str | None = None
    ) -> tuple[BaseRenderer, str]:
        first = next(iter(renderers))
        return first, first.media_type


DOWNLOAD_RESPONSES = responses(
    {
        (200, "application/octet-stream"): OpenApiTypes.BINARY,
        (206, "application/octet-stream"): OpenApiTypes.BINARY,
        302: None,
    },
    404,
    416,
    503,
)


def stored_download(
    request: Request, *, key: str, filename: str, sha256: str, what: str, code: str
) -> HttpResponseBase:
    """The stored object ``key`` for download (bytes with Range, or S3's redirect), with its
    digest; a 503 ``code`` naming ``what`` if storage has lost it."""
    try:
        response = storage.download_response(request, key, filename=filename)
    except storage.ObjectMissing:
        log.error("%s: %s is missing from storage", what, key)
        raise Unavailable(
            f"The bytes of {what} are missing from storage; the operator has been alerted in "
            "the server log.",
            code=code,
        ) from None
    # An ETag is not a SHA-256 (S3's is MD5 or composite), so the digest has its own header,
    # on the redirect too: the client checks what it downloads from wherever it is sent.
    response["X-Checksum-SHA256"] = sha256
    return response


class ArtifactDownloadView(APIView):
    content_negotiation_class = AnyAccept

    @extend_schema(
        operation_id="artifacts_download",
        tags=["fine_tuning"],
        responses=DOWNLOAD_RESPONSES,
        parameters=[OpenApiParameter("Range", str, OpenApiParameter.HEADER)],
    )
    def get(self, request: Request, artifact_id: str) -> HttpResponseBase:
        artifact = selectors.artifact_get(project=request_project(request), artifact_id=artifact_id)
        return stored_download(
            request,
            key=artifact.storage_key,
            filename=artifact.filename,
            sha256=artifact.sha256,
            what=f"artifact '{artifact_id}'",
            code="artifact_unavailable",
        )


class CredentialListView(APIView):
    parser_classes = [JSONBodyParser]

    @extend_schema(
        operation_id="credentials_list",
        tags=["credentials"],
        responses=responses({200: sz.CredentialList}),
    )
    def get(self, request: Request) -> Response:
        rows = selectors.credential_list(project=request_project(request))
        return Response(p.page_json([p.credential_json(c) for c in rows], False))

    @extend_schema(
        operation_id="credentials_create",
        tags=["credentials"],
        request=sz.CredentialCreate,
        responses=responses({201: sz.Credential}, 400, 409, 413),
    )
    def post(self, request: Request) -> Response:
        body = _body(request, ("provider", "name", "secrets"))
        name = body.get("name", "default")
        if not isinstance(name, str) or not 1 <= len(name) <= 100:
            raise InvalidRequest(
                "name must be a string of 1 to 100 characters.",
                code="invalid_value",
                param="name",
            )
        credential = project_services.credential_create(
            project=request_project(request),
            provider=str(body.get("provider", "")),
            name=name,
            secrets=body.get("secrets"),
            actor=request_actor(request),
        )
        return Response(p.credential_json(credential), status=status.HTTP_201_CREATED)


class CredentialDetailView(APIView):
    @extend_schema(
        operation_id="credentials_delete",
        tags=["credentials"],
        responses=responses({200: sz.Deleted}, 404),
    )
    def delete(self, request: Request, credential_id: str) -> Response:
        credential = selectors.credential_get(
            project=request_project(request), credential_id=credential_id
        )
        project_services.credential_delete(credential=credential, actor=request_actor(request))
        return Response({"id": credential_id, "object": "provider_credential", "deleted": True})
