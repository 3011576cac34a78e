"""A project's webhook endpoints: create, update, rotate the secret, delete.

The signing secret (Standard Webhooks ``whsec_…``) is generated here, returned once by create
and by rotate, and stored encrypted (jobs.crypto): it must be read back to sign, so it cannot
be hashed. A rotation keeps the previous secret signing beside the new one for
``TRAINHUB_WEBHOOK_SECRET_OVERLAP_SECONDS``, so a receiver can switch without missing a message.

URLs are checked here for syntax, scheme and, when the host resolves now, for the addresses it
resolves to (jobs.outbound_http); every delivery checks them again before it connects.

Create, update, rotate and delete are written to the audit trail (services.audit): the secret
only as "set"/"rotated", the URL only as its host and a fingerprint (paths often hold tokens).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from jobs import crypto, outbound_http, webhook_signing
from jobs.errors import Conflict, InvalidRequest
from jobs.models import Project, WebhookEndpoint
from jobs.models.webhooks import EVENT_TYPES
from jobs.services.accounts.audit import (
    SYSTEM,
    Actor,
    audit_record,
    created,
    deleted,
    diff,
    redacted_url,
)

MAX_ENDPOINTS_PER_PROJECT = 20
MAX_DESCRIPTION_CHARS = 200
FIELDS = ("url", "event_types", "description", "enabled")


def url_policy() -> tuple[bool, tuple[outbound_http.Network, ...]]:
    """Whether http is allowed, and the networks the operator allows beyond public ones."""
    return (
        bool(settings.TRAINHUB_WEBHOOK_ALLOW_HTTP),
        outbound_http.parse_networks(settings.TRAINHUB_WEBHOOK_ALLOWED_CIDRS),
    )


def url_check(url: object) -> str:
    """The URL if it may be used now: syntax, scheme, and the addresses its host resolves to
    (a host that does not resolve yet is accepted; its deliveries fail until it does)."""
    allow_http, allowed = url_policy()
    try:
        target = outbound_http.parse_url(url, allow_http=allow_http)
        outbound_http.checked_addresses(target, allowed)
    except outbound_http.Unresolvable:
        pass
    except outbound_http.UrlRefused as exc:
        raise InvalidRequest(str(exc), code="invalid_url", param="url") from None
    return str(url)  # parse_url refused anything but a string


def _event_types(value: object) -> list[str]:
    if not isinstance(value, list) or not value:
        raise InvalidRequest(
            f"event_types must be a non-empty list of: {', '.join(EVENT_TYPES)}.",
            code="invalid_value",
            param="event_types",
        )
    for i, item in enumerate(value):
        if item not in EVENT_TYPES:
            raise InvalidRequest(
                f"event_types[{i}]: {str(item)[:80]!r} is not an event type; use one of "
                f"{', '.join(EVENT_TYPES)}.",
                code="invalid_value",
                param=f"event_types.{i}",
            )
    return [t for t in EVENT_TYPES if t in value]  # deduplicated, in a stable order


def _description(value: object) -> str:
    if not isinstance(value, str) or len(value) > MAX_DESCRIPTION_CHARS:
        raise InvalidRequest(
            f"description must be a string of at most {MAX_DESCRIPTION_CHARS} characters.",
            code="invalid_value",
            param="description",
        )
    return value


def _enabled(value: object) -> bool:
    if not isinstance(value, bool):
        raise InvalidRequest(
            "enabled must be true or false.", code="invalid_value", param="enabled"
        )
    return value


def _fields(data: Mapping[str, Any], *, partial: bool) -> dict[str, Any]:
    unknown = sorted(set(data) - set(FIELDS))
    if unknown:
        raise InvalidRequest(
            f"Unknown field {unknown[0]!r}; accepted fields: {', '.join(FIELDS)}.",
            code="invalid_value",
            param=unknown[0] if unknown[0].isprintable() else None,
        )
    if not partial:
        for name in ("url", "event_types"):
            if name not in data:
                raise InvalidRequest(f"{name} is required.", code="missing_field", param=name)
    fields: dict[str, Any] = {}
    if "url" in data:
        fields["url"] = url_check(data["url"])
    if "event_types" in data:
        fields["event_types"] = _event_types(data["event_types"])
    if "description" in data:
        fields["description"] = _description(data["description"])
    if "enabled" in data:
        fields["enabled"] = _enabled(data["enabled"])
    return fields


def _seal(secret: str) -> str:
    return crypto.encrypt_json({"secret": secret})


def _audited(fields: Mapping[str, Any]) -> dict[str, Any]:
    """Fields as the audit trail keeps them (the URL redacted)."""
    return {k: redacted_url(v) if k == "url" else v for k, v in fields.items()}


def endpoint_create(
    *, project: Project, data: Mapping[str, Any], actor: Actor = SYSTEM
) -> tuple[WebhookEndpoint, str]:
    """A new endpoint and its signing secret (returned this once)."""
    fields = _fields(data, partial=False)
    if WebhookEndpoint.objects.filter(project=project).count() >= MAX_ENDPOINTS_PER_PROJECT:
        raise Conflict(
            f"This project already has {MAX_ENDPOINTS_PER_PROJECT} webhook endpoints; delete "
            "one first.",
            code="webhook_endpoint_limit",
        )
    secret = webhook_signing.secret_new()
    with transaction.atomic():
        endpoint = WebhookEndpoint.objects.create(
            project=project, secret_ciphertext=_seal(secret), **fields
        )
        audit_record(
            actor=actor,
            action="webhook_endpoint.create",
            obj=endpoint,
            changes=created({**_audited(fields), "secret": "set"}),
        )
    return endpoint, secret


def endpoint_update(
    *, endpoint: WebhookEndpoint, data: Mapping[str, Any], actor: Actor = SYSTEM
) -> WebhookEndpoint:
    """Change the URL, the event types, the description or whether it is enabled. Enabling
    a disabled endpoint clears why it was disabled and its failure streak."""
    fields = _fields(data, partial=True)
    if fields.get("enabled") is True and not endpoint.enabled:
        fields.update(disabled_reason="", failing_since=None)
    elif fields.get("enabled") is False and endpoint.enabled:
        fields["disabled_reason"] = "disabled by a user"
    before = _audited({name: getattr(endpoint, name) for name in fields})
    with transaction.atomic():
        for name, value in fields.items():
            setattr(endpoint, name, value)
        endpoint.save(update_fields=[*fields, "updated_at"])
        changes = diff(before, _audited(fields))
        if changes:
            audit_record(
                actor=actor, action="webhook_endpoint.update", obj=endpoint, changes=changes
            )
    return endpoint


def endpoint_rotate_secret(*, endpoint: WebhookEndpoint, actor: Actor = SYSTEM) -> str:
    """A new secret (returned this once). The current one keeps signing beside it for the
    overlap window; a rotation within an overlap ends the older secret at once."""
    secret = webhook_signing.secret_new()
    overlap = timedelta(seconds=settings.TRAINHUB_WEBHOOK_SECRET_OVERLAP_SECONDS)
    with transaction.atomic():
        row = WebhookEndpoint.objects.select_for_update().get(pk=endpoint.pk)
        row.previous_secret_ciphertext = row.secret_ciphertext
        row.previous_secret_expires_at = timezone.now() + overlap
        row.secret_ciphertext = _seal(secret)
        row.save(
            update_fields=[
                "previous_secret_ciphertext",
                "previous_secret_expires_at",
                "secret_ciphertext",
                "updated_at",
            ]
        )
        audit_record(
            actor=actor,
            action="webhook_endpoint.rotate_secret",
            obj=row,
            changes={"secret": {"from": "set", "to": "rotated"}},
        )
    for name in ("previous_secret_ciphertext", "previous_secret_expires_at", "secret_ciphertext"):
        setattr(endpoint, name, getattr(row, name))
    return secret


def endpoint_delete(*, endpoint: WebhookEndpoint, actor: Actor = SYSTEM) -> None:
    """Delete the endpoint and its delivery log (pending deliveries are never sent)."""
    with transaction.atomic():
        audit_record(
            actor=actor,
            action="webhook_endpoint.delete",
            obj=endpoint,
            changes=deleted({"url": redacted_url(endpoint.url), "secret": "set"}),
        )
        endpoint.delete()


def endpoint_signing_secrets(endpoint: WebhookEndpoint, now: datetime) -> list[str]:
    """The secrets a message to ``endpoint`` is signed with now: the current one, and the
    previous one while the rotation's overlap lasts."""
    out = [crypto.decrypt_json(endpoint.secret_ciphertext)["secret"]]
    expires = endpoint.previous_secret_expires_at
    if endpoint.previous_secret_ciphertext and expires is not None and now < expires:
        out.append(crypto.decrypt_json(endpoint.previous_secret_ciphertext)["secret"])
    return out
