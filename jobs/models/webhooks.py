"""Outbound webhooks: a project's endpoints and every delivery made to them (with each try).

Rows only; what is sent, when and how lives in ``jobs.services.outbox.webhook_outbox`` (which events
make deliveries) and ``jobs.services.outbound.webhook_delivery`` (signing, the SSRF-checked POST,
retries, auto-disable).
"""

import secrets
import string

from django.db import models

from jobs.models.ids import public_id

# OpenAI's fine-tuning webhook event types, plus trainhub's running, checkpoint and paused.
EVENT_TYPES = (
    "fine_tuning.job.succeeded",
    "fine_tuning.job.failed",
    "fine_tuning.job.cancelled",
    "fine_tuning.job.running",
    "fine_tuning.job.checkpoint",
    "fine_tuning.job.paused",
)


def new_endpoint_id() -> str:
    return public_id("whep")


def underscore_id(prefix: str, length: int = 24) -> str:
    """``evt_…``/``msg_…``: the underscore ids of OpenAI's and Standard Webhooks' messages."""
    alphabet = string.ascii_letters + string.digits
    return f"{prefix}_" + "".join(secrets.choice(alphabet) for _ in range(length))


def new_message_id() -> str:
    """The ``webhook-id`` of a delivery: the same on every try, for the receiver's dedupe."""
    return underscore_id("msg")


class WebhookEndpoint(models.Model):
    """Where a project wants to hear of its jobs. The signing secret is encrypted (jobs.crypto)
    and shown once, at create and at rotate; after a rotation the previous secret keeps signing
    beside the new one until ``previous_secret_expires_at``."""

    public_id = models.CharField(
        max_length=40, unique=True, default=new_endpoint_id, editable=False
    )
    project = models.ForeignKey(
        "jobs.Project", on_delete=models.CASCADE, related_name="webhook_endpoints"
    )
    url = models.URLField(max_length=2048)
    description = models.CharField(max_length=200, blank=True)
    event_types = models.JSONField(default=list, help_text="Subscribed types (EVENT_TYPES).")
    enabled = models.BooleanField(default=True)
    disabled_reason = models.CharField(max_length=500, blank=True)
    # Encrypted {"secret": "whsec_…"}; never shown after the response that created it.
    secret_ciphertext = models.TextField(editable=False)
    previous_secret_ciphertext = models.TextField(blank=True, editable=False)
    previous_secret_expires_at = models.DateTimeField(null=True, blank=True, editable=False)
    # Start of the current run of failed tries (None after a success): auto-disable counts it.
    failing_since = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        indexes = [
            models.Index(
                fields=["project"], condition=models.Q(enabled=True), name="webhook_enabled"
            )
        ]

    def __str__(self) -> str:
        return f"{self.public_id} → {self.url}"


class WebhookDelivery(models.Model):
    """One event for one endpoint: its body is fixed when the event is stored, its
    ``message_id`` (the ``webhook-id`` header) is the same on every try."""

    class Status(models.TextChoices):
        PENDING = "pending"  # not delivered yet; tried again at next_attempt_at
        SUCCEEDED = "succeeded"  # a 2xx answer
        FAILED = "failed"  # gave up: the retry window passed, or the endpoint went away

    message_id = models.CharField(
        max_length=40, unique=True, default=new_message_id, editable=False
    )
    endpoint = models.ForeignKey(
        WebhookEndpoint, on_delete=models.CASCADE, related_name="deliveries"
    )
    event_id = models.CharField(max_length=40, help_text="The body's evt_… id.")
    event_type = models.CharField(max_length=40)
    job_public_id = models.CharField(max_length=40)
    body = models.TextField(help_text="The exact bytes signed and sent (UTF-8 JSON).")
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveSmallIntegerField(default=0)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    # A worker holds the delivery until then while it tries; a crashed worker's hold runs out.
    locked_until = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    last_status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    last_error = models.CharField(max_length=500, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["endpoint", "-id"], name="webhook_delivery_recent"),
            models.Index(
                fields=["next_attempt_at"],
                condition=models.Q(status="pending"),
                name="webhook_delivery_due",
            ),
        ]
        verbose_name_plural = "webhook deliveries"

    def __str__(self) -> str:
        return f"{self.message_id} {self.event_type} ({self.status})"


class WebhookAttempt(models.Model):
    """One try at a delivery: what the receiver answered, or why it could not be reached."""

    delivery = models.ForeignKey(
        WebhookDelivery, on_delete=models.CASCADE, related_name="attempt_log"
    )
    number = models.PositiveSmallIntegerField()
    started_at = models.DateTimeField()
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    latency_ms = models.PositiveIntegerField()
    response_excerpt = models.CharField(max_length=1024, blank=True)
    error = models.CharField(max_length=500, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["delivery", "number"], name="uniq_webhook_attempt")
        ]

    def __str__(self) -> str:
        return f"{self.delivery_id}#{self.number}"
