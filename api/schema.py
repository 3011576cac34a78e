"""OpenAPI description of the bearer-key authentication."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension

from providers.registry import CREDENTIAL_KINDS

if TYPE_CHECKING:
    from drf_spectacular.openapi import AutoSchema

# (path, path regex, method, view callback): what drf-spectacular's preprocessing hooks take.
Endpoint = tuple[str, str, str, Callable[..., Any]]
# An operation's response key: a status code, or (status code, media type).
Status = int | tuple[int, str]


# drf-spectacular's extension base leaves __init_subclass__ unannotated.
class ApiKeyScheme(OpenApiAuthenticationExtension):  # type: ignore[no-untyped-call]
    target_class = "api.auth.ApiKeyAuthentication"
    name = "ApiKey"

    def get_security_definition(self, auto_schema: AutoSchema) -> dict[str, Any]:
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "Authorization: Bearer <api key>",
        }


def canonical_paths_only(endpoints: list[Endpoint], **kwargs: object) -> list[Endpoint]:
    """drf-spectacular preprocessing hook: each operation once, at /api/v1/…/. The same views
    also answer without the trailing slash, under /v1/ (OpenAI's base URL shape), and at the
    first API's /api/v1/jobs/ (kept for its clients, with trainhub's own event shape)."""
    return [
        e
        for e in endpoints
        if e[0].startswith("/api/v1/")
        and e[0].endswith("/")
        and not e[0].startswith("/api/v1/jobs/")
    ]


def responses(ok: Mapping[Status, object], *statuses: int) -> dict[Status, object]:
    """An operation's responses: ``ok`` plus the error body for each status it can return,
    and always 401 (no or a bad key) and 429 (rate limit)."""
    from drf_spectacular.utils import OpenApiResponse

    from api.serializers import Error

    too_long = OpenApiResponse(description="URI too long: refused by the HTTP server itself")
    return {**ok, **{code: Error for code in sorted({*statuses, 401, 429})}, 414: too_long}


# Request bodies whose unknown fields are refused (400), so the schema says none are allowed.
CLOSED_REQUESTS = (
    "JobCreate",
    "MethodIn",
    "SupervisedIn",
    *(f"{kind.title()}CredentialCreate" for kind in CREDENTIAL_KINDS),  # serializers.py
    "NodeCreate",
    "WebhookEndpointCreate",
    "PatchedWebhookEndpointUpdate",  # drf-spectacular's name for a PATCH body
)


# One of several bodies (serializers.CredentialCreate): drf-spectacular cannot tell that a body
# is required when it is a oneOf, and the view refuses an empty one.
REQUIRED_ONE_OF_BODIES = ("#/components/schemas/CredentialCreate",)


def closed_request_bodies(result: dict[str, Any], **kwargs: object) -> dict[str, Any]:
    """drf-spectacular postprocessing hook: ``additionalProperties: false`` on CLOSED_REQUESTS,
    and the one-of bodies required."""
    schemas = result.get("components", {}).get("schemas", {})
    for name in CLOSED_REQUESTS:
        if name in schemas:
            schemas[name]["additionalProperties"] = False
    for operations in result.get("paths", {}).values():
        for operation in operations.values():
            body = (operation.get("requestBody") if isinstance(operation, dict) else None) or {}
            refs = {m.get("schema", {}).get("$ref") for m in body.get("content", {}).values()}
            if refs & set(REQUIRED_ONE_OF_BODIES):
                body["required"] = True
    return result
