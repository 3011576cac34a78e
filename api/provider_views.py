"""Cloud targets and their priced offers, as the caller's project sees them."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from api import presenters as p
from api import serializers as sz
from api.auth import request_project
from api.schema import responses
from jobs.errors import InvalidRequest
from jobs.gpu_needs import parse_gpu
from jobs.services.cloud import offers


class ProviderListView(APIView):
    @extend_schema(
        operation_id="providers_list",
        tags=["providers"],
        responses=responses({200: sz.ProviderList}),
    )
    def get(self, request: Request) -> Response:
        statuses = offers.provider_statuses(project=request_project(request))
        return Response(p.page_json([p.provider_json(s) for s in statuses], False))


def _number(request: Request, name: str, kind: type) -> object:
    raw = request.query_params.get(name)
    if raw in (None, ""):
        return None
    try:
        return kind(raw)
    except ValueError:
        raise InvalidRequest(
            f"{name} must be {'an integer' if kind is int else 'a number'} (got {raw!r}).",
            code="invalid_value",
            param=name,
        ) from None


class OfferListView(APIView):
    @extend_schema(
        parameters=[
            OpenApiParameter("gpu", sz.GPU_NAME, description='GPU name or glob, e.g. "*H100*"'),
            OpenApiParameter(
                "count",
                {"type": "integer", "minimum": 0, "maximum": 64},
                description="GPUs per machine (default 1)",
            ),
            OpenApiParameter(
                "min_vram_gb",
                {"type": "number", "exclusiveMinimum": 0, "maximum": 4096},
                description="GB per GPU at least",
            ),
        ],
        operation_id="providers_offers_list",
        tags=["providers"],
        responses=responses({200: sz.OfferList}, 400, 404),
    )
    def get(self, request: Request, target: str) -> Response:
        needs = {
            "name": request.query_params.get("gpu") or None,
            "count": _number(request, "count", int),
            "min_vram_gb": _number(request, "min_vram_gb", float),
        }
        gpu = parse_gpu({k: v for k, v in needs.items() if v is not None})
        found = offers.offers_for(project=request_project(request), target_name=target, gpu=gpu)
        return Response(p.page_json([p.offer_json(o) for o in found], False))
