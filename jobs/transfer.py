"""Signed, expiring transfer URLs: how GPU nodes read their inputs and write their results.

Nodes never hold database or storage credentials. At dispatch the job spec gets one URL per
object and per verb (GET the training file, PUT the adapter bundle), each good until an
absolute expiry, so a leaked spec exposes those objects only, and only for that long. The token
is the authority: the view does no other authentication and touches no database.

For the local storage backend the token is a Django signature (SECRET_KEY under its own salt)
over the storage key, the verb, the expiry and, for PUT, the size cap and the expected sha256.
GET streams the object, honouring a single byte range so an interrupted download can resume.
PUT streams the body through ``storage.save_stream``, which renames into place only after every
check passed, so a failed upload never replaces what was there. S3 presigned URLs will plug in
behind :func:`transfer_url` later; the executor's client (gpu_worker.transfer) speaks to both.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from typing import Any, BinaryIO
from urllib.parse import urlencode

from django.conf import settings
from django.core import signing
from django.http import HttpRequest, HttpResponseBase, JsonResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt

from jobs import storage
from jobs.api.errors import error_body

SALT = "trainhub.transfer"
METHODS = ("GET", "PUT")
CHUNK_BYTES = storage.CHUNK_BYTES
_SHA256 = re.compile(r"[0-9a-f]{64}")
_RANGE = re.compile(r"bytes=([0-9]*)-([0-9]*)")


def transfer_url(
    key: str,
    method: str,
    *,
    ttl_seconds: int,
    max_bytes: int | None = None,
    sha256: str | None = None,
) -> str:
    """An absolute URL that allows ``method`` on storage ``key`` for ``ttl_seconds`` from now.

    ``key`` is a key built by jobs.storage, never user input. A PUT URL needs ``max_bytes`` (a
    node must not be able to fill the disk) and may pin ``sha256`` so that a corrupted upload
    is refused instead of stored. Raises ValueError for anything else.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, not {method!r}")
    payload: dict[str, Any] = {"key": key, "method": method, "exp": int(time.time()) + ttl_seconds}
    if method == "PUT":
        if max_bytes is None:
            raise ValueError("a PUT transfer URL needs max_bytes")
        payload["max_bytes"] = max_bytes
        if sha256 is not None:
            if not _SHA256.fullmatch(sha256.lower()):
                raise ValueError(f"sha256 must be 64 hex digits, not {sha256!r}")
            payload["sha256"] = sha256.lower()
    elif max_bytes is not None or sha256 is not None:
        raise ValueError("max_bytes and sha256 apply to PUT transfer URLs only")
    token = signing.dumps(payload, salt=SALT, compress=True)
    # In the query string, like an S3 presigned URL's credentials: the executor's messages
    # strip query strings (gpu_worker.transfer.redact/scrub), so the token never reaches a log.
    return f"{settings.TRAINHUB_CONTROL_URL.rstrip('/')}/transfer/?{urlencode({'t': token})}"


class _Refused(Exception):
    """A request the view answers with an error; messages never quote the token."""

    def __init__(
        self, status: int, code: str, message: str, *, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.headers = status, code, message, headers


@csrf_exempt
def transfer_view(request: HttpRequest) -> HttpResponseBase:
    try:
        if request.method not in METHODS:
            raise _Refused(
                405,
                "method_not_allowed",
                f"Transfer URLs accept GET and PUT only, not {request.method}.",
                headers={"Allow": ", ".join(METHODS)},
            )
        grant = _grant(request.GET.get("t", ""), method=request.method)
        return _get(request, grant) if request.method == "GET" else _put(request, grant)
    except _Refused as exc:
        body = error_body(exc.message, type="invalid_request_error", code=exc.code)
        return JsonResponse(body, status=exc.status, headers=exc.headers)


def _grant(token: str, *, method: str) -> dict[str, Any]:
    try:
        grant: dict[str, Any] = signing.loads(token, salt=SALT)
    except signing.BadSignature:
        raise _Refused(
            403,
            "transfer_forbidden",
            "This transfer URL is not valid (altered, truncated or signed with another key); "
            "use the URL exactly as it was issued.",
        ) from None
    expired_for = int(time.time()) - grant["exp"]
    if expired_for >= 0:
        raise _Refused(
            403,
            "transfer_expired",
            f"This transfer URL expired {expired_for} s ago; a new attempt is issued fresh URLs.",
        )
    if grant["method"] != method:
        raise _Refused(
            403, "transfer_forbidden", f"This transfer URL allows {grant['method']}, not {method}."
        )
    return grant


def _get(request: HttpRequest, grant: dict[str, Any]) -> HttpResponseBase:
    try:
        # Opened before answering: a concurrent PUT renames a new file into place, and this
        # response keeps streaming the one whose size it announced.
        fh = storage.local_path(grant["key"]).open("rb")
    except FileNotFoundError:
        raise _Refused(404, "not_found", "No object has been stored at this URL yet.") from None
    size = os.fstat(fh.fileno()).st_size
    try:
        span = _byte_range(request.headers.get("Range"), size=size)
    except _Refused:
        fh.close()
        raise
    first, last = span or (0, size - 1)
    content = _Slice(fh, start=first, length=last - first + 1)
    response = StreamingHttpResponse(
        content, status=206 if span else 200, content_type="application/octet-stream"
    )
    response["Content-Length"] = str(last - first + 1)
    response["Accept-Ranges"] = "bytes"
    if span:
        response["Content-Range"] = f"bytes {first}-{last}/{size}"
    return response


def _byte_range(header: str | None, *, size: int) -> tuple[int, int] | None:
    """The inclusive (first, last) of a single ``bytes=`` range, or None to send everything.

    Malformed and multi-range headers are ignored (RFC 9110 allows answering them with 200).
    """
    match = _RANGE.fullmatch(header.strip()) if header else None
    if match is None or size == 0:
        return None
    first, last = match.groups()
    if not first:  # bytes=-n: the last n bytes
        if not last:
            return None
        if int(last) == 0:
            raise _unsatisfiable(size)
        return max(0, size - int(last)), size - 1
    if last and int(last) < int(first):
        return None
    if int(first) >= size:
        raise _unsatisfiable(size)
    return int(first), (min(int(last), size - 1) if last else size - 1)


def _unsatisfiable(size: int) -> _Refused:
    return _Refused(
        416,
        "range_not_satisfiable",
        f"The requested range starts beyond the object, which is {size} bytes.",
        headers={"Content-Range": f"bytes */{size}"},
    )


class _Slice:
    """Bytes [start, start + length) of an open file, read in chunks so memory stays flat.

    Django calls ``close`` when the response is done, even if it was never iterated."""

    def __init__(self, fh: BinaryIO, *, start: int, length: int) -> None:
        self._fh, self._start, self._length = fh, start, length

    def __iter__(self) -> Iterator[bytes]:
        self._fh.seek(self._start)
        left = self._length
        while left > 0 and (chunk := self._fh.read(min(CHUNK_BYTES, left))):
            left -= len(chunk)
            yield chunk

    def close(self) -> None:
        self._fh.close()


def _put(request: HttpRequest, grant: dict[str, Any]) -> JsonResponse:
    limit: int = grant["max_bytes"]
    raw_length = request.META.get("CONTENT_LENGTH") or ""
    if not raw_length:
        # Behind WSGI a body without Content-Length (chunked) reads as empty: storing that
        # would replace the object with nothing.
        raise _Refused(411, "length_required", "PUT to a transfer URL needs a Content-Length.")
    if not raw_length.isascii() or not raw_length.isdigit():
        raise _Refused(400, "invalid_content_length", f"Bad Content-Length {raw_length!r}.")
    declared = int(raw_length)
    if declared > limit:
        raise _too_large(limit, declared)
    try:
        stored = storage.save_stream(
            grant["key"],
            _body(request, declared=declared),
            max_bytes=limit,
            expected_sha256=grant.get("sha256"),
        )
    except storage.TooLarge:
        raise _too_large(limit, None) from None
    except storage.HashMismatch as exc:
        raise _Refused(
            400,
            "checksum_mismatch",
            f"The body's sha256 is {exc.actual} but this URL expects {exc.expected}; it was "
            "corrupted in transit or is not the file the URL was issued for. Nothing was stored; "
            "upload it again.",
        ) from None
    return JsonResponse({"size": stored.size, "sha256": stored.sha256}, status=201)


def _body(request: HttpRequest, *, declared: int) -> Iterator[bytes]:
    """The request body in 1 MiB chunks; raising here makes save_stream drop its temp file."""
    received = 0
    while chunk := request.read(CHUNK_BYTES):
        received += len(chunk)
        yield chunk
    if received != declared:  # the client went away mid-upload: never store a truncated file
        raise _Refused(
            400,
            "incomplete_body",
            f"The body ended after {received} of {declared} bytes; nothing was stored.",
        )


def _too_large(limit: int, declared: int | None) -> _Refused:
    body = "The body" if declared is None else f"The body ({declared} bytes)"
    return _Refused(
        413, "too_large", f"{body} is over {limit} bytes, the most this transfer URL accepts."
    )
