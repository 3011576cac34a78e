"""Provider webhooks: a provider calls these when an attempt's job ends.

The URL carries a signed attempt id (``cloud.webhook_url``), so no API key is needed, and the
body is treated as a hint only: the attempt is polled at once through the provider's API, so a
forged or replayed body cannot move a job.
"""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from gpu_worker import celery_conf as cc
from jobs.errors import NotFound
from jobs.services import cloud


class ProviderWebhookView(APIView):
    authentication_classes: list[type] = []
    permission_classes = [AllowAny]

    @extend_schema(exclude=True)
    def post(self, request: Request, token: str) -> Response:
        from trainhub.celery import app

        attempt_pk = cloud.webhook_attempt(token)
        if attempt_pk is None:
            raise NotFound("No such webhook.", code="not_found")
        app.send_task(cc.POLL_ATTEMPT, args=[attempt_pk])
        return Response({"received": True})
