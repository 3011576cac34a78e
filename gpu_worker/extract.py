"""Extract a downloaded archive (tar, tar.gz/bz2/xz, zip) without trusting it.

Refused, with the member named: absolute paths and drive letters, ``..`` anywhere, links of
any kind (an adapter bundle never holds one, and a link is how an archive writes outside its
folder), device files and FIFOs, more than ``max_members`` entries, and decompression bombs:
more than ``max_bytes`` written in all, counted on the bytes actually written (headers can
lie), or an expansion above ``max_ratio`` times the archive's size. Tar headers that tarfile
would read whole into memory (PAX extended headers, GNU long names) are refused above
``MAX_HEADER_BYTES`` before they are read, and sparse members (whose maps tarfile also reads
whole) are refused outright.

Extraction goes to a temporary folder next to ``dest`` that is renamed into place at the end,
so a refused archive leaves nothing behind. Standard library only: the control plane's
``download_artifact`` command uses it, and so can a user's machine.
"""

from __future__ import annotations

import lzma
import os
import shutil
import stat
import tarfile
import tempfile
import zipfile
import zlib
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import IO

CHUNK = 1 << 20
DEFAULT_MAX_BYTES = 64 * 1024**3
DEFAULT_MAX_MEMBERS = 10_000
DEFAULT_MAX_RATIO = 200
# Below this, a high ratio is just a small file that compresses well.
RATIO_FLOOR_BYTES = 16 * 1024**2
# A header's data (PAX records, a GNU long name) is held in memory to be parsed; real ones are
# a few hundred bytes. Same cap as trainhub_contract.bundle.MAX_HEADER_BYTES.
MAX_HEADER_BYTES = 64 * 1024
_HEADER_TYPES = (
    tarfile.XHDTYPE,
    tarfile.XGLTYPE,
    tarfile.SOLARIS_XHDTYPE,
    tarfile.GNUTYPE_LONGNAME,
    tarfile.GNUTYPE_LONGLINK,
)
_READ_ERRORS = (tarfile.TarError, EOFError, zlib.error, lzma.LZMAError, OSError)


class UnsafeArchive(ValueError):
    def __init__(self, message: str, member: str | None = None) -> None:
        super().__init__(f"{member}: {message}" if member else message)
        self.message = message
        self.member = member


def _relative(name: str) -> PurePosixPath:
    """The member's path inside the target, or UnsafeArchive."""
    cleaned = name.replace("\\", "/")
    path = PurePosixPath(cleaned)
    if cleaned.startswith("/") or (len(cleaned) > 1 and cleaned[1] == ":"):
        raise UnsafeArchive("absolute path", name)
    if ".." in path.parts:
        raise UnsafeArchive("path with '..'", name)
    parts = [p for p in path.parts if p not in ("", ".")]
    if not parts:
        raise UnsafeArchive("empty path", name)
    if any("\x00" in p for p in parts):
        raise UnsafeArchive("NUL in path", name)
    return PurePosixPath(*parts)


class _Budget:
    def __init__(self, archive_size: int, max_bytes: int, max_members: int, max_ratio: int):
        self.limit = min(max_bytes, max(RATIO_FLOOR_BYTES, archive_size * max_ratio))
        self.max_members = max_members
        self.written = 0
        self.members = 0

    def member(self, name: str) -> None:
        self.members += 1
        if self.members > self.max_members:
            raise UnsafeArchive(f"more than {self.max_members} entries", name)

    def take(self, n: int, name: str) -> None:
        self.written += n
        if self.written > self.limit:
            raise UnsafeArchive(
                f"expands past {self.limit} bytes (decompression bomb or oversized archive)", name
            )


def _mkdir(path: Path, name: str) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise UnsafeArchive("a folder where a file already is", name) from None


def _copy(src: IO[bytes], target: Path, budget: _Budget, name: str) -> None:
    _mkdir(target.parent, name)
    try:
        out = target.open("xb")  # "x": a second member with the same path is refused
    except (FileExistsError, IsADirectoryError, NotADirectoryError):
        raise UnsafeArchive("the same path twice", name) from None
    with out:
        while chunk := src.read(CHUNK):
            budget.take(len(chunk), name)
            out.write(chunk)


class _BoundedTarInfo(tarfile.TarInfo):
    """A TarInfo that refuses, before reading them, the header records tarfile holds whole.
    Raised as UnsafeArchive: tarfile turns its own header errors after the first member into
    a silent end of archive."""

    def _proc_member(self, owner: tarfile.TarFile) -> tarfile.TarInfo:
        if self.type in _HEADER_TYPES and not 0 <= self.size <= MAX_HEADER_BYTES:
            raise UnsafeArchive(
                f"a tar header record of {self.size} bytes is over the {MAX_HEADER_BYTES} byte "
                "limit",
                self.name,
            )
        if self.type == tarfile.GNUTYPE_SPARSE:
            raise UnsafeArchive("sparse members are not allowed", self.name)
        # tarfile's private dispatch, which typeshed does not declare.
        member: tarfile.TarInfo = super()._proc_member(owner)  # type: ignore[misc]
        return member

    def _proc_gnusparse_10(self, *args: object) -> None:
        # A PAX-declared sparse map is read from the data blocks with no size bound.
        raise UnsafeArchive("sparse members are not allowed", self.name)


def _tar_members(archive: Path, root: Path, budget: _Budget) -> Iterator[str]:
    with tarfile.open(archive, mode="r:*", tarinfo=_BoundedTarInfo) as tar:
        for member in tar:  # streaming: a bomb is stopped before it is read to the end
            budget.member(member.name)
            rel = _relative(member.name)
            if member.issym() or member.islnk():
                raise UnsafeArchive("links are not allowed", member.name)
            if member.isdir():
                _mkdir(root / rel, member.name)
                continue
            if not member.isreg():
                raise UnsafeArchive("device files, FIFOs and other special entries are not allowed", member.name)  # fmt: skip
            src = tar.extractfile(member)
            if src is None:
                raise UnsafeArchive("unreadable entry", member.name)
            _copy(src, root / rel, budget, member.name)
            yield str(rel)


def _zip_members(archive: Path, root: Path, budget: _Budget) -> Iterator[str]:
    with zipfile.ZipFile(archive) as zf:
        for info in zf.infolist():
            budget.member(info.filename)
            rel = _relative(info.filename)
            kind = stat.S_IFMT(info.external_attr >> 16)  # 0 when the zip records no type
            if kind == stat.S_IFLNK:
                raise UnsafeArchive("links are not allowed", info.filename)
            if kind not in (0, stat.S_IFREG, stat.S_IFDIR):
                raise UnsafeArchive("special entries are not allowed", info.filename)
            if info.is_dir():
                _mkdir(root / rel, info.filename)
                continue
            with zf.open(info) as src:
                _copy(src, root / rel, budget, info.filename)
            yield str(rel)


def safe_extract(
    archive: Path,
    dest: Path,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_members: int = DEFAULT_MAX_MEMBERS,
    max_ratio: int = DEFAULT_MAX_RATIO,
) -> list[str]:
    """Extract ``archive`` into ``dest`` (which must not exist yet); returns the file paths."""
    dest = Path(dest)
    if dest.exists():
        raise FileExistsError(f"{dest} already exists; extract into a new folder")
    dest.parent.mkdir(parents=True, exist_ok=True)
    budget = _Budget(archive.stat().st_size, max_bytes, max_members, max_ratio)
    staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        if zipfile.is_zipfile(archive):
            files = list(_zip_members(archive, staging, budget))
        else:
            try:
                files = list(_tar_members(archive, staging, budget))
            except _READ_ERRORS as exc:  # gzip and bz2 report corrupt data as OSError
                raise UnsafeArchive(f"cannot read it as a tar or zip archive ({exc})") from exc
        os.replace(staging, dest)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return files
