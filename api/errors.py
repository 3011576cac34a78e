"""Every API error as ``{"error": {"message", "type", "param", "code"}}`` (OpenAI's shape)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import Http404, JsonResponse
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from jobs.errors import ServiceError, error_body


def _first_validation_error(detail: Any, path: str = "") -> tuple[str | None, str]:
    if isinstance(detail, dict):
        for key, value in detail.items():
            sub = key if key != "non_field_errors" else ""
            return _first_validation_error(value, f"{path}.{sub}" if path and sub else path or sub)
    if isinstance(detail, list) and detail:
        return _first_validation_error(detail[0], path)
    return (path or None), str(detail)


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    carried = getattr(exc, "error", None)
    if isinstance(exc, RequestDataTooBig) and isinstance(carried, ServiceError):
        exc = carried  # an upload refused while it streamed (api.uploads.UploadRefused)
    if isinstance(exc, ServiceError):
        return Response(
            error_body(exc.message, type=exc.error_type, code=exc.code, param=exc.param),
            status=exc.http_status,
        )
    if isinstance(exc, RequestDataTooBig):
        # Django refused a body (JSON, form fields) over DATA_UPLOAD_MAX_MEMORY_SIZE from its
        # Content-Length, before reading it; as a JSON error rather than its plain 400 page.
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        return Response(
            error_body(
                f"The request body is larger than the {limit} byte limit for a JSON or form "
                "body (upload datasets as multipart files).",
                type="invalid_request_error",
                code="body_too_large",
            ),
            status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE,
        )
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    if isinstance(exc, exceptions.ValidationError):
        param, message = _first_validation_error(exc.detail)
        text = f"{param}: {message}" if param else message
        return Response(
            error_body(text, type="invalid_request_error", code="invalid_value", param=param),
            status=status.HTTP_400_BAD_REQUEST,
        )
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, exceptions.Throttled):  # DRF has set Retry-After (whole seconds)
        wait = getattr(exc, "wait", None) or 1
        response.data = error_body(
            f"Too many requests: at most {settings.TRAINHUB_API_RATE_LIMIT} per API key (per "
            f"user for a browser session). Retry after {wait} s.",
            type="rate_limit_error",
            code="rate_limited",
        )
        return response
    detail = response.data.get("detail", "") if isinstance(response.data, dict) else response.data
    kind = {
        401: "authentication_error",
        403: "permission_error",
        404: "not_found_error",
        429: "rate_limit_error",
    }.get(response.status_code, "invalid_request_error")
    code = getattr(detail, "code", None)
    response.data = error_body(str(detail), type=kind, code=code)
    return response


def json_404(request: Any, exception: Exception | None = None) -> JsonResponse:
    return JsonResponse(
        error_body("Not found.", type="not_found_error", code="not_found"), status=404
    )


def json_500(request: Any) -> JsonResponse:
    return JsonResponse(
        error_body("Internal server error.", type="server_error", code="internal_error"), status=500
    )
