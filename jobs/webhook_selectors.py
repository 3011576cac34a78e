"""Reads of a project's webhook endpoints and their deliveries (jobs.selectors' conventions:
scoped to the project, another project's object is a 404, keyset pagination on ``after``)."""

from __future__ import annotations

from django.db.models import Prefetch, QuerySet

from jobs.errors import InvalidRequest
from jobs.models import Project, WebhookAttempt, WebhookDelivery, WebhookEndpoint
from jobs.selectors import newest_first_page, one_by_id


def endpoint_get(*, project: Project, endpoint_id: str) -> WebhookEndpoint:
    return one_by_id(
        WebhookEndpoint.objects.filter(project=project),
        endpoint_id,
        missing=f"No webhook endpoint '{endpoint_id}'.",
        code="webhook_endpoint_not_found",
    )


def endpoint_list(
    *, project: Project, after: str | None, limit: int
) -> tuple[list[WebhookEndpoint], bool]:
    """Newest first; ``after``: the id of the last endpoint of the previous page."""
    qs = WebhookEndpoint.objects.filter(project=project)
    return newest_first_page(qs, among=qs, after=after, limit=limit, noun="webhook endpoint")


def _with_attempts(qs: QuerySet[WebhookDelivery]) -> QuerySet[WebhookDelivery]:
    return qs.select_related("endpoint").prefetch_related(
        Prefetch("attempt_log", queryset=WebhookAttempt.objects.order_by("number"))
    )


def delivery_get(*, endpoint: WebhookEndpoint, delivery_id: str) -> WebhookDelivery:
    return one_by_id(
        _with_attempts(WebhookDelivery.objects.filter(endpoint=endpoint)),
        delivery_id,
        key="message_id",
        missing=f"No webhook delivery '{delivery_id}'.",
        code="webhook_delivery_not_found",
    )


def delivery_list(
    *, endpoint: WebhookEndpoint, status: str | None, after: str | None, limit: int
) -> tuple[list[WebhookDelivery], bool]:
    """The endpoint's deliveries, newest first, each with its tries."""
    among = WebhookDelivery.objects.filter(endpoint=endpoint)
    qs = among
    if status:
        if status not in WebhookDelivery.Status.values:
            raise InvalidRequest(
                f"status must be one of: {', '.join(WebhookDelivery.Status.values)}.",
                code="invalid_value",
                param="status",
            )
        qs = qs.filter(status=status)
    return newest_first_page(
        _with_attempts(qs), among=among, after=after, limit=limit, noun="webhook delivery",
        key="message_id",
    )  # fmt: skip
