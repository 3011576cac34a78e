"""The local backend's transfer routes: signed, expiring, per-object, per-verb URLs.

Nodes never hold database or storage credentials. The job spec gets one URL per object and per
verb (GET the training file, PUT the adapter bundle), each good until an absolute expiry, so a
leaked spec exposes those objects only, and only for that long. The token is the authority: the
view does no other authentication and touches no database. (With S3 storage the same URLs are
S3 presigned URLs and this route is not used: jobs.storage.s3.)

The token is a Django signature (SECRET_KEY under its own salt) over the storage key, the verb,
the expiry and, for PUT, the size cap, the exact size and the sha256 when known. GET streams
the object, honouring a single byte range so an interrupted download can resume. PUT streams the
body into storage, which renames into place only after every check passed (size, sha256, and a
``Content-MD5`` the client sent, as S3 checks it), so a failed upload never replaces anything.

A PUT is accepted for an attempt's upload key only (jobs.storage.keys), and only until that key
is sealed (409 ``upload_closed`` after): the one thing a stateless token cannot say is "no longer",
so the seal marker in storage says it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import re
import time
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO

from django.core import signing
from django.http import HttpRequest, HttpResponseBase, JsonResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt

from jobs.errors import error_body
from jobs.storage import configured, keys
from jobs.storage.base import CHUNK_BYTES, HashMismatch, ObjectMissing, TooLarge
from jobs.storage.grants import METHODS, SALT

# 19 digits reach 10**19 bytes, beyond any object; longer numbers are refused, not parsed.
_RANGE_DIGITS = 19
_RANGE = re.compile(rf"([0-9]{{0,{_RANGE_DIGITS}}})-([0-9]{{0,{_RANGE_DIGITS}}})")


class _Refused(Exception):
    """A request the view answers with an error; messages never quote the token."""

    def __init__(
        self, status: int, code: str, message: str, *, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.headers = status, code, message, headers

    def response(self) -> JsonResponse:
        body = error_body(self.message, type="invalid_request_error", code=self.code)
        return JsonResponse(body, status=self.status, headers=self.headers)


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
        backend = _local_backend()
        if request.method == "GET":
            try:
                fh = backend.open(grant["key"])
            except ObjectMissing:
                raise _Refused(
                    404, "not_found", "No object has been stored at this URL yet."
                ) from None
            return serve(request, fh)
        return _put(request, grant, backend)
    except _Refused as exc:
        return exc.response()


def _local_backend() -> Any:
    backend = configured.backend()
    if backend.name != "local":
        raise _Refused(
            404, "not_found", "This installation stores objects in S3; transfer URLs point there."
        )
    return backend


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


def serve(request: HttpRequest, fh: BinaryIO) -> HttpResponseBase:
    """Stream an open file, honouring a single ``Range``: 206 with Content-Range, 416 past the
    end or for a malformed byte range, the whole file without one. The file is open before
    answering, so a concurrent rename cannot change the bytes this response announced."""
    size = os.fstat(fh.fileno()).st_size
    try:
        span = _byte_range(request.headers.get("Range"), size=size)
    except _Refused as exc:
        fh.close()
        return exc.response()
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

    A range in another unit is ignored (RFC 9110 says so). A ``bytes`` range that is not one
    well-formed range (several, reversed, not numbers, or numbers longer than any object could
    need) is refused with 416 naming the accepted forms: never parsed blindly (int() of 5000
    digits raises, a 500), never silently answered with the whole object."""
    if not header:
        return None
    unit, _, spec = header.strip().partition("=")
    if unit.strip().lower() != "bytes":
        return None
    match = _RANGE.fullmatch(spec.strip())
    if match is None or match.groups() == ("", ""):
        raise _malformed(header, size)
    first, last = match.groups()
    if first and last and int(last) < int(first):
        raise _malformed(header, size)
    if size == 0:
        return None
    if not first:  # bytes=-n: the last n bytes
        if int(last) == 0:
            raise _unsatisfiable(size)
        return max(0, size - int(last)), size - 1
    if int(first) >= size:
        raise _unsatisfiable(size)
    return int(first), (min(int(last), size - 1) if last else size - 1)


def _malformed(header: str, size: int) -> _Refused:
    shown = header if len(header) <= 60 else header[:60] + "…"
    return _Refused(
        416,
        "invalid_range",
        f"Range {shown!r} is not one byte range. Send one of bytes=FIRST-LAST, bytes=FIRST- or "
        f"bytes=-LENGTH (numbers of at most {_RANGE_DIGITS} digits, LAST not below FIRST), or "
        f"no Range for the whole object; this one is {size} bytes.",
        headers={"Content-Range": f"bytes */{size}"},
    )


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


def _put(request: HttpRequest, grant: dict[str, Any], backend: Any) -> JsonResponse:
    key: str = grant["key"]
    if not keys.is_upload_key(key):
        # Signed before uploads moved to upload keys (or by a bug): it may name what ingest
        # verified, which nothing may overwrite.
        raise _Refused(
            403,
            "transfer_forbidden",
            "This transfer URL does not accept uploads any more; a new attempt is issued fresh "
            "URLs.",
        )

    def closed() -> bool:
        try:
            backend.size(keys.seal_marker_key(key))
        except ObjectMissing:
            return False
        return True

    if closed():
        raise _upload_closed()
    limit: int = grant["max_bytes"]
    raw_length = request.META.get("CONTENT_LENGTH") or ""
    if not raw_length:
        # Behind WSGI a body without Content-Length (chunked) reads as empty: storing that
        # would replace the object with nothing.
        raise _Refused(411, "length_required", "PUT to a transfer URL needs a Content-Length.")
    if not raw_length.isascii() or not raw_length.isdigit():
        raise _Refused(400, "invalid_content_length", f"Bad Content-Length {raw_length!r}.")
    declared = int(raw_length)
    if "size" in grant and declared != grant["size"]:
        raise _Refused(
            400,
            "size_mismatch",
            f"This transfer URL takes exactly {grant['size']} bytes, not {declared}.",
        )
    if declared > limit:
        raise _too_large(limit, declared)
    md5 = _content_md5(request.headers.get("Content-MD5"))
    try:
        stored = backend.save_stream(
            grant["key"],
            _body(request, declared=declared, md5=md5, closed=closed),
            max_bytes=limit,
            expected_sha256=grant.get("sha256"),
        )
    except TooLarge:
        raise _too_large(limit, None) from None
    except HashMismatch as exc:
        raise _checksum_mismatch(exc) from None
    return JsonResponse({"size": stored.size, "sha256": stored.sha256}, status=201)


def _content_md5(header: str | None) -> bytes | None:
    """The digest a ``Content-MD5`` header announces (base64 of 16 bytes), as S3 reads it."""
    if header is None:
        return None
    try:
        digest = base64.b64decode(header, validate=True)
    except (binascii.Error, ValueError):
        digest = b""
    if len(digest) != 16:
        raise _Refused(
            400, "invalid_digest", "Content-MD5 must be the base64 of the body's 16-byte MD5."
        )
    return digest


def _body(
    request: HttpRequest, *, declared: int, md5: bytes | None, closed: Callable[[], bool]
) -> Iterator[bytes]:
    """The request body in 1 MiB chunks; raising here makes save_stream drop its temp file.
    ``closed`` is asked again once the body is in: an upload still streaming when its key was
    sealed is dropped rather than stored (it would never be read, but it is not kept)."""
    received, digest = 0, hashlib.md5(usedforsecurity=False)
    while chunk := request.read(CHUNK_BYTES):
        received += len(chunk)
        if md5 is not None:
            digest.update(chunk)
        yield chunk
    if received != declared:  # the client went away mid-upload: never store a truncated file
        raise _Refused(
            400,
            "incomplete_body",
            f"The body ended after {received} of {declared} bytes; nothing was stored.",
        )
    if md5 is not None and digest.digest() != md5:
        # S3's code for the same case (BadDigest): the bytes changed on the way; send them again.
        raise _Refused(
            400,
            "bad_digest",
            f"The body's MD5 is {digest.hexdigest()} but its Content-MD5 says {md5.hex()}: it "
            "was damaged in transit. Nothing was stored; upload it again.",
        )
    if closed():
        raise _upload_closed()


def _upload_closed() -> _Refused:
    return _Refused(
        409,
        "upload_closed",
        "This upload is closed: what was uploaded here has been sealed (taken in at ingest, or "
        "when a later attempt of the job started), and sealed bytes never change. Nothing was "
        "stored; a new attempt is issued fresh URLs.",
    )


def _checksum_mismatch(exc: HashMismatch) -> _Refused:
    return _Refused(
        400,
        "checksum_mismatch",
        f"The body's sha256 is {exc.actual} but this URL expects {exc.expected}; it is not the "
        "file the URL was issued for, or it was corrupted before upload. Nothing was stored.",
    )


def _too_large(limit: int, declared: int | None) -> _Refused:
    body = "The body" if declared is None else f"The body ({declared} bytes)"
    return _Refused(
        413, "too_large", f"{body} is over {limit} bytes, the most this transfer URL accepts."
    )
