"""Provider webhooks: a per-attempt URL carrying the attempt's signed id.

A call only triggers a poll of that attempt (api.webhook_views), so a forged body moves nothing.
"""

from __future__ import annotations

from django.conf import settings
from django.core import signing
from django.urls import reverse

from jobs.models import JobAttempt

WEBHOOK_SALT = "trainhub.provider-webhook"


def webhook_url(attempt: JobAttempt) -> str:
    """A per-attempt URL the provider may call on completion ('' without a public address)."""
    if not settings.TRAINHUB_PUBLIC_URL:
        return ""
    token = signing.Signer(salt=WEBHOOK_SALT).sign(str(attempt.pk))
    return settings.TRAINHUB_PUBLIC_URL.rstrip("/") + reverse("provider-webhook", args=[token])


def webhook_attempt(token: str) -> int | None:
    try:
        return int(signing.Signer(salt=WEBHOOK_SALT).unsign(token))
    except (signing.BadSignature, ValueError):
        return None
