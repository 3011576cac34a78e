"""Reads of a project's webhook endpoints and their deliveries (jobs.selectors' conventions:
scoped to the project, another project's object is a 404, keyset pagination on ``after``)."""

from __future__ import annotations

from django.db.models import Prefetch

from jobs.errors import InvalidRequest, NotFound
from jobs.models import Project, WebhookAttempt, WebhookDelivery, WebhookEndpoint
from jobs.selectors import _is_token, _page


def endpoint_get(*, project: Project, endpoint_id: str) -> WebhookEndpoint:
    endpoint = (
        WebhookEndpoint.objects.filter(project=project, public_id=endpoint_id).first()
        if _is_token(endpoint_id)
        else None
    )
    if endpoint is None:
        raise NotFound(f"No webhook endpoint '{endpoint_id}'.", code="webhook_endpoint_not_found")
    return endpoint


def endpoint_list(
    *, project: Project, after: str | None, limit: int
) -> tuple[list[WebhookEndpoint], bool]:
    """Newest first; ``after``: the id of the last endpoint of the previous page."""
    qs = WebhookEndpoint.objects.filter(project=project)
    if after:
        pk = (
            qs.filter(public_id=after).values_list("pk", flat=True).first()
            if _is_token(after)
            else None
        )
        if pk is None:
            raise InvalidRequest(
                f"after: no webhook endpoint '{after}'.", code="invalid_value", param="after"
            )
        qs = qs.filter(pk__lt=pk)
    return _page(qs.order_by("-pk"), limit)


def _with_attempts(qs):  # type: ignore[no-untyped-def]
    return qs.select_related("endpoint").prefetch_related(
        Prefetch("attempt_log", queryset=WebhookAttempt.objects.order_by("number"))
    )


def delivery_get(*, endpoint: WebhookEndpoint, delivery_id: str) -> WebhookDelivery:
    delivery = (
        _with_attempts(
            WebhookDelivery.objects.filter(endpoint=endpoint, message_id=delivery_id)
        ).first()
        if _is_token(delivery_id)
        else None
    )
    if delivery is None:
        raise NotFound(f"No webhook delivery '{delivery_id}'.", code="webhook_delivery_not_found")
    return delivery


def delivery_list(
    *, endpoint: WebhookEndpoint, status: str | None, after: str | None, limit: int
) -> tuple[list[WebhookDelivery], bool]:
    """The endpoint's deliveries, newest first, each with its tries."""
    qs = WebhookDelivery.objects.filter(endpoint=endpoint)
    if status:
        if status not in WebhookDelivery.Status.values:
            raise InvalidRequest(
                f"status must be one of: {', '.join(WebhookDelivery.Status.values)}.",
                code="invalid_value",
                param="status",
            )
        qs = qs.filter(status=status)
    if after:
        pk = (
            WebhookDelivery.objects.filter(endpoint=endpoint, message_id=after)
            .values_list("pk", flat=True)
            .first()
            if _is_token(after)
            else None
        )
        if pk is None:
            raise InvalidRequest(
                f"after: no webhook delivery '{after}'.", code="invalid_value", param="after"
            )
        qs = qs.filter(pk__lt=pk)
    return _page(_with_attempts(qs).order_by("-pk"), limit)
