"""Object storage: keys, backends, signing and transfer routes, owned by this one package.

Two backends, chosen by ``TRAINHUB_STORAGE``: ``local`` (a folder; the embedded default) and
``s3`` (boto3; AWS or any S3-compatible service). Everything else in trainhub calls the
functions here and never sees which backend is in use.

- keys.py      the layout: ``projects/<pk>/files/…``, ``projects/<pk>/jobs/<job>/a<n>/…``;
               uploads land in ``upload/`` keys, the only ones a PUT URL may name, and what is
               trusted is first sealed (:func:`seal`) to a key no URL can write
- local.py     filesystem backend; grants.py signs its transfer URLs; transfer.py their
               ``/transfer/`` route (GET with Range, PUT with size, sha256 and Content-MD5 checks)
- configured.py  the backend TRAINHUB_STORAGE names
- s3.py        S3 backend: streamed multipart writes with SHA-256 checksums, presigned URLs
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

from django.conf import settings
from django.http import HttpRequest, HttpResponseBase, HttpResponseRedirect

from jobs.storage import transfer
from jobs.storage.base import (
    CHUNK_BYTES,
    MAX_PUT_BYTES,
    MAX_URL_TTL_SECONDS,
    HashMismatch,
    ObjectInfo,
    ObjectMissing,
    StoredObject,
    TooLarge,
    Transfer,
    check_sha256,
)
from jobs.storage.configured import backend
from jobs.storage.grants import METHODS
from jobs.storage.keys import (
    bundle_key,
    checkpoint_key,
    export_key,
    is_seal_marker,
    is_upload_key,
    job_prefix,
    project_prefix,
    seal_marker_key,
    sealed_key,
    training_file_key,
)
from jobs.storage.local import LocalBackend

__all__ = [
    "CHUNK_BYTES",
    "MAX_PUT_BYTES",
    "MAX_URL_TTL_SECONDS",
    "HashMismatch",
    "ObjectInfo",
    "ObjectMissing",
    "StoredObject",
    "TooLarge",
    "backend",
    "bundle_key",
    "checkpoint_key",
    "delete",
    "delete_prefix",
    "download_response",
    "exists",
    "export_key",
    "is_seal_marker",
    "is_upload_key",
    "job_prefix",
    "list_objects",
    "project_prefix",
    "reachable_from_cloud",
    "read_chunks",
    "save_stream",
    "seal",
    "seal_marker_key",
    "sealed_key",
    "size",
    "training_file_key",
    "transfer_url",
]

# A client redirected to S3 starts its download within this; resuming later asks the API again.
DOWNLOAD_URL_TTL_SECONDS = 15 * 60


def save_stream(
    key: str,
    chunks: Iterable[bytes],
    *,
    max_bytes: int | None = None,
    expected_sha256: str | None = None,
) -> StoredObject:
    """Write chunks to ``key``, hashing as they pass; raise TooLarge past ``max_bytes`` and
    HashMismatch when ``expected_sha256`` is given and differs. Either leaves ``key`` as it was.
    Memory stays flat (one chunk locally, one multipart part on S3)."""
    return backend().save_stream(key, chunks, max_bytes=max_bytes, expected_sha256=expected_sha256)


def read_chunks(key: str) -> Iterator[bytes]:
    """The object in chunks; ObjectMissing (a FileNotFoundError) on the first read if absent."""
    return backend().read_chunks(key)


def size(key: str) -> int:
    return backend().size(key)


def exists(key: str) -> bool:
    try:
        backend().size(key)
    except ObjectMissing:
        return False
    return True


def delete(key: str) -> None:
    backend().delete(key)


def list_objects(prefix: str) -> Iterator[ObjectInfo]:
    return backend().list(prefix)


def delete_prefix(prefix: str) -> int:
    """Delete every object under ``prefix`` (a folder key ending in '/'); returns how many."""
    if not prefix.endswith("/") or not prefix.startswith("projects/"):
        raise ValueError(f"not a folder key under projects/: {prefix!r}")
    store = backend()
    keys = [info.key for info in store.list(prefix)]
    for key in keys:
        store.delete(key)
    return len(keys)


def seal(upload_key: str) -> str | None:
    """Close ``upload_key`` for good and keep what it holds where no URL can write.

    Writes the key's seal marker first (from then on the transfer route answers a PUT to it
    with 409 and nothing there is promoted again), then moves the object to its
    :func:`sealed_key`. Returns that key when it holds bytes, None when nothing was uploaded.
    Idempotent and safe to race: once sealed, the sealed bytes never change, whatever is PUT to
    the upload key later (an S3 presigned URL cannot be revoked; its bytes are never read)."""
    store = backend()
    sealed = sealed_key(upload_key)
    marker = seal_marker_key(upload_key)
    if not exists(marker):
        store.save_stream(marker, [b""])
        with contextlib.suppress(ObjectMissing):  # nothing uploaded, or a racing seal moved it
            store.move(upload_key, sealed)
    return sealed if exists(sealed) else None


def transfer_url(
    key: str,
    method: str,
    *,
    ttl_seconds: int,
    max_bytes: int | None = None,
    size: int | None = None,
    sha256: str | None = None,
    public: bool = False,
) -> str:
    """A URL that allows ``method`` (GET or PUT) on ``key`` alone for ``ttl_seconds`` (at most
    7 days: S3's limit). A PUT needs ``max_bytes`` (at most 5 GiB: one S3 PUT) or the exact
    ``size``; ``size`` and ``sha256``, when known, pin the upload to exactly those bytes.
    ``public``: for workers outside the operator's network (local backend:
    TRAINHUB_PUBLIC_URL). A PUT may name an upload key only (keys.is_upload_key): sealed
    objects, training files and markers never get one. Raises ValueError for anything else."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, not {method!r}")
    if method == "PUT":
        if not is_upload_key(key):
            raise ValueError(f"PUT transfer URLs name an attempt's upload key only, not {key!r}")
        cap = size if size is not None else max_bytes
        if cap is None:
            raise ValueError("a PUT transfer URL needs max_bytes or size")
        if not 0 <= cap <= MAX_PUT_BYTES:
            raise ValueError(f"a PUT transfer URL carries at most {MAX_PUT_BYTES} bytes")
        if sha256 is not None:
            sha256 = check_sha256(sha256)
    elif max_bytes is not None or size is not None or sha256 is not None:
        raise ValueError("max_bytes, size and sha256 apply to PUT transfer URLs only")
    grant = Transfer(
        key=key,
        method=method,
        ttl_seconds=min(ttl_seconds, MAX_URL_TTL_SECONDS),
        max_bytes=max_bytes,
        size=size,
        sha256=sha256,
        public=public,
    )
    return backend().transfer_url(grant)


def download_response(request: HttpRequest, key: str, *, filename: str) -> HttpResponseBase:
    """The response that hands a client the object: a redirect to a short-lived presigned GET
    (S3, which serves Range itself), or the bytes streamed from here with Range support.
    Raises ObjectMissing when nothing is stored at ``key``."""
    store = backend()
    url = store.download_url(key, filename=filename, ttl_seconds=DOWNLOAD_URL_TTL_SECONDS)
    if url is not None:
        store.size(key)  # ObjectMissing here is a clear error; after the redirect, S3's XML
        return HttpResponseRedirect(url)
    if not isinstance(store, LocalBackend):
        raise TypeError(f"the {store.name} backend neither redirects nor serves bytes")
    response = transfer.serve(request, store.open(key))
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response


def reachable_from_cloud() -> bool:
    """Whether a rented machine can reach the transfer URLs: S3 is public; the local backend
    needs this control plane's public address."""
    return settings.TRAINHUB_STORAGE == "s3" or bool(settings.TRAINHUB_PUBLIC_URL)
