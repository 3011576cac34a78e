"""The adapter bundle, checked and unpacked on the user's machine without trusting it.

The format (trainhub_contract.bundle, shared with the executor and the control plane): an
uncompressed tar whose first member is ``manifest.json`` =
``{"format": 1, "files": [{"path", "size", "sha256"}, ...]}``.
Every other member must be a regular file listed there, once, with that size and SHA-256;
absolute paths, ``..``, links, devices and anything unlisted are refused, naming the member.
Files are written into a temporary folder beside the destination that is renamed into place
only when everything matched, so a refused bundle leaves nothing behind.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tarfile
import tempfile
from pathlib import Path, PurePosixPath

from trainhub_cli.errors import CliError, ExitCode
from trainhub_contract import bundle
from trainhub_contract.bundle import (
    MANIFEST,
    MAX_MANIFEST_BYTES,
    BundleError,
    BundleFile,
    member_path,
)

CHUNK = 1 << 20


def refuse(message: str, member: str | None = None) -> CliError:
    text = f"{member}: {message}" if member else message
    return CliError(f"unsafe or damaged bundle: {text}", ExitCode.INTEGRITY, param=member)


def safe_relative(name: str) -> PurePosixPath:
    """The member's path inside the destination, or a refusal (the contract's rule)."""
    path = member_path(name)
    if path is None:
        raise refuse(
            "an empty name, a backslash or NUL, an absolute path or one that climbs out of the "
            "folder (..)",
            name or "(empty)",
        )
    return path


def parse_manifest(raw: bytes) -> dict[str, BundleFile]:
    try:
        return bundle.parse_manifest(raw)
    except BundleError as exc:
        raise refuse(exc.message, exc.member) from None


def _write_member(tar: tarfile.TarFile, member: tarfile.TarInfo, target: Path) -> str:
    source = tar.extractfile(member)
    if source is None:
        raise refuse("unreadable", member.name)
    digest = hashlib.sha256()
    # O_EXCL | O_NOFOLLOW: never through a link, never over a file written before.
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    with source, os.fdopen(os.open(target, flags, 0o644), "wb") as out:
        while chunk := source.read(CHUNK):
            digest.update(chunk)
            out.write(chunk)
    return digest.hexdigest()


def extract_bundle(bundle: Path, dest: Path) -> list[BundleFile]:
    """Verify ``bundle`` against its manifest while unpacking it into ``dest`` (which must not
    exist yet). Raises a CliError (exit 6) naming the first offending member."""
    if dest.exists():
        raise CliError(
            f"{dest} already exists: remove it or download into another folder.",
            ExitCode.USAGE,
            param="DIR",
        )
    dest.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        files = _extract_into(bundle, work)
        work.rename(dest)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return files


def _extract_into(bundle: Path, work: Path) -> list[BundleFile]:
    try:
        tar = tarfile.open(bundle, mode="r:")  # noqa: SIM115 - closed by the `with` below
    except (tarfile.TarError, OSError) as exc:
        raise refuse(f"not an uncompressed tar archive ({exc})") from None
    with tar:
        try:
            first = tar.next()
            if first is None or first.name != MANIFEST or not first.isreg():
                raise refuse("the first member is not manifest.json", first.name if first else None)
            if first.size > MAX_MANIFEST_BYTES:
                raise refuse(f"over {MAX_MANIFEST_BYTES} bytes", MANIFEST)
            handle = tar.extractfile(first)
            raw = handle.read() if handle else b""
            manifest = parse_manifest(raw)
            (work / MANIFEST).write_bytes(raw)
            seen: set[str] = set()
            while (member := tar.next()) is not None:
                rel = str(safe_relative(member.name))
                if not member.isreg():
                    kind = "a link" if member.issym() or member.islnk() else "not a regular file"
                    raise refuse(f"{kind}: bundles hold regular files only", member.name)
                entry = manifest.get(rel)
                if entry is None:
                    raise refuse("not listed in manifest.json", member.name)
                if rel in seen:
                    raise refuse("appears twice in the archive", member.name)
                if member.size != entry.size:
                    raise refuse(
                        f"{member.size} bytes, the manifest says {entry.size}", member.name
                    )
                target = work.joinpath(*PurePosixPath(rel).parts)
                if not target.resolve().is_relative_to(work.resolve()):
                    raise refuse("would be written outside the folder", member.name)
                target.parent.mkdir(parents=True, exist_ok=True)
                digest = _write_member(tar, member, target)
                if digest != entry.sha256:
                    raise refuse(
                        f"sha256 {digest} differs from the manifest's {entry.sha256}", member.name
                    )
                seen.add(rel)
        except (tarfile.TarError, EOFError) as exc:
            raise refuse(f"the archive is unreadable or truncated ({exc})") from None
    missing = sorted(set(manifest) - seen)
    if missing:
        raise refuse("listed in manifest.json but missing from the archive", missing[0])
    return list(manifest.values())
