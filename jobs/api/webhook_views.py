"""Provider webhooks: a provider calls these when an attempt's job ends.

The URL carries a signed attempt id and its issue time (``services.webhooks.webhook_url``), so
no API key is needed, and the body is treated as a hint only: the attempt is polled at once
through the provider's API, so a forged or replayed body cannot move a job. An expired URL is
refused (403); calls for an attempt that has ended, or repeated within a few seconds, are
answered without a poll.
"""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from jobs.api.serializers import Error, WebhookReceived
from jobs.services import messages, webhooks


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
        attempt_pk = webhooks.webhook_attempt(token)
        if attempt_pk is not None and webhooks.webhook_poll_due(attempt_pk):
            messages.send_poll_attempt(attempt_pk)
        return Response({"received": True})
