"""OpenAI's ``POST /v1/chat/completions`` and ``/v1/completions`` for trainhub's models, relayed
to the inference server that holds them (jobs.services.serving).

It lives in the stream process because a generation is a long wait on another server: here it
is an ``await`` on an async HTTP client, while on the web process (gunicorn, sync workers) it
would hold a whole worker for as long as the model writes, and a long one would meet the
worker timeout. The web process answers these routes with a 307 to here (api/inference_views),
carrying a grant in the query that names the caller's API key for 60 s: HTTP clients drop the
Authorization header on a redirect to another origin, and the grant is what authenticates the
redirected request. A client that reaches this process directly (or through a proxy that routes
these paths here) sends its key as a bearer token, as anywhere else.

``model`` is the caller's project's deployed ``ft:`` name or a base model an online server
serves. A deployed adapter that is not loaded now (it made room for another, or its server
went away) is loaded by a worker (jobs.services.serving.deployments) while the request waits
without holding a thread or a database connection; past ``LOAD_WAIT_SECONDS`` the answer is a
503 with Retry-After, which OpenAI's SDK retries. The body goes on unchanged but for the model's name at the server; the answer comes
back with the caller's name in it. Streams are relayed chunk by chunk as the server sends them;
usage is asked of the server and counted for the deployment, and the usage chunk is passed on
only when the client asked for it. A server that cannot be reached is taken offline, its
adapters are placed elsewhere, and the request is tried once more.

Where a project's model is served is remembered for ``ROUTE_SECONDS``, so that a burst of calls
asks the database once and a call's first token waits on no database at all. A remembered route
is only a guess that is checked by using it: a server that answers it with 401 or 404 (the
adapter was unloaded or undeployed, the server's key changed) or cannot be reached has it
forgotten, and the call is routed again from the database. A server that answers 404 for an
adapter the database says it holds has lost it (it restarted): the deployment is placed again
and the call waits for it, once.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

import aiohttp

from api.inference_grant import granted_key
from api.live.auth import authenticate
from api.live.ttl_cache import TtlCache
from jobs.crypto import decrypt_json
from jobs.models import ApiKey, Deployment, InferenceServer
from jobs.services.outbox import messages
from jobs.services.serving.deployments import server_lost
from jobs.services.serving.servers import server_error_message
from jobs.services.serving.usage import CallFacts, calls_record

if TYPE_CHECKING:
    from asgiref.sync import SyncToAsync as database_sync_to_async
else:
    from channels.db import database_sync_to_async

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 4 * 1024 * 1024
# A deployed adapter not loaded now is loaded by a worker; the request waits this long for it.
LOAD_WAIT_SECONDS = 20
LOAD_POLL_SECONDS = 0.25
# Connecting is quick or the server is down; a generation may take minutes between chunks.
TIMEOUT = aiohttp.ClientTimeout(total=None, sock_connect=5.0, sock_read=600.0)
# A stream holds its connection for the whole answer; past this many at once a call is refused
# (503, retried by OpenAI's SDK) rather than queued behind the others.
MAX_IN_FLIGHT = 1000
# Idle connections to servers are dropped before uvicorn's keep-alive (vLLM's server, 5 s)
# closes them: a request sent on a connection that the server is closing is lost.
KEEPALIVE_SECONDS = 4.0
ROUTE_SECONDS = 5.0
PATHS = {"/v1/chat/completions", "/v1/completions", "/api/v1/chat/completions",
         "/api/v1/completions"}  # fmt: skip
Send = Callable[[dict[str, Any]], Awaitable[None]]


class RelayError(Exception):
    """An answer in OpenAI's error shape, with the status (and Retry-After) it goes with."""

    def __init__(
        self,
        status: int,
        message: str,
        code: str | None = None,
        param: str | None = None,
        retry_after: int | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param
        self.retry_after = retry_after


@dataclass(frozen=True)
class Route:
    """Where a request goes: the server's URL, its key, the name it knows the model by, and
    the deployment to count usage for (None for a base model)."""

    url: str
    headers: dict[str, str]
    upstream_model: str
    deployment_pk: int | None
    server_pk: int

    def same_server(self, other: Route) -> bool:
        return other.server_pk == self.server_pk


_granted_key = database_sync_to_async(granted_key)
# (project, model as called) -> where it was served a moment ago; see the module's docstring.
routes: TtlCache[tuple[int, str], Route] = TtlCache(seconds=ROUTE_SECONDS, size=10_000)


class StaleRoute(Exception):
    """A route that its server no longer answers for (401, 404); nothing sent to the client."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


def _server_route(server: InferenceServer, model: str, deployment: Deployment | None) -> Route:
    headers = {}
    if server.api_key_ciphertext:
        headers["Authorization"] = f"Bearer {decrypt_json(server.api_key_ciphertext)['api_key']}"
    return Route(server.url, headers, model, deployment.pk if deployment else None, server.pk)


class NotLoaded(Exception):
    """The deployment is not loaded on an online server: ``pk`` is to be placed."""

    def __init__(self, pk: int) -> None:
        super().__init__(pk)
        self.pk = pk


@database_sync_to_async
def _lookup(key: ApiKey, model: str) -> Route:
    """The server for ``model`` in the key's project; NotLoaded for a deployed adapter that is
    not loaded on an online server now."""
    deployment = (
        Deployment.objects.select_related("server")  # not "job": ~70 columns nothing here reads
        .filter(job__project=key.project, undeployed_at__isnull=True, name=model)
        .first()
    )
    if deployment is None:
        server = (
            InferenceServer.objects.filter(status=InferenceServer.Status.ONLINE, base_model=model)
            .order_by("pk")
            .first()
        )
        if server is None:
            raise RelayError(404, f"The model '{model}' does not exist or you do not have "
                             "access to it.", "model_not_found", "model")  # fmt: skip
        return _server_route(server, server.served_name, None)
    server = deployment.server
    loaded = deployment.state == Deployment.State.LOADED
    if not loaded or server is None or server.status != InferenceServer.Status.ONLINE:
        if deployment.state == Deployment.State.FAILED:
            raise RelayError(503, f"The model '{model}' cannot be loaded: {deployment.detail}",
                             "model_not_loaded")  # fmt: skip
        raise NotLoaded(deployment.pk)
    return _server_route(server, deployment.name, deployment)


@database_sync_to_async
def _ask_placement(pk: int) -> None:
    Deployment.objects.filter(pk=pk, state=Deployment.State.LOADED).update(
        state=Deployment.State.PENDING, server=None
    )
    messages.send_place_deployment(pk)


async def _route(key: ApiKey, model: str) -> Route:
    """The server for ``model``, remembered for ``ROUTE_SECONDS``."""
    route = await routes.get_or_load((key.project_id, model), lambda: _looked_up(key, model))
    assert route is not None  # noqa: S101 - _looked_up returns a route or raises
    return route


async def _looked_up(key: ApiKey, model: str) -> Route:
    """The server for ``model`` from the database, waiting (without holding anything) while a
    worker loads a deployed adapter that is not loaded now; a 503 with Retry-After when it takes
    long."""
    try:
        return await _lookup(key, model)
    except NotLoaded as missing:
        await _ask_placement(missing.pk)
    deadline = time.monotonic() + LOAD_WAIT_SECONDS
    while time.monotonic() < deadline:
        await asyncio.sleep(LOAD_POLL_SECONDS)
        try:
            return await _lookup(key, model)
        except NotLoaded:
            continue
    raise RelayError(503, f"The model '{model}' is being loaded on a server; retry shortly.",
                     "model_loading", retry_after=LOAD_WAIT_SECONDS)  # fmt: skip


def _error_event(model: str) -> bytes:
    error = {"message": f"The server answering '{model}' stopped mid-answer; ask again.",
             "type": "server_error", "param": None, "code": "server_unavailable"}  # fmt: skip
    return f"data: {json.dumps({'error': error})}\n\n".encode()


@database_sync_to_async
def _server_lost(route: Route, reason: str) -> None:
    """The server did not answer: offline, and its adapters to be placed elsewhere."""
    server = InferenceServer.objects.filter(pk=route.server_pk).first()
    if server is not None:
        server_lost(server, reason)


@dataclass
class _Call:
    """One completion as it is relayed: who asked for which model, and its clock."""

    project_id: int
    model: str
    streamed: bool
    began: float = 0.0
    first_token_ms: int | None = None

    def elapsed_ms(self) -> int:
        return int((time.monotonic() - self.began) * 1000)


_calls_record = database_sync_to_async(calls_record)
Usage = dict[str, Any] | None


class Recorder:
    """Completions recorded together: those that end while a write is under way go in the next
    one (one thread hop, one INSERT; usage.calls_record), so a relay busy with many answers does
    not queue them one by one on the database thread. Each answer's end waits for its own record:
    a client may look at its usage next."""

    def __init__(self) -> None:
        self._waiting: list[tuple[CallFacts, Usage, asyncio.Future[None]]] = []
        self._writer: asyncio.Task[None] | None = None

    async def record(self, route: Route, call: _Call, status: int, usage: Usage) -> None:
        facts = CallFacts(
            project_id=call.project_id, model=call.model, deployment_pk=route.deployment_pk,
            server_pk=route.server_pk, streamed=call.streamed, status_code=status,
            first_token_ms=call.first_token_ms, duration_ms=call.elapsed_ms(),
        )  # fmt: skip
        written = asyncio.get_running_loop().create_future()
        self._waiting.append((facts, usage, written))
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write())
        await asyncio.shield(written)

    async def _write(self) -> None:
        while self._waiting:
            batch, self._waiting = self._waiting, []
            try:
                await _calls_record([(facts, usage) for facts, usage, _ in batch])
            except Exception:  # the answers were given; their usage is what is lost
                log.exception("inference: could not record %d completions", len(batch))
            for _, _, written in batch:
                if not written.done():
                    written.set_result(None)


async def _read_body(receive: Callable[[], Awaitable[dict[str, Any]]]) -> dict[str, Any]:
    chunks, size = [], 0
    while True:
        message = await receive()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise RelayError(413, f"The body is larger than {MAX_BODY_BYTES} bytes.")
        chunks.append(chunk)
        if not message.get("more_body"):
            break
    try:
        body = json.loads(b"".join(chunks) or b"null")
    except ValueError as exc:
        raise RelayError(400, f"The body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise RelayError(400, "The body must be a JSON object.")
    return body


async def _respond_error(send: Send, error: RelayError) -> None:
    kind = "invalid_request_error" if error.status < 500 else "server_error"
    body = {"error": {"message": error.message, "type": kind, "param": error.param,
                      "code": error.code}}  # fmt: skip
    headers = [(b"content-type", b"application/json")]
    if error.retry_after is not None:  # OpenAI's SDK waits this long before its retry
        headers.append((b"retry-after", str(error.retry_after).encode()))
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": json.dumps(body).encode()})


class InferenceRelay:
    """The ASGI app for the completions routes (api/live/routing.StreamHttp sends them here).

    Its HTTP client is aiohttp's: relaying 64 streams, httpx's pool and stream reader took about
    twice the CPU a request (bench/serve_proxy.py, docs/BENCHMARKS.md), and this process's CPU
    is every stream's latency."""

    def __init__(self) -> None:
        self.client: aiohttp.ClientSession | None = None
        self._recorder = Recorder()
        self._in_flight = 0

    def _http(self) -> aiohttp.ClientSession:
        if self.client is None:  # made lazily: inside the server's event loop
            connector = aiohttp.TCPConnector(
                limit=MAX_IN_FLIGHT, keepalive_timeout=KEEPALIVE_SECONDS
            )
            # A streamed line may be as long as a body (a chunk with logprobs): up to 2 MiB.
            self.client = aiohttp.ClientSession(
                connector=connector, timeout=TIMEOUT, read_bufsize=1024 * 1024
            )
        return self.client

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Send) -> None:
        try:
            if scope["method"] != "POST":
                raise RelayError(405, f"{scope['path']} takes POST.")
            key = await self._caller(scope)
            body = await _read_body(receive)
            model = body.get("model")
            if not isinstance(model, str) or not model:
                raise RelayError(400, "model must be a non-empty string.", param="model")
            if self._in_flight >= MAX_IN_FLIGHT:
                raise RelayError(503, "Too many completions in flight here; retry shortly.",
                                 "relay_busy", retry_after=1)  # fmt: skip
            self._in_flight += 1
            try:
                await self._relay(scope["path"].removeprefix("/api"), key, model, body, send)
            finally:
                self._in_flight -= 1
        except RelayError as exc:
            await _respond_error(send, exc)

    async def _caller(self, scope: dict[str, Any]) -> ApiKey:
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        if "grant" in query:
            key = await _granted_key(query["grant"][0])
        else:
            key = await authenticate(scope)
        if key is None:
            raise RelayError(401, "Invalid or missing API key (or an expired redirect grant).",
                             "invalid_api_key")  # fmt: skip
        return key

    async def _relay(
        self, path: str, key: ApiKey, model: str, body: dict[str, Any], send: Send
    ) -> None:
        streaming = bool(body.get("stream"))
        given = body.get("stream_options")
        options: dict[str, Any] = given if isinstance(given, dict) else {}
        client_wants_usage = bool(options.get("include_usage"))
        remembered = routes.get((key.project_id, model))
        lost = 0  # servers that did not answer: one more is tried
        replaced = False  # a deployment its server had lost, placed again: once
        while True:
            route = remembered or await _route(key, model)
            upstream = {**body, "model": route.upstream_model}
            if streaming:  # always counted; shown only when asked
                upstream["stream_options"] = {**options, "include_usage": True}
            call = _Call(key.project_id, model, streaming)
            # A 401/404 is worth one more look: at a remembered route, or, for a deployment the
            # database says the server holds, at the server having lost it.
            may_retry = remembered is not None or (route.deployment_pk is not None and not replaced)
            try:
                await self._forward(route, path, upstream, call, client_wants_usage, send,
                                    may_retry)  # fmt: skip
                return
            except StaleRoute as stale:
                routes.drop((key.project_id, model))
                if remembered is None and route.deployment_pk is not None:  # the database's route
                    if stale.status != 404:  # 401: the server refuses trainhub's key
                        raise RelayError(502, f"The inference server for '{model}' refused "
                                         f"trainhub's key: {stale.message}", "bad_gateway") from None  # fmt: skip
                    replaced = True  # it lost the adapter (it restarted): placed again, once
                    await _ask_placement(route.deployment_pk)
                remembered = None
            except aiohttp.ClientError as exc:  # not connected, or gone before its headers
                routes.drop_where(route.same_server)
                remembered = None
                await _server_lost(route, f"did not answer a completion: {exc}")
                lost += 1
                if lost == 2:
                    raise RelayError(503, f"No server could answer for '{model}'; try again.",
                                     "server_unavailable") from exc  # fmt: skip

    async def _forward(
        self, route: Route, path: str, upstream: dict[str, Any], call: _Call,
        client_wants_usage: bool, send: Send, may_retry: bool,
    ) -> None:  # fmt: skip
        """Relay one answer; StaleRoute (``may_retry``) when the server answers 401 or 404."""
        call.began = time.monotonic()
        model = call.model
        # Leaving the block returns a connection read to its end to the pool, and closes others.
        async with self._http().post(
            route.url + path, json=upstream, headers=route.headers
        ) as response:
            if may_retry and response.status in (401, 404):
                said = await response.read()
                raise StaleRoute(response.status, server_error_message(said))
            if not call.streamed or response.status != 200:
                raw = await response.read()
                await self._send_whole(response.status, raw, call, route, send)
                return
            await send({"type": "http.response.start", "status": 200, "headers": [
                (b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]})  # fmt: skip
            usage = None
            try:
                async for raw_line in response.content:  # one line at a time
                    line = raw_line.rstrip(b"\r\n")
                    if not line.startswith(b"data: "):
                        continue
                    if line == b"data: [DONE]":  # read on to the body's end: the connection
                        continue  # then goes back to the pool instead of being closed
                    chunk = json.loads(line.removeprefix(b"data: "))
                    chunk["model"] = model
                    if chunk.get("usage"):
                        usage = chunk["usage"]
                        if not chunk.get("choices") and not client_wants_usage:
                            continue
                    elif call.first_token_ms is None:
                        call.first_token_ms = call.elapsed_ms()
                    await send({"type": "http.response.body", "more_body": True,
                                "body": f"data: {json.dumps(chunk)}\n\n".encode()})  # fmt: skip
            except aiohttp.ClientError as exc:
                # The answer has begun: it cannot be asked again elsewhere on this response.
                # OpenAI's SDKs raise on an error event; the stream then ends without [DONE].
                await _server_lost(route, f"broke off a streamed completion: {exc}")
                await send({"type": "http.response.body", "body": _error_event(model)})
                await self._recorder.record(route, call, 0, usage)
                return
            # Recorded before the end: a client may look at its usage next.
            await self._recorder.record(route, call, 200, usage)
            await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})

    async def _send_whole(
        self, status: int, raw: bytes, call: _Call, route: Route, send: Send
    ) -> None:
        try:
            answer = json.loads(raw)
        except ValueError:
            raise RelayError(502, f"The inference server answered HTTP {status} without JSON.",
                             "bad_gateway") from None  # fmt: skip
        usage = None
        if status == 200 and isinstance(answer, dict):
            answer["model"] = call.model
            usage = answer.get("usage") if isinstance(answer.get("usage"), dict) else None
        await self._recorder.record(route, call, status, usage)
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json")]})  # fmt: skip
        await send({"type": "http.response.body", "body": json.dumps(answer).encode()})
