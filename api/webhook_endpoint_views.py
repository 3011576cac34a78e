"""A project's outbound webhook endpoints and their delivery log (thin views; the rules are in
jobs.services.outbound.webhook_endpoints and webhook_delivery). The signing secret appears in the
answers to create and rotate only."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from drf_spectacular.utils import OpenApiExample, OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from api import serializers as sz
from api.auth import request_actor, request_project
from api.presenters import page_json
from api.schema import responses
from api.views import LIST_PARAMS, JSONBodyParser, _body
from jobs import selectors, webhook_selectors
from jobs.models import WebhookDelivery, WebhookEndpoint
from jobs.services.outbound import webhook_delivery, webhook_endpoints

TAGS = ["webhooks"]
CREATE_EXAMPLE = OpenApiExample(
    "Tell a receiver when jobs end",
    request_only=True,
    value={
        "url": "https://hooks.example.com/trainhub",
        "event_types": ["fine_tuning.job.succeeded", "fine_tuning.job.failed"],
        "description": "CI pipeline",
    },
)


def _ts(value: datetime | None) -> int | None:
    return int(value.timestamp()) if value else None


def endpoint_json(e: WebhookEndpoint, secret: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": e.public_id,
        "object": "webhook_endpoint",
        "url": e.url,
        "description": e.description,
        "event_types": list(e.event_types),
        "enabled": e.enabled,
        "disabled_reason": (e.disabled_reason or None) if not e.enabled else None,
        "failing_since": _ts(e.failing_since),
        "previous_secret_expires_at": _ts(e.previous_secret_expires_at)
        if e.previous_secret_ciphertext
        else None,
        "created_at": _ts(e.created_at),
        "updated_at": _ts(e.updated_at),
    }
    if secret is not None:
        out["secret"] = secret
    return out


def delivery_json(d: WebhookDelivery) -> dict[str, Any]:
    return {
        "id": d.message_id,
        "object": "webhook_endpoint.delivery",
        "endpoint_id": d.endpoint.public_id,
        "event_id": d.event_id,
        "event_type": d.event_type,
        "job_id": d.job_public_id,
        "status": d.status,
        "created_at": _ts(d.created_at),
        "delivered_at": _ts(d.delivered_at),
        "next_attempt_at": _ts(d.next_attempt_at) if d.status == d.Status.PENDING else None,
        "last_status_code": d.last_status_code,
        "last_error": d.last_error or None,
        "payload": json.loads(d.body),
        "attempts": [
            {
                "number": a.number,
                "started_at": _ts(a.started_at),
                "status_code": a.status_code,
                "latency_ms": a.latency_ms,
                "response_excerpt": a.response_excerpt,
                "error": a.error or None,
            }
            for a in d.attempt_log.all()
        ],
    }


class WebhookEndpointListView(APIView):
    parser_classes = [JSONBodyParser]

    @extend_schema(
        operation_id="webhook_endpoints_list",
        tags=TAGS,
        parameters=LIST_PARAMS,
        responses=responses({200: sz.WebhookEndpointList}, 400),
    )
    def get(self, request: Request) -> Response:
        rows, more = webhook_selectors.endpoint_list(
            project=request_project(request),
            after=request.query_params.get("after"),
            limit=selectors.parse_limit(request.query_params.get("limit")),
        )
        return Response(page_json([endpoint_json(e) for e in rows], more))

    @extend_schema(
        operation_id="webhook_endpoints_create",
        tags=TAGS,
        request=sz.WebhookEndpointCreate,
        responses=responses({201: sz.WebhookEndpointWithSecret}, 400, 409, 413),
        examples=[CREATE_EXAMPLE],
    )
    def post(self, request: Request) -> Response:
        """Create an endpoint; the answer carries its signing secret, shown this once."""
        endpoint, secret = webhook_endpoints.endpoint_create(
            project=request_project(request),
            data=_body(request, webhook_endpoints.FIELDS),
            actor=request_actor(request),
        )
        return Response(endpoint_json(endpoint, secret), status=status.HTTP_201_CREATED)


class WebhookEndpointDetailView(APIView):
    parser_classes = [JSONBodyParser]

    @extend_schema(
        operation_id="webhook_endpoints_retrieve",
        tags=TAGS,
        responses=responses({200: sz.WebhookEndpoint}, 404),
    )
    def get(self, request: Request, endpoint_id: str) -> Response:
        endpoint = webhook_selectors.endpoint_get(
            project=request_project(request), endpoint_id=endpoint_id
        )
        return Response(endpoint_json(endpoint))

    @extend_schema(
        operation_id="webhook_endpoints_update",
        tags=TAGS,
        request=sz.WebhookEndpointUpdate,
        responses=responses({200: sz.WebhookEndpoint}, 400, 404, 413),
    )
    def patch(self, request: Request, endpoint_id: str) -> Response:
        endpoint = webhook_selectors.endpoint_get(
            project=request_project(request), endpoint_id=endpoint_id
        )
        endpoint = webhook_endpoints.endpoint_update(
            endpoint=endpoint,
            data=_body(request, webhook_endpoints.FIELDS),
            actor=request_actor(request),
        )
        return Response(endpoint_json(endpoint))

    @extend_schema(
        operation_id="webhook_endpoints_delete",
        tags=TAGS,
        responses=responses({200: sz.Deleted}, 404),
    )
    def delete(self, request: Request, endpoint_id: str) -> Response:
        endpoint = webhook_selectors.endpoint_get(
            project=request_project(request), endpoint_id=endpoint_id
        )
        webhook_endpoints.endpoint_delete(endpoint=endpoint, actor=request_actor(request))
        return Response({"id": endpoint_id, "object": "webhook_endpoint", "deleted": True})


class WebhookEndpointRotateView(APIView):
    @extend_schema(
        operation_id="webhook_endpoints_rotate_secret",
        tags=TAGS,
        request=None,
        responses=responses({200: sz.WebhookEndpointWithSecret}, 404),
    )
    def post(self, request: Request, endpoint_id: str) -> Response:
        """A new signing secret, shown this once; the old one keeps signing beside it for the
        overlap window (``previous_secret_expires_at``)."""
        endpoint = webhook_selectors.endpoint_get(
            project=request_project(request), endpoint_id=endpoint_id
        )
        secret = webhook_endpoints.endpoint_rotate_secret(
            endpoint=endpoint, actor=request_actor(request)
        )
        return Response(endpoint_json(endpoint, secret))


class WebhookDeliveryListView(APIView):
    @extend_schema(
        operation_id="webhook_endpoints_deliveries_list",
        tags=TAGS,
        parameters=[
            *LIST_PARAMS,
            OpenApiParameter("status", str, enum=list(WebhookDelivery.Status.values)),
        ],
        responses=responses({200: sz.WebhookDeliveryList}, 400, 404),
    )
    def get(self, request: Request, endpoint_id: str) -> Response:
        endpoint = webhook_selectors.endpoint_get(
            project=request_project(request), endpoint_id=endpoint_id
        )
        q = request.query_params
        rows, more = webhook_selectors.delivery_list(
            endpoint=endpoint,
            status=q.get("status"),
            after=q.get("after"),
            limit=selectors.parse_limit(q.get("limit")),
        )
        return Response(page_json([delivery_json(d) for d in rows], more))


class WebhookRedeliverView(APIView):
    @extend_schema(
        operation_id="webhook_endpoints_deliveries_redeliver",
        tags=TAGS,
        request=None,
        responses=responses({202: sz.WebhookDeliveryOut}, 404, 409),
    )
    def post(self, request: Request, endpoint_id: str, delivery_id: str) -> Response:
        """Send a delivery again now, with the same webhook-id (the try runs in a worker)."""
        endpoint = webhook_selectors.endpoint_get(
            project=request_project(request), endpoint_id=endpoint_id
        )
        delivery = webhook_selectors.delivery_get(endpoint=endpoint, delivery_id=delivery_id)
        webhook_delivery.delivery_redeliver(delivery=delivery)
        delivery = webhook_selectors.delivery_get(endpoint=endpoint, delivery_id=delivery_id)
        return Response(delivery_json(delivery), status=status.HTTP_202_ACCEPTED)
