"""Provider webhooks: a provider calls these when an attempt's job ends.

The URL carries a signed attempt id and its issue time (``services.webhooks.webhook_url``), so
no API key is needed, and the body is treated as a hint only: the attempt is polled at once
through the provider's API, so a forged or replayed body cannot move a job. An expired URL is
refused (403); calls for an attempt that has ended, or repeated within a few seconds, are
answered without a poll. The body's job ``id`` is read for one thing only: a provider job that
no attempt owns is noted for the reconciler to cancel (``services.webhooks``).
"""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework.exceptions import ParseError, UnsupportedMediaType
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from api.serializers import Error, WebhookReceived
from jobs.services.cloud import provider_webhooks as webhooks


class ProviderWebhookView(APIView):
    authentication_classes: list[type] = []
    permission_classes = [AllowAny]

    @extend_schema(
        operation_id="provider_webhook",
        tags=["provider webhooks"],
        request=None,
        responses={200: WebhookReceived, 404: Error},  # 404: a token the URL cannot carry
    )
    def post(self, request: Request, token: str) -> Response:
        try:
            body = request.data
        except (ParseError, UnsupportedMediaType):
            body = None  # only a hint: a signed URL still triggers the poll
        webhooks.webhook_received(token=token, body=body)
        return Response({"received": True})
