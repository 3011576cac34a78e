"""Object storage for uploads and artifacts: keys and the local filesystem backend.

Keys are built here from database ids only; nothing a user supplies becomes a path.
Writes stream in chunks through a temporary file and are renamed into place, so a failed or
oversized upload never leaves a partial object behind.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

CHUNK_BYTES = 1024 * 1024


class TooLarge(Exception):
    def __init__(self, limit: int) -> None:
        super().__init__(f"larger than {limit} bytes")
        self.limit = limit


class HashMismatch(Exception):
    def __init__(self, expected: str, actual: str) -> None:
        super().__init__(f"sha256 mismatch: expected {expected}, got {actual}")
        self.expected = expected
        self.actual = actual


@dataclass(frozen=True)
class StoredObject:
    key: str
    size: int
    sha256: str


def training_file_key(project_id: int, file_public_id: str) -> str:
    return f"projects/{project_id}/files/{file_public_id}.jsonl"


def bundle_key(project_id: int, job_public_id: str, attempt_number: int) -> str:
    """Where an attempt's adapter bundle is uploaded (and kept once verified)."""
    return f"projects/{project_id}/jobs/{job_public_id}/a{attempt_number}/adapter.tar"


def checkpoint_key(project_id: int, job_public_id: str) -> str:
    """The job's checkpoint slot: every attempt overwrites it, the next one resumes from it."""
    return f"projects/{project_id}/jobs/{job_public_id}/checkpoint.tar"


def _path(key: str) -> Path:
    root = Path(settings.TRAINHUB_STORAGE_DIR).resolve()
    path = (root / key).resolve()
    if not path.is_relative_to(root):
        raise ValueError(f"storage key escapes the storage root: {key!r}")
    return path


def save_stream(
    key: str,
    chunks: Iterable[bytes],
    *,
    max_bytes: int | None = None,
    expected_sha256: str | None = None,
) -> StoredObject:
    """Write chunks to ``key``, hashing as they pass; raise TooLarge past ``max_bytes`` and
    HashMismatch when ``expected_sha256`` is given and differs. Either leaves ``key`` as it was."""
    path = _path(key)
    path.parent.mkdir(parents=True, exist_ok=True)
    digest, size = hashlib.sha256(), 0
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=".upload-")
    try:
        with os.fdopen(fd, "wb") as out:
            for chunk in chunks:
                size += len(chunk)
                if max_bytes is not None and size > max_bytes:
                    raise TooLarge(max_bytes)
                digest.update(chunk)
                out.write(chunk)
        actual = digest.hexdigest()
        if expected_sha256 is not None and actual != expected_sha256.lower():
            raise HashMismatch(expected_sha256.lower(), actual)
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    return StoredObject(key=key, size=size, sha256=actual)


def read_chunks(key: str, chunk_bytes: int = CHUNK_BYTES) -> Iterator[bytes]:
    with _path(key).open("rb") as fh:
        while chunk := fh.read(chunk_bytes):
            yield chunk


def local_path(key: str) -> Path:
    return _path(key)


def exists(key: str) -> bool:
    return _path(key).exists()


def delete(key: str) -> None:
    _path(key).unlink(missing_ok=True)
