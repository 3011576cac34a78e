"""What every storage backend shares: the object record, the errors, the backend protocol."""

from __future__ import annotations

import base64
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

CHUNK_BYTES = 1024 * 1024
# The most one PUT may carry: S3's single-request limit (5 GiB), applied to both backends.
MAX_PUT_BYTES = 5 * 1024**3
# S3 refuses presigned URLs valid for longer than 7 days (SigV4).
MAX_URL_TTL_SECONDS = 7 * 24 * 3600


class TooLarge(Exception):
    def __init__(self, limit: int) -> None:
        super().__init__(f"larger than {limit} bytes")
        self.limit = limit


class HashMismatch(Exception):
    def __init__(self, expected: str, actual: str, algorithm: str = "sha256") -> None:
        super().__init__(f"{algorithm} mismatch: expected {expected}, got {actual}")
        self.expected = expected
        self.actual = actual
        self.algorithm = algorithm


class ObjectMissing(FileNotFoundError):
    """No object is stored at the key."""


@dataclass(frozen=True)
class StoredObject:
    key: str
    size: int
    sha256: str


@dataclass(frozen=True)
class Transfer:
    """What one transfer URL allows: ``method`` on ``key`` alone, for ``ttl_seconds``."""

    key: str
    method: str  # GET or PUT
    ttl_seconds: int
    max_bytes: int | None = None  # PUT: the most it accepts
    size: int | None = None  # PUT: exactly this many bytes, when known when issued
    sha256: str | None = None  # PUT: exactly these bytes, when known when issued
    public: bool = False  # for machines outside the operator's network


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int
    modified: datetime


class Backend(Protocol):
    """An object store. Keys come from ``jobs.storage.keys``, never from user input."""

    name: str

    def save_stream(
        self,
        key: str,
        chunks: Iterable[bytes],
        *,
        max_bytes: int | None = None,
        expected_sha256: str | None = None,
    ) -> StoredObject:
        """Store the chunks at ``key``; TooLarge / HashMismatch leave ``key`` as it was."""
        ...

    def read_chunks(self, key: str) -> Iterator[bytes]:
        """The object, in chunks; ObjectMissing if there is none."""
        ...

    def size(self, key: str) -> int:
        """The object's size; ObjectMissing if there is none."""
        ...

    def delete(self, key: str) -> None: ...

    def move(self, src: str, dst: str) -> None:
        """Put the object at ``src`` at ``dst`` (replacing it) and remove ``src``; ObjectMissing
        if ``src`` has none. ``dst`` holds one whole object at every moment, never a mix."""
        ...

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        """Every object whose key starts with ``prefix`` (a folder ending in '/')."""
        ...

    def transfer_url(self, transfer: Transfer) -> str:
        """A URL that lets its holder do exactly what ``transfer`` says, and nothing else."""
        ...

    def download_url(self, key: str, *, filename: str, ttl_seconds: int) -> str | None:
        """A URL clients are redirected to, or None when the web process serves the bytes."""
        ...


def check_sha256(value: str) -> str:
    """``value`` as 64 lowercase hex digits; ValueError otherwise."""
    lowered = value.lower()
    if len(lowered) != 64 or any(c not in "0123456789abcdef" for c in lowered):
        raise ValueError(f"sha256 must be 64 hex digits, not {value!r}")
    return lowered


def sha256_b64(hex_digest: str) -> str:
    """The base64 form S3 uses in ``x-amz-checksum-sha256``."""
    return base64.b64encode(bytes.fromhex(hex_digest)).decode()
