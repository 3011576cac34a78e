"""Upload limits applied while the request body streams in, not after it was stored.

``UploadLimitHandler`` is the first of ``FILE_UPLOAD_HANDLERS``, so Django's multipart parser
hands it each chunk before the memory and temporary-file handlers see it:

- a Content-Length over the limit (plus room for the multipart framing) is refused before a
  byte of the body is read;
- the file bytes are counted as they arrive; the chunk that passes the limit is not handed on,
  and reading stops there (the rest of the body is never read), so at most the limit is stored
  anywhere, the temporary file included.

A view narrows the limit for its request with :func:`restrict` (the project's storage quota)
before it touches ``request.FILES``. The refusal surfaces from Django's parser as
``UploadRefused``, a ``RequestDataTooBig``: a plain Django view answers it with 400, and the
API (``api.errors``) with the ServiceError it carries (413 or 403, JSON), wherever the body
was parsed (in the view, or by session authentication's CSRF check before it).

Django reads a body only up to its Content-Length and treats a body without one (chunked
transfer encoding) as empty, so ``restrict`` answers such an upload 411 rather than "no file".
The web server in front should cap bodies too (see docs/SECURITY.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import IO

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.core.files.uploadhandler import FileUploadHandler, StopUpload
from django.http import HttpRequest
from rest_framework.request import Request

from jobs.errors import LengthRequired, ServiceError
from jobs.services.core.files import UploadAllowance, too_large_error

# Bytes of a multipart body that are not the file: boundaries, part headers (the file name can
# be long) and the small form fields such as ``purpose``.
MULTIPART_OVERHEAD = 64 * 1024


class UploadRefused(RequestDataTooBig):
    """An upload stopped by its limit; ``error`` is what the API answers."""

    def __init__(self, error: ServiceError) -> None:
        super().__init__(error.message)
        self.error = error


class UploadLimitHandler(FileUploadHandler):
    """Counts the file bytes of one request and stops the upload when they pass ``limit``
    (``TRAINHUB_MAX_UPLOAD_BYTES`` unless :func:`restrict` lowered it)."""

    def __init__(self, request: HttpRequest | None = None) -> None:
        super().__init__(request)
        self.limit: int = settings.TRAINHUB_MAX_UPLOAD_BYTES
        self.refuse: Callable[[], ServiceError] = lambda: too_large_error(self.limit)
        self.received = 0  # file bytes of the whole request, every file counted
        self._refused: ServiceError | None = None

    def handle_raw_input(
        self,
        input_data: IO[bytes],
        META: dict[str, str],  # Django names it so
        content_length: int,
        boundary: str,
        encoding: str | None = None,
    ) -> None:
        # Called before the parser reads anything: a declared size over the limit is refused
        # without reading the body.
        if content_length > self.limit + MULTIPART_OVERHEAD:
            raise UploadRefused(self.refuse())

    def receive_data_chunk(self, raw_data: bytes, start: int) -> bytes | None:
        self.received += len(raw_data)
        if self.received > self.limit:
            self._refused = self.refuse()
            # connection_reset: Django neither reads nor stores the rest of the body, and closes
            # the files the next handlers opened (the temporary file is deleted).
            raise StopUpload(connection_reset=True)
        return raw_data

    def file_complete(self, file_size: int) -> None:
        return None  # the next handlers make the file

    def upload_complete(self) -> None:
        # The parser calls this after StopUpload: the refusal leaves as an exception here, not
        # as a request that silently lacks its file.
        if self._refused is not None:
            raise UploadRefused(self._refused)


def restrict(request: Request, allowance: UploadAllowance) -> None:
    """Apply ``allowance`` to the request's upload before its body is read; 411 for a body
    without a Content-Length (Django would read it as empty)."""
    if not request.META.get("CONTENT_LENGTH"):
        raise LengthRequired(
            "Send the upload with a Content-Length header; chunked uploads are not accepted.",
            code="length_required",
            param="file",
        )
    handlers = request._request.upload_handlers
    limiter = next((h for h in handlers if isinstance(h, UploadLimitHandler)), None)
    if limiter is None:  # FILE_UPLOAD_HANDLERS without it: put it first for this request
        limiter = UploadLimitHandler(request._request)
        request._request.upload_handlers = [limiter, *handlers]
    limiter.limit = min(limiter.limit, allowance.limit)
    if limiter.limit == allowance.limit:
        limiter.refuse = allowance.refuse
