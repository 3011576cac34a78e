"""Inference: deploy a succeeded job's adapter, and OpenAI's models routes (list, retrieve,
delete) over the project's deployed fine-tuned models and the base models servers serve."""

from __future__ import annotations

from django.conf import settings
from django.http import HttpResponse
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from api import presenters as p
from api import serializers as sz
from api.auth import request_actor, request_project
from api.inference_grant import grant_for
from api.schema import responses
from api.views import JSONBodyParser
from jobs import selectors
from jobs.errors import InvalidRequest, PermissionDenied, Unavailable
from jobs.models import ApiKey
from jobs.services.serving import deployments


class JobDeployView(APIView):
    @extend_schema(
        operation_id="fine_tuning_jobs_deploy",
        tags=["models"],
        request=None,
        responses=responses({201: sz.Model, 200: sz.Model}, 404, 409),
    )
    def post(self, request: Request, job_id: str) -> Response:
        job = selectors.job_get(project=request_project(request), job_id=job_id)
        deployment, made = deployments.deployment_create(job=job, actor=request_actor(request))
        code = status.HTTP_201_CREATED if made else status.HTTP_200_OK
        return Response(p.deployment_json(deployment), status=code)


class ModelListView(APIView):
    @extend_schema(
        operation_id="models_list", tags=["models"], responses=responses({200: sz.ModelList})
    )
    def get(self, request: Request) -> Response:
        deployed = [
            p.deployment_json(d)
            for d in selectors.deployment_list(project=request_project(request))
        ]
        bases = [p.base_model_json(name) for name in selectors.served_base_models()]
        return Response({"object": "list", "data": deployed + bases})


class ModelDetailView(APIView):
    @extend_schema(
        operation_id="models_retrieve", tags=["models"], responses=responses({200: sz.Model}, 404)
    )
    def get(self, request: Request, model: str) -> Response:
        project = request_project(request)
        if model in selectors.served_base_models():
            return Response(p.base_model_json(model))
        return Response(p.deployment_json(selectors.deployment_get(project=project, name=model)))

    @extend_schema(
        operation_id="models_delete",
        tags=["models"],
        responses=responses({200: sz.ModelDeleted}, 404),
    )
    def delete(self, request: Request, model: str) -> Response:
        deployment = selectors.deployment_get(project=request_project(request), name=model)
        deployments.deployment_delete(deployment=deployment, actor=request_actor(request))
        return Response({"id": model, "object": "model", "deleted": True})


def completions_view(operation_id: str) -> type[APIView]:
    """``POST /v1/chat/completions`` or ``/v1/completions``: answered by the stream process
    (api/live/inference.py), where a generation does not hold a web worker. Here: a 307 there,
    with a one-use grant for the caller's key (clients drop Authorization across origins); the
    client re-sends its body (OpenAI's SDK follows redirects). A proxy that routes these paths
    to the stream process never lets them reach this view."""

    class CompletionsView(APIView):
        parser_classes = [JSONBodyParser]  # the stream process reads JSON: nothing else goes on

        @extend_schema(
            operation_id=operation_id,
            tags=["inference"],
            request=sz.CompletionRequest,
            responses={
                307: OpenApiResponse(description="to the stream process, which answers"),
                **responses({}, 400, 403, 415, 503),
            },
        )
        def post(self, request: Request) -> HttpResponse:
            # Checked here too (the schema's fields; the rest passes through), so a client
            # learns of a bad body at once.
            check = sz.CompletionRequest(data=request.data)
            if not isinstance(request.data, dict) or not check.is_valid():
                field, problems = (
                    next(iter(check.errors.items())) if check.errors else ("body", [""])
                )
                raise InvalidRequest(
                    f"{field}: {problems[0] or 'the body must be a JSON object'}",
                    code="invalid_value",
                    param=str(field),
                )
            if not isinstance(request.auth, ApiKey):
                raise PermissionDenied(
                    "Inference takes a project API key (Authorization: Bearer).",
                    code="api_key_required",
                )
            stream = settings.TRAINHUB_STREAM_URL
            if not stream:
                raise Unavailable(
                    "Completions are served by the stream process; the operator has not set "
                    "TRAINHUB_STREAM_URL.",
                    code="stream_url_unset",
                )
            location = f"{stream.rstrip('/')}{request.path}?grant={grant_for(request.auth)}"
            return HttpResponse(status=307, headers={"Location": location})

    return CompletionsView


ChatCompletionsView = completions_view("chat_completions_create")
CompletionsView = completions_view("completions_create")
