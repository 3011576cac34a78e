"""Moving files to and from the signed URLs in a job spec: http(s):// and file://.

- :func:`download` streams to a temporary file next to the destination, hashing as it goes, and
  renames it into place only when the sha256 matches (a mismatch names expected and got).
- :func:`upload` PUTs a file streamed from disk with a Content-Length (S3 presigned PUTs
  reject chunked transfer encoding), so memory stays flat whatever the size, and a
  ``Content-MD5``: S3 (and the control plane's own transfer route) refuse a body that arrives
  different from what left, and the upload is retried. It is the one integrity header S3
  accepts without it being signed into the URL, which is issued before the file exists.
- Connection errors, timeouts, 429 and 5xx are retried with exponential backoff
  (``gpu_worker.retrying``); other HTTP errors fail at once (an expired signature does not get
  better by waiting).

Failures raise :class:`~gpu_worker.errors.ExecutorError` with ``download_failed`` /
``upload_failed``. URLs are signed (their query strings are credentials), so messages show
them without the query string.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit
from urllib.request import url2pathname

import requests

from gpu_worker.errors import DOWNLOAD_FAILED, UPLOAD_FAILED, Cancelled, ExecutorError
from gpu_worker.retrying import RetryPolicy

CHUNK_BYTES = 1024 * 1024
ATTEMPTS = 5
BACKOFF_SECONDS = 1.0  # first retry delay; doubles each time, capped at BACKOFF_MAX_SECONDS
BACKOFF_MAX_SECONDS = 30.0
CONNECT_TIMEOUT = 10.0
READ_TIMEOUT = 120.0  # between bytes, not for the whole transfer
_RETRY_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})
# A 400 whose body names a Content-MD5 mismatch: damaged in transit, so sending it again helps.
_BAD_DIGEST = ("BadDigest", "bad_digest")
_RETRY_EXC = (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError)


class _Retry(Exception):
    """A transient failure worth another attempt."""


_RETRYABLE = (_Retry, *_RETRY_EXC)


def redact(url: str) -> str:
    """The URL without query string and fragment (signed URLs carry credentials there)."""
    parts = urlsplit(url)
    netloc = parts.hostname or ""
    if parts.port:
        netloc += f":{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


_QUERY = re.compile(r"""(/[^\s?'"]*)\?[^\s'")<]*""")


def scrub(text: str, url: str) -> str:
    """``text`` (an exception message, a response body) without the URL's query string or any
    other query string: requests/urllib3 errors quote the full signed URL."""
    query = urlsplit(url).query
    if query:
        text = text.replace(query, "")
    return _QUERY.sub(r"\1", text)


def _md5_b64(path: Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with path.open("rb") as fh:
        while chunk := fh.read(CHUNK_BYTES):
            digest.update(chunk)
    return base64.b64encode(digest.digest()).decode()


def _local_path(url: str) -> Path:
    parts = urlsplit(url)
    if parts.netloc not in ("", "localhost"):
        raise ValueError(f"file:// URLs must be local (got host {parts.netloc!r})")
    return Path(url2pathname(parts.path))


def _with_retries(
    op: Callable[[], int], *, url: str, reason: str, label: str, attempts: int
) -> int:
    policy = RetryPolicy(
        attempts=attempts, backoff_seconds=BACKOFF_SECONDS, backoff_max_seconds=BACKOFF_MAX_SECONDS
    )
    try:
        return policy.call(op, retry_if=lambda exc: isinstance(exc, _RETRYABLE))
    except _Retry as exc:
        last = str(exc)
    except _RETRY_EXC as exc:
        last = scrub(f"{type(exc).__name__}: {exc}", url)
    # Not chained: requests' exceptions quote the signed URL, query string and all.
    raise ExecutorError(reason, f"{label} failed after {attempts} attempts: {last}")


def _http_error(resp: requests.Response, verb: str, url: str) -> str:
    body = scrub(resp.text[:300].strip(), url) if resp.content else ""
    hint = ""
    if resp.status_code in (401, 403):
        hint = "; the signed URL may have expired (a new attempt gets fresh URLs)"
    elif resp.status_code == 404:
        hint = "; the object does not exist at that URL"
    elif resp.status_code == 409:
        hint = "; the control plane has sealed this upload (a later attempt took over)"
    return f"{verb} {redact(url)} returned HTTP {resp.status_code}{hint}" + (
        f" ({body})" if body else ""
    )


def download(
    url: str,
    dest: Path,
    *,
    sha256: str | None = None,
    what: str = "file",
    should_stop: Callable[[], bool] | None = None,
    attempts: int = ATTEMPTS,
) -> int:
    """Fetch ``url`` into ``dest``; verify ``sha256`` if given. Returns the size in bytes.

    Raises ExecutorError(download_failed) or Cancelled (``should_stop`` is polled per chunk).
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    label = f"downloading the {what} from {redact(url)}"

    def fetch() -> int:
        fd, tmp_name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.")
        tmp = Path(tmp_name)
        digest, size = hashlib.sha256(), 0
        try:
            with os.fdopen(fd, "wb") as out:
                for chunk in _read(url, label):
                    if should_stop is not None and should_stop():
                        raise Cancelled(f"stopped while {label}")
                    digest.update(chunk)
                    size += len(chunk)
                    out.write(chunk)
            got = digest.hexdigest()
            if sha256 is not None and got != sha256:
                raise ExecutorError(
                    DOWNLOAD_FAILED,
                    f"the {what} at {redact(url)} does not match its sha256: expected {sha256}, "
                    f"got {got} ({size} bytes); the file changed after it was validated or was "
                    "corrupted in transit; upload it again",
                )
            os.replace(tmp, dest)
            return size
        finally:
            tmp.unlink(missing_ok=True)

    if url.startswith("file://"):
        try:
            return fetch()
        except (OSError, ValueError) as exc:
            raise ExecutorError(DOWNLOAD_FAILED, f"{label} failed: {exc}") from exc
    return _with_retries(fetch, url=url, reason=DOWNLOAD_FAILED, label=label, attempts=attempts)


def _read(url: str, label: str):  # type: ignore[no-untyped-def]
    if url.startswith("file://"):
        with _local_path(url).open("rb") as fh:
            while chunk := fh.read(CHUNK_BYTES):
                yield chunk
        return
    with requests.get(url, stream=True, timeout=(CONNECT_TIMEOUT, READ_TIMEOUT)) as resp:
        if resp.status_code in _RETRY_STATUS:
            raise _Retry(_http_error(resp, "GET", url))
        if resp.status_code >= 400:
            raise ExecutorError(DOWNLOAD_FAILED, f"{label} failed: {_http_error(resp, 'GET', url)}")
        yield from resp.iter_content(CHUNK_BYTES)


def upload(
    path: Path,
    url: str,
    *,
    what: str = "file",
    content_type: str = "application/octet-stream",
    attempts: int = ATTEMPTS,
) -> int:
    """PUT the file at ``path`` to ``url``; returns the size. Raises ExecutorError(upload_failed)."""
    path = Path(path)
    size = path.stat().st_size
    label = f"uploading the {what} to {redact(url)}"

    if url.startswith("file://"):
        try:
            target = _local_path(url)
            target.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
            try:
                with os.fdopen(fd, "wb") as out, path.open("rb") as src:
                    shutil.copyfileobj(src, out, CHUNK_BYTES)
                os.replace(tmp_name, target)  # readers never see a partial object
            finally:
                Path(tmp_name).unlink(missing_ok=True)
        except (OSError, ValueError) as exc:
            raise ExecutorError(UPLOAD_FAILED, f"{label} failed: {exc}") from exc
        return size

    headers = {
        "Content-Length": str(size),
        "Content-Type": content_type,
        "Content-MD5": _md5_b64(path),
    }

    def put() -> int:
        with path.open("rb") as fh:  # a file object: requests streams it, never reads it whole
            resp = requests.put(
                url, data=fh, headers=headers, timeout=(CONNECT_TIMEOUT, READ_TIMEOUT)
            )
        with resp:
            if resp.status_code in _RETRY_STATUS or (
                resp.status_code == 400 and any(code in resp.text for code in _BAD_DIGEST)
            ):
                raise _Retry(_http_error(resp, "PUT", url))
            if resp.status_code >= 400:
                raise ExecutorError(
                    UPLOAD_FAILED, f"{label} failed: {_http_error(resp, 'PUT', url)}"
                )
        return size

    return _with_retries(put, url=url, reason=UPLOAD_FAILED, label=label, attempts=attempts)
