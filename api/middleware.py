"""API-wide request rules that no single view owns."""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse, JsonResponse

from jobs.errors import error_body

API_PREFIXES = ("/api/v1/", "/v1/")


def one_value_per_query_parameter(
    get_response: Callable[[HttpRequest], HttpResponse],
) -> Callable[[HttpRequest], HttpResponse]:
    """``?limit=5&limit=50`` is refused rather than silently read as one of them: a client
    that sent two values meant something the API cannot know."""

    def middleware(request: HttpRequest) -> HttpResponse:
        if request.path.startswith(API_PREFIXES):
            repeated = next((k for k, v in request.GET.lists() if len(v) > 1), None)
            if repeated is not None:
                return JsonResponse(
                    error_body(
                        f"Query parameter '{repeated}' is given more than once; give it once.",
                        type="invalid_request_error",
                        code="invalid_value",
                        param=repeated,
                    ),
                    status=400,
                )
        return get_response(request)

    return middleware
