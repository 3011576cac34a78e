"""The local filesystem backend: the embedded default, and any shared disk.

Writes stream through a temporary file beside the target and are renamed into place only after
every check passed, so a failed or oversized upload never replaces what was there. Transfer URLs
point to this control plane's own ``/transfer/`` route (jobs.storage.transfer).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO

from jobs.storage import grants
from jobs.storage.base import (
    CHUNK_BYTES,
    HashMismatch,
    ObjectInfo,
    ObjectMissing,
    StoredObject,
    TooLarge,
    Transfer,
)

TEMP_PREFIX = ".upload-"


class LocalBackend:
    name = "local"

    def __init__(self, root: Path) -> None:
        self.root = Path(root).resolve()

    def path(self, key: str) -> Path:
        path = (self.root / key).resolve()
        if not path.is_relative_to(self.root) or path == self.root:
            raise ValueError(f"storage key escapes the storage root: {key!r}")
        return path

    def save_stream(
        self,
        key: str,
        chunks: Iterable[bytes],
        *,
        max_bytes: int | None = None,
        expected_sha256: str | None = None,
    ) -> StoredObject:
        path = self.path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        digest, size = hashlib.sha256(), 0
        fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=TEMP_PREFIX)
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

    def open(self, key: str) -> BinaryIO:
        try:
            return self.path(key).open("rb")
        except FileNotFoundError:
            raise ObjectMissing(key) from None

    def read_chunks(self, key: str) -> Iterator[bytes]:
        with self.open(key) as fh:
            while chunk := fh.read(CHUNK_BYTES):
                yield chunk

    def size(self, key: str) -> int:
        try:
            return self.path(key).stat().st_size
        except FileNotFoundError:
            raise ObjectMissing(key) from None

    def delete(self, key: str) -> None:
        path = self.path(key)
        path.unlink(missing_ok=True)
        self._prune(path)

    def move(self, src: str, dst: str) -> None:
        source, target = self.path(src), self.path(dst)
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            # A rename: atomic, and a reader that opened either file keeps its own bytes.
            os.replace(source, target)
        except FileNotFoundError:
            raise ObjectMissing(src) from None
        self._prune(source)

    def _prune(self, path: Path) -> None:
        # Drop the folders an object leaves empty, so deleted jobs leave no trace on disk.
        for parent in path.parents:
            if parent == self.root or not parent.is_relative_to(self.root):
                break
            with contextlib.suppress(OSError):  # not empty, or already gone
                parent.rmdir()

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        top = self.root / prefix
        if not top.is_dir():
            return
        for dirpath, _, names in os.walk(top):
            for name in sorted(names):
                path = Path(dirpath) / name
                with contextlib.suppress(FileNotFoundError):  # deleted meanwhile
                    st = path.stat()
                    yield ObjectInfo(
                        key=path.relative_to(self.root).as_posix(),
                        size=st.st_size,
                        modified=datetime.fromtimestamp(st.st_mtime, tz=UTC),
                    )

    def transfer_url(self, grant: Transfer) -> str:
        self.path(grant.key)  # refuse a bad key now, not when the URL is used
        return grants.sign(grant)

    def download_url(self, key: str, *, filename: str, ttl_seconds: int) -> str | None:
        return None  # the web process streams the file itself (jobs.storage.transfer.serve)
