"""The HTTP client: one ``httpx.Client`` with the key, a timeout on every call, and every
failure mapped to a ``CliError`` with its exit code (API, auth, network).

Paths are trainhub's ``/api/v1/...``; the base URL is the server's root. The key travels only
in the ``Authorization`` header of requests to that server (and to the stream server it names),
never to a redirect's other host (S3 downloads are fetched without it; a completion's 307 to the
stream process carries a grant instead).
"""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from trainhub_cli import __version__
from trainhub_cli.errors import CliError, ExitCode

API = "/api/v1"
TIMEOUT = httpx.Timeout(30.0, connect=10.0)
# A big upload is read by the server as it arrives; give the answer time once it is sent.
UPLOAD_TIMEOUT = httpx.Timeout(300.0, connect=10.0)
# A completion may wait on a model being loaded, then on a whole answer (not streamed): as long
# as the stream process waits on the inference server (api/live/inference.py's read timeout).
COMPLETION_TIMEOUT = httpx.Timeout(600.0, connect=10.0)
CHUNK = 1 << 20
MAX_RATE_LIMIT_WAIT = 10.0


def _network_error(exc: httpx.HTTPError, url: str) -> CliError:
    if isinstance(exc, httpx.TimeoutException):
        why = "timed out"
    elif isinstance(exc, httpx.ConnectError):
        why = "could not connect"
    else:
        why = "the connection failed"
    return CliError(
        f"{url}: {why} ({exc.__class__.__name__}: {exc or 'no detail'}). Is the server up and "
        "the URL right? (`trainhub login --url`, or TRAINHUB_URL)",
        ExitCode.NETWORK,
    )


def api_error(resp: httpx.Response) -> CliError:
    """The API's ``{"error": {message, type, param, code}}`` as a CliError (401/403: auth)."""
    exit_code = ExitCode.AUTH if resp.status_code in (401, 403) else ExitCode.API
    try:
        body = resp.json()
    except ValueError:
        body = None
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict) or not isinstance(error.get("message"), str):
        text = resp.text.strip().replace("\n", " ")[:200]
        return CliError(
            f"HTTP {resp.status_code} from {resp.request.url.copy_with(query=None)}: "
            f"{text or resp.reason_phrase}",
            exit_code,
            status=resp.status_code,
        )
    message = error["message"]
    if resp.status_code == 401:
        message += " Check the key (`trainhub login`, or TRAINHUB_API_KEY)."
    return CliError(
        message,
        exit_code,
        param=error.get("param") if isinstance(error.get("param"), str) else None,
        code=error.get("code") if isinstance(error.get("code"), str) else None,
        status=resp.status_code,
        body={"error": error},
    )


def _json(resp: httpx.Response) -> Any:
    try:
        return resp.json()
    except ValueError:
        raise CliError(
            f"HTTP {resp.status_code} from {resp.request.url.copy_with(query=None)} is not JSON; "
            "is the URL trainhub's web server?",
            ExitCode.API,
        ) from None


def _multipart(path: Path, purpose: str, progress: Callable[[int], None]) -> tuple[Any, str, int]:
    """A multipart body streamed from the file, with its Content-Length known up front (the
    server refuses chunked uploads: 411)."""
    boundary = secrets.token_hex(16)
    filename = path.name.replace('"', "_").replace("\r", "_").replace("\n", "_")
    head = (
        f"--{boundary}\r\n"
        'Content-Disposition: form-data; name="purpose"\r\n\r\n'
        f"{purpose}\r\n"
        f"--{boundary}\r\n"
        f'Content-Disposition: form-data; name="file"; filename="{filename}"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n"
    ).encode()
    tail = f"\r\n--{boundary}--\r\n".encode()
    size = path.stat().st_size

    def body() -> Iterator[bytes]:
        yield head
        with path.open("rb") as fh:
            while chunk := fh.read(CHUNK):
                yield chunk
                progress(len(chunk))
        yield tail

    return body(), f"multipart/form-data; boundary={boundary}", len(head) + size + len(tail)


class Api:
    def __init__(self, base_url: str, api_key: str | None) -> None:
        if not api_key:
            raise CliError(
                "No API key: run `trainhub login` or set TRAINHUB_API_KEY.", ExitCode.AUTH
            )
        self.base_url = base_url
        self._headers = {
            "Authorization": f"Bearer {api_key}",
            "User-Agent": f"trainhub-cli/{__version__}",
        }
        self.http = httpx.Client(
            base_url=base_url, headers=self._headers, timeout=TIMEOUT, follow_redirects=False
        )

    def close(self) -> None:
        self.http.close()

    def request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, Any] | list[tuple[str, Any]] | None = None,
        json: Any = None,
        headers: dict[str, str] | None = None,
        content: Any = None,
        timeout: httpx.Timeout | None = None,
    ) -> Any:
        url = f"{API}{path}"
        for attempt in range(2):
            try:
                resp = self.http.request(
                    method,
                    url,
                    params=params,
                    json=json,
                    headers=headers,
                    content=content,
                    timeout=timeout or TIMEOUT,
                )
            except httpx.HTTPError as exc:
                raise _network_error(exc, f"{self.base_url}{url}") from None
            wait = _retry_after(resp)
            if resp.status_code == 429 and method == "GET" and attempt == 0 and wait is not None:
                time.sleep(wait)  # a read is safe to repeat once the limiter allows it
                continue
            break
        if not resp.is_success:
            raise api_error(resp)
        return _json(resp)

    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params={k: v for k, v in params.items() if v is not None})

    def post(self, path: str, body: Any = None, headers: dict[str, str] | None = None) -> Any:
        return self.request("POST", path, json=body, headers=headers)

    def upload(self, path: Path, purpose: str, progress: Callable[[int], None]) -> Any:
        content, content_type, length = _multipart(path, purpose, progress)
        headers = {"Content-Type": content_type, "Content-Length": str(length)}
        return self.request(
            "POST", "/files", content=content, headers=headers, timeout=UPLOAD_TIMEOUT
        )

    @contextmanager
    def download(self, path: str) -> Iterator[tuple[httpx.Response, str | None]]:
        """A streamed GET of an API download and the X-Checksum-SHA256 the API sent with it; a
        redirect (S3's presigned URL) is followed without the Authorization header."""
        url = f"{self.base_url}{API}{path}"
        try:
            with self.http.stream("GET", f"{API}{path}") as resp:
                checksum = resp.headers.get("x-checksum-sha256")
                if not (resp.is_redirect and resp.headers.get("location")):
                    if not resp.is_success:
                        resp.read()
                        raise api_error(resp)
                    yield resp, checksum
                    return
                target = str(resp.url.join(resp.headers["location"]))
                url = target.split("?", 1)[0]  # a presigned query is a credential: not shown
                with httpx.Client(timeout=TIMEOUT) as bare, bare.stream("GET", target) as moved:
                    if not moved.is_success:
                        raise CliError(
                            f"HTTP {moved.status_code} from the storage URL {url}",
                            ExitCode.API,
                            status=moved.status_code,
                        )
                    yield moved, checksum
        except httpx.HTTPError as exc:
            raise _network_error(exc, url) from None

    @contextmanager
    def completion(self, path: str, body: dict[str, Any]) -> Iterator[httpx.Response]:
        """An OpenAI completion ``POST`` (``/chat/completions``) and its open 200 answer: SSE
        when ``body`` asks to stream, else JSON; a refusal is a CliError.

        The web server answers with a 307 to the stream process, whose one-use grant in the
        query authenticates the request there (api/inference_views.py): the same body is posted
        to it, with the key only when it is the same origin (as a browser would; the grant
        suffices elsewhere, and a proxy that serves these paths itself answers at once)."""
        url = f"{self.base_url}{API}{path}"
        try:
            with self.http.stream(
                "POST", f"{API}{path}", json=body, timeout=COMPLETION_TIMEOUT
            ) as resp:
                location = resp.headers.get("location")
                if resp.status_code not in (307, 308) or not location:
                    _raise_unless_ok(resp)
                    yield resp
                    return
            target = resp.url.join(location)
            url = str(target.copy_with(query=None))  # the grant is not shown
            same = _origin(target) == _origin(resp.url)
            headers = self._headers if same else {"User-Agent": self._headers["User-Agent"]}
            with (
                httpx.Client(headers=headers, timeout=COMPLETION_TIMEOUT) as hop,
                hop.stream("POST", target, json=body) as moved,
            ):
                _raise_unless_ok(moved)
                yield moved
        except httpx.HTTPError as exc:
            raise _network_error(exc, url) from None

    @contextmanager
    def stream_events(self, stream_base: str, path: str) -> Iterator[httpx.Response]:
        """An SSE response from the stream server (``stream_base`` + /api/v1 + ``path``)."""
        url = f"{stream_base}{API}{path}"
        with (
            httpx.Client(
                headers={**self._headers, "Accept": "text/event-stream"},
                timeout=httpx.Timeout(10.0, read=60.0),  # keep-alives come every 15 s
            ) as client,
            client.stream("GET", url) as resp,
        ):
            if not resp.is_success:
                resp.read()
                raise api_error(resp)
            yield resp

    def discover_stream(self, path: str) -> str | None:
        """Where ``?stream=true`` is served, asked of the web server itself: behind a proxy
        that routes streams, there; otherwise its 400 names TRAINHUB_STREAM_URL (None: not set,
        or no answer)."""
        try:
            with self.http.stream(
                "GET",
                f"{API}{path}",
                params={"stream": "true"},
                # JSON too: the web server (DRF) answers its 400 in JSON, else 406.
                headers={"Accept": "text/event-stream, application/json"},
                timeout=httpx.Timeout(10.0),
            ) as resp:
                kind = resp.headers.get("content-type", "")
                if resp.is_success and kind.startswith("text/event-stream"):
                    return self.base_url
                resp.read()
        except httpx.HTTPError:
            return None
        if resp.status_code != 400:
            return None
        try:
            error = resp.json().get("error") or {}
        except (ValueError, AttributeError):
            return None
        if error.get("code") != "stream_not_served_here":
            return None
        found = _STREAM_AT.search(str(error.get("message", "")))
        return found.group(1).rstrip("/") if found else None


# api.views.JobEventListView's message: "…served by the stream process, at <URL>: connect…"
_STREAM_AT = re.compile(r"\bat (https?://\S+?):(?:\s|$)")


def _raise_unless_ok(resp: httpx.Response) -> None:
    if not resp.is_success:
        resp.read()
        raise api_error(resp)


def _origin(url: httpx.URL) -> tuple[str, str, int | None]:
    default = {"http": 80, "https": 443}.get(url.scheme)
    return url.scheme, url.host, url.port or default


def _retry_after(resp: httpx.Response) -> float | None:
    raw = resp.headers.get("retry-after")
    if raw is None:
        return None
    try:
        wait = float(raw)
    except ValueError:
        return None
    return wait if 0 <= wait <= MAX_RATE_LIMIT_WAIT else None
