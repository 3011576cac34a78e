"""Inference: deploy a succeeded job's adapter, and OpenAI's models routes (list, retrieve,
delete) over the project's deployed fine-tuned models and the base models servers serve."""

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
from jobs import selectors
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
