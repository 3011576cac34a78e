"""The adapter bundle: an uncompressed tar whose first member is ``manifest.json``.

Written by the executor, verified by the control plane while streaming (never extracted to
disk). Django-free so both sides share one definition of the format.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO

MANIFEST = "manifest.json"
FORMAT_VERSION = 1
_CHUNK = 1024 * 1024


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


class _HashingReader(io.RawIOBase):
    """A read-only stream over byte chunks that hashes and counts everything read."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks: Iterator[bytes] = iter(chunks)
        self._buffer = b""
        self.digest = hashlib.sha256()
        self.size = 0

    def readable(self) -> bool:
        return True

    def readinto(self, target: memoryview) -> int:  # type: ignore[override]
        while not self._buffer:
            try:
                self._buffer = next(self._chunks)
            except StopIteration:
                return 0
        n = min(len(target), len(self._buffer))
        target[:n] = self._buffer[:n]
        self.digest.update(self._buffer[:n])
        self.size += n
        self._buffer = self._buffer[n:]
        return n

    def drain(self) -> None:
        while self.read(_CHUNK):
            pass


def _safe_name(name: str) -> bool:
    path = PurePosixPath(name)
    return bool(name) and not path.is_absolute() and ".." not in path.parts


def _parse_manifest(raw: bytes) -> dict[str, BundleFile]:
    try:
        doc = json.loads(raw)
        entries = [
            BundleFile(str(e["path"]), int(e["size"]), str(e["sha256"])) for e in doc["files"]
        ]
    except (ValueError, KeyError, TypeError) as exc:
        raise BundleError(f"manifest.json is not a valid manifest: {exc}", MANIFEST) from None
    return {e.path: e for e in entries}


def verify_bundle(chunks: Iterable[bytes]) -> VerifiedBundle:
    """Stream through the bundle, checking every member against the manifest.

    Memory stays flat: members are hashed in chunks, nothing is written anywhere.
    Raises BundleError on the first problem.
    """
    reader = _HashingReader(chunks)
    stream = io.BufferedReader(reader, buffer_size=_CHUNK)
    expected: dict[str, BundleFile] | None = None
    seen: list[BundleFile] = []
    try:
        with tarfile.open(fileobj=stream, mode="r|") as tar:
            for member in tar:
                if expected is None:
                    if member.name != MANIFEST or not member.isfile() or member.size > _CHUNK:
                        raise BundleError("the first member must be manifest.json", member.name)
                    expected = _parse_manifest(tar.extractfile(member).read())  # type: ignore[union-attr]
                    continue
                if not member.isfile() or not _safe_name(member.name):
                    raise BundleError(
                        f"{member.name} is not a plain file with a safe name", member.name
                    )
                want = expected.get(member.name)
                if want is None:
                    raise BundleError(f"{member.name} is not in the manifest", member.name)
                digest, fh = hashlib.sha256(), tar.extractfile(member)
                while chunk := fh.read(_CHUNK):  # type: ignore[union-attr]
                    digest.update(chunk)
                if member.size != want.size or digest.hexdigest() != want.sha256:
                    raise BundleError(
                        f"{member.name} does not match its manifest hash or size", member.name
                    )
                seen.append(want)
    except tarfile.TarError as exc:
        raise BundleError(f"not a readable tar archive: {exc}") from None
    if expected is None:
        raise BundleError("the bundle is empty", MANIFEST)
    missing = sorted(set(expected) - {f.path for f in seen})
    if missing:
        raise BundleError(f"{missing[0]} is in the manifest but not in the bundle", missing[0])
    reader.drain()
    return VerifiedBundle(size=reader.size, sha256=reader.digest.hexdigest(), files=tuple(seen))
