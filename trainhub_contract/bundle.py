"""The adapter bundle: an uncompressed tar whose first member is ``manifest.json``.

Written by the executor, verified by the control plane while streaming (never extracted to
disk) and by the CLI while it unpacks a download. Django-free so all three share one definition
of the format: the manifest (:func:`parse_manifest`) and what a member may be named
(:func:`member_path`). Verification walks the
tar headers itself (``tarfile.TarInfo.frombuf`` decodes each) so member bytes are hashed
straight from the incoming chunks, without tarfile's stream buffering copying them.
"""

from __future__ import annotations

import hashlib
import io
import json
import queue
import tarfile
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO

MANIFEST = "manifest.json"
FORMAT_VERSION = 1
# The control plane refuses a larger manifest, so no bundle it stored has one.
MAX_MANIFEST_BYTES = 1024 * 1024
# A PAX extended header is read into memory to be parsed; ours hold a path and a size (a few
# hundred bytes), so anything near this is an attack on the reader's memory.
MAX_HEADER_BYTES = 64 * 1024
_CHUNK = 1024 * 1024
_BLOCK = tarfile.BLOCKSIZE
_ZERO_BLOCK = bytes(_BLOCK)
_FILE_TYPES = (tarfile.REGTYPE, tarfile.AREGTYPE)


class BundleError(ValueError):
    """The bundle is not what its manifest says; ``member`` names the offending file."""

    def __init__(self, message: str, member: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.member = member


@dataclass(frozen=True)
class BundleFile:
    path: str
    size: int
    sha256: str


@dataclass(frozen=True)
class VerifiedBundle:
    size: int
    sha256: str
    files: tuple[BundleFile, ...]


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def write_bundle(source_dir: Path, out: IO[bytes]) -> list[BundleFile]:
    """Write every regular file under ``source_dir`` (sorted) behind a manifest."""
    paths = sorted(p for p in source_dir.rglob("*") if p.is_file() and not p.is_symlink())
    files = [
        BundleFile(p.relative_to(source_dir).as_posix(), p.stat().st_size, _file_sha256(p))
        for p in paths
    ]
    manifest = json.dumps(
        {"format": FORMAT_VERSION, "files": [f.__dict__ for f in files]}, indent=1
    ).encode()
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo(MANIFEST)
        info.size = len(manifest)
        tar.addfile(info, io.BytesIO(manifest))
        for f, p in zip(files, paths, strict=True):
            info = tarfile.TarInfo(f.path)
            info.size = f.size
            with p.open("rb") as fh:
                tar.addfile(info, fh)
    return files


class _WholeHash:
    """SHA-256 of the whole stream, on a second thread: hashlib releases the GIL for large
    buffers, so it runs beside the member hashing and ingest costs about one hash pass."""

    def __init__(self) -> None:
        self.digest = hashlib.sha256()
        self._queue: queue.Queue[bytes | None] = queue.Queue(maxsize=16)  # <= 16 chunks held
        self._thread = threading.Thread(target=self._run, name="bundle-sha256", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (chunk := self._queue.get()) is not None:
            self.digest.update(chunk)

    def feed(self, chunk: bytes) -> None:
        self._queue.put(chunk)

    def finish(self) -> str:
        self._queue.put(None)
        self._thread.join()
        return self.digest.hexdigest()


class _Blocks:
    """The stream as it arrives, read in exact sizes without copying member bytes."""

    def __init__(self, chunks: Iterable[bytes], whole: _WholeHash) -> None:
        self._chunks = iter(chunks)
        self._whole = whole
        self._view = memoryview(b"")
        self.size = 0

    def _more(self) -> bool:
        for chunk in self._chunks:
            if chunk:
                self._whole.feed(chunk)
                self.size += len(chunk)
                self._view = memoryview(chunk)
                return True
        return False

    def pieces(self, n: int) -> Iterator[memoryview]:
        """Exactly ``n`` bytes as views into the chunks; BundleError if the stream ends first."""
        while n > 0:
            if not self._view and not self._more():
                raise BundleError("the bundle is truncated")
            piece, self._view = self._view[:n], self._view[n:]
            n -= len(piece)
            yield piece

    def read(self, n: int) -> bytes:
        return b"".join(self.pieces(n))

    def drain(self) -> None:
        self._view = memoryview(b"")
        while self._more():
            pass


def member_path(name: str) -> PurePosixPath | None:
    """Where a member goes inside the bundle's folder (``./a//b`` is ``a/b``); None for a name
    that is empty, holds a backslash or NUL, is absolute, names a drive or climbs out (``..``)."""
    if not name or "\\" in name or "\x00" in name:
        return None
    path = PurePosixPath(name)
    if path.is_absolute() or ".." in path.parts or ":" in path.parts[0]:
        return None
    parts = [p for p in path.parts if p not in ("", ".")]
    return PurePosixPath(*parts) if parts else None


def parse_manifest(raw: bytes) -> dict[str, BundleFile]:
    """manifest.json's files by their path inside the folder (:func:`member_path`). Refused
    (BundleError naming the entry): not a manifest, an unsafe path, a path listed twice or the
    manifest itself listed, a negative size."""
    try:
        doc = json.loads(raw)
        entries = [
            BundleFile(str(e["path"]), int(e["size"]), str(e["sha256"]).lower())
            for e in doc["files"]
        ]
    except (ValueError, KeyError, TypeError) as exc:
        raise BundleError(f"manifest.json is not a valid manifest: {exc}", MANIFEST) from None
    found: dict[str, BundleFile] = {}
    for entry in entries:
        path = member_path(entry.path)
        if path is None:
            raise BundleError(f"{entry.path!r} in the manifest is not a safe name", entry.path)
        if str(path) in found or str(path) == MANIFEST:
            raise BundleError(f"{entry.path} is listed twice in the manifest", entry.path)
        if entry.size < 0:
            raise BundleError(f"{entry.path} has a negative size in the manifest", entry.path)
        found[str(path)] = entry
    return found


def _pax_overrides(raw: bytes) -> dict[str, str]:
    """The ``path`` and ``size`` records of a PAX extended header (``"<len> key=value\n"``)."""
    found: dict[str, str] = {}
    for record in raw.decode("utf-8", "replace").split("\n"):
        _, _, pair = record.partition(" ")
        key, _, value = pair.partition("=")
        if key in ("path", "size"):
            found[key] = value
    return found


def _member_size(pax: dict[str, str], info: tarfile.TarInfo) -> int:
    """The member's size: the PAX record's when there is one. A size that is not a
    non-negative integer would desynchronise the walk from the headers."""
    raw = pax.get("size", info.size)
    size = int(raw) if isinstance(raw, int) or raw.isdigit() else -1
    if size < 0:
        raise BundleError(f"{pax.get('path', info.name)} has an invalid size {raw!r}")
    return size


def _members(blocks: _Blocks) -> Iterator[tuple[str, int, bytes]]:
    """(name, size, type) of each member, up to the end-of-archive block. The caller consumes
    each member's data (``size`` bytes) before asking for the next."""
    pax: dict[str, str] = {}
    while True:
        header = blocks.read(_BLOCK)
        if header == _ZERO_BLOCK:
            return
        try:
            info = tarfile.TarInfo.frombuf(header, "utf-8", "surrogateescape")
        except tarfile.HeaderError as exc:
            raise BundleError(f"not a readable tar archive: {exc}") from None
        if info.type in (tarfile.XHDTYPE, tarfile.XGLTYPE):
            if not 0 <= info.size <= MAX_HEADER_BYTES:
                # Refused before its bytes are read: the header would be held whole.
                raise BundleError(
                    f"a PAX header of {info.size} bytes is over the {MAX_HEADER_BYTES} byte "
                    "limit for tar headers",
                    pax.get("path", info.name),
                )
            raw = blocks.read(_padded(info.size))[: info.size]
            if info.type == tarfile.XHDTYPE:
                pax = _pax_overrides(raw)
            continue
        name, size = pax.get("path", info.name), _member_size(pax, info)
        pax = {}
        yield name, size, info.type
        blocks.read(_padded(size) - size)


def _padded(size: int) -> int:
    return -(-size // _BLOCK) * _BLOCK


def verify_bundle(chunks: Iterable[bytes]) -> VerifiedBundle:
    """Stream through the bundle, checking every member against the manifest and hashing the
    whole. Memory stays flat (a few chunks; a PAX header over MAX_HEADER_BYTES is refused
    unread); nothing is written anywhere. Raises BundleError on the first problem, naming the
    member."""
    whole = _WholeHash()
    blocks = _Blocks(chunks, whole)
    try:
        expected: dict[str, BundleFile] | None = None
        seen: list[BundleFile] = []
        seen_names: set[str] = set()
        for name, size, kind in _members(blocks):
            if expected is None:
                if name != MANIFEST or kind not in _FILE_TYPES or size > MAX_MANIFEST_BYTES:
                    raise BundleError("the first member must be manifest.json", name)
                expected = parse_manifest(blocks.read(size))
                continue
            path = member_path(name)
            if kind not in _FILE_TYPES or path is None:
                raise BundleError(f"{name} is not a plain file with a safe name", name)
            want = expected.get(str(path))
            if want is None:
                raise BundleError(f"{name} is not in the manifest", name)
            if str(path) in seen_names:  # once only: a repeated member would grow ``seen``
                raise BundleError(f"{name} appears twice in the bundle", name)
            seen_names.add(str(path))
            digest = hashlib.sha256()
            for piece in blocks.pieces(size):
                digest.update(piece)
            if size != want.size or digest.hexdigest() != want.sha256:
                raise BundleError(f"{name} does not match its manifest hash or size", name)
            seen.append(want)
        if expected is None:
            raise BundleError("the bundle is empty", MANIFEST)
        missing = sorted(set(expected) - seen_names)
        if missing:
            raise BundleError(f"{missing[0]} is in the manifest but not in the bundle", missing[0])
        blocks.drain()
    finally:
        sha256 = whole.finish()
    return VerifiedBundle(size=blocks.size, sha256=sha256, files=tuple(seen))
