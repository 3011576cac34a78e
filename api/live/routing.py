"""The stream process's routes. It serves streams and long waits only (live events, and the
completions relayed to inference servers: api/live/inference.py): the API stays on the web
process (gunicorn, WSGI), whose large streamed transfers Django's ASGI handler would buffer."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from channels.routing import URLRouter
from django.urls import URLPattern

from api.live.consumers import JobEventsSocket, JobEventsSSE, NativeJobEventsSSE, ProjectJobsSocket
from api.live.inference import PATHS as INFERENCE_PATHS
from api.live.inference import InferenceRelay
from api.routes import route

_EVENTS = "fine_tuning/jobs/<str:job_id>/events"


def _sse_routes() -> list[URLPattern]:
    sse, native = JobEventsSSE(), NativeJobEventsSSE()
    return [
        *route(f"v1/{_EVENTS}", sse),
        *route(f"api/v1/{_EVENTS}", sse),
        *route("api/v1/jobs/<str:job_id>/events", native),
    ]


websocket_routes = URLRouter(
    [
        *route("ws/jobs/<str:job_id>", JobEventsSocket.as_asgi()),
        *route("ws/jobs", ProjectJobsSocket.as_asgi()),
    ]
)


class StreamHttp:
    """``?stream=true`` on an events route → SSE; ``/healthz``; anything else → a 404 saying
    where the API is."""

    def __init__(self) -> None:
        self._sse: Callable[[dict[str, Any], Any, Any], Awaitable[None]] = URLRouter(_sse_routes())
        self._inference = InferenceRelay()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["path"] == "/healthz":
            return await _respond(send, 200, {"status": "ok"})
        if scope["path"].rstrip("/") in INFERENCE_PATHS:  # OpenAI's completions (inference)
            return await self._inference(scope, receive, send)
        if b"stream=true" in scope.get("query_string", b"").split(b"&"):
            try:
                return await self._sse(scope, receive, send)
            except ValueError:  # URLRouter: no route matched
                pass
        message = "This is trainhub's stream server: it serves ?stream=true on a job's events "
        message += "route, /ws/jobs[/<id>] and /v1/chat/completions and /v1/completions. The "
        message += "API is on the web process."
        await _respond(
            send, 404, {"error": {"message": message, "type": "invalid_request_error",
                                  "param": None, "code": "not_a_stream"}},
        )  # fmt: skip


async def _respond(send: Any, status: int, body: dict[str, Any]) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json")],
        }
    )
    await send({"type": "http.response.body", "body": json.dumps(body).encode()})
