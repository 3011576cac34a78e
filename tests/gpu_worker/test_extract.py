"""The safe extractor against crafted archives: slips, links, devices, bombs; and round trips."""

from __future__ import annotations

import gzip
import io
import stat
import tarfile
import zipfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpu_worker.extract import MAX_HEADER_BYTES, UnsafeArchive, safe_extract


def _tar(path: Path, *members: tuple[tarfile.TarInfo, bytes | None], mode: str = "w") -> Path:
    with tarfile.open(path, mode) as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def _info(name: str, kind: bytes = tarfile.REGTYPE, **attrs: object) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    for key, value in attrs.items():
        setattr(info, key, value)
    return info


def _zip(path: Path, *members: tuple[str | zipfile.ZipInfo, bytes]) -> Path:
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, data in members:
            zf.writestr(name, data)
    return path


BAD_TARS = {
    "slip": [(_info("../evil.txt"), b"x")],
    "deep slip": [(_info("a/b/../../../evil.txt"), b"x")],
    "absolute": [(_info("/var/evil.txt"), b"x")],
    "symlink out": [(_info("link", tarfile.SYMTYPE, linkname="/etc/passwd"), None)],
    "symlink in": [
        (_info("a.txt"), b"x"),
        (_info("link", tarfile.SYMTYPE, linkname="a.txt"), None),
    ],
    "hardlink": [(_info("a.txt"), b"x"), (_info("hard", tarfile.LNKTYPE, linkname="a.txt"), None)],
    "char device": [(_info("dev", tarfile.CHRTYPE, devmajor=1, devminor=3), None)],
    "block device": [(_info("blk", tarfile.BLKTYPE, devmajor=8, devminor=0), None)],
    "fifo": [(_info("pipe", tarfile.FIFOTYPE), None)],
    "twice": [(_info("a.txt"), b"first"), (_info("a.txt"), b"second")],
}


@pytest.mark.parametrize("case", sorted(BAD_TARS))
def test_a_crafted_tar_is_refused_and_leaves_nothing(case: str, tmp_path: Path) -> None:
    archive = _tar(tmp_path / "bad.tar", *BAD_TARS[case])
    with pytest.raises(UnsafeArchive):
        safe_extract(archive, tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.tar"]
    assert not (tmp_path.parent / "evil.txt").exists()


@pytest.mark.parametrize(
    "name", ["../evil.txt", "/abs/evil.txt", "C:/evil.txt", "a\\..\\..\\evil.txt"]
)
def test_a_zip_slip_is_refused(name: str, tmp_path: Path) -> None:
    archive = _zip(tmp_path / "bad.zip", ("ok.txt", b"fine"), (name, b"x"))
    with pytest.raises(UnsafeArchive, match=r"absolute|'\.\.'"):
        safe_extract(archive, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_zip_symlink_is_refused(tmp_path: Path) -> None:
    link = zipfile.ZipInfo("link")
    link.external_attr = (stat.S_IFLNK | 0o777) << 16
    archive = _zip(tmp_path / "bad.zip", (link, b"/etc/passwd"))
    with pytest.raises(UnsafeArchive, match="links"):
        safe_extract(archive, tmp_path / "out")


def test_a_gzip_bomb_is_stopped_while_it_expands(tmp_path: Path) -> None:
    zeros = b"\0" * (64 * 1024**2)  # 64 MiB that compress to ~64 KiB
    archive = _tar(tmp_path / "bomb.tar.gz", (_info("zeros.bin"), zeros), mode="w:gz")
    assert archive.stat().st_size < 1024**2
    with pytest.raises(UnsafeArchive, match="decompression bomb"):
        safe_extract(archive, tmp_path / "out", max_ratio=100)
    assert not (tmp_path / "out").exists()


def test_a_zip_bomb_is_stopped_on_bytes_written_not_on_its_header(tmp_path: Path) -> None:
    archive = _zip(tmp_path / "bomb.zip", ("zeros.bin", b"\0" * (32 * 1024**2)))
    with pytest.raises(UnsafeArchive, match="expands past"):
        safe_extract(archive, tmp_path / "out", max_bytes=1024**2)


def test_too_many_members_are_refused(tmp_path: Path) -> None:
    archive = _tar(tmp_path / "many.tar", *[(_info(f"f{i}"), b"") for i in range(20)])
    with pytest.raises(UnsafeArchive, match="more than 10 entries"):
        safe_extract(archive, tmp_path / "out", max_members=10)


def test_garbage_is_not_an_archive(tmp_path: Path) -> None:
    garbage = tmp_path / "x.tar.gz"
    garbage.write_bytes(gzip.compress(b"not a tar at all" * 100)[:60])
    with pytest.raises(UnsafeArchive, match="cannot read"):
        safe_extract(garbage, tmp_path / "out")


def test_an_existing_destination_is_never_overwritten(tmp_path: Path) -> None:
    archive = _tar(tmp_path / "ok.tar", (_info("a.txt"), b"x"))
    (tmp_path / "out").mkdir()
    with pytest.raises(FileExistsError):
        safe_extract(archive, tmp_path / "out")


_names = st.lists(
    st.text(alphabet="abcdefghij_-", min_size=1, max_size=8), min_size=1, max_size=3
).map("/".join)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    files=st.dictionaries(_names, st.binary(max_size=4096), min_size=1, max_size=8),
    kind=st.sampled_from(["tar", "tar.gz", "zip"]),
)
def test_a_good_archive_round_trips(files: dict[str, bytes], kind: str, tmp_path_factory) -> None:
    # A path may not be both a file and a folder (a/b and a/b/c).
    names = sorted(files)
    if any(b.startswith(a + "/") for a in names for b in names):
        return
    tmp = tmp_path_factory.mktemp("rt")
    if kind == "zip":
        archive = _zip(tmp / "a.zip", *files.items())
    else:
        mode = "w:gz" if kind == "tar.gz" else "w"
        archive = _tar(tmp / f"a.{kind}", *((_info(n), d) for n, d in files.items()), mode=mode)
    extracted = safe_extract(archive, tmp / "out")
    assert sorted(extracted) == names
    for name, data in files.items():
        assert (tmp / "out" / name).read_bytes() == data


def _header_only_tar(path: Path, kind: bytes, size: int, *, after: int = 0) -> Path:
    """A tar whose first member (after ``after`` plain files) is a header record of ``size``
    bytes: the record is a hole in a sparse file, so it costs no disk, only what reading costs."""
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for i in range(after):
            tar.addfile(_info(f"f{i}.txt", size=1), io.BytesIO(b"x"))
    data = path.read_bytes().rstrip(b"\0")
    head = _info("././@LongLink" if kind == tarfile.GNUTYPE_LONGNAME else "hdr", kind)
    head.size = size
    data = data + bytes(-len(data) % tarfile.BLOCKSIZE) + head.tobuf(format=tarfile.USTAR_FORMAT)
    with path.open("wb") as fh:
        fh.write(data)
        fh.truncate(len(data) + size + 2 * tarfile.BLOCKSIZE)
    return path


@pytest.mark.parametrize("kind", [tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.GNUTYPE_LONGNAME])
@pytest.mark.parametrize("after", [0, 2])  # first member, and later (where tarfile hides errors)
def test_a_huge_header_record_is_refused_before_it_is_read(
    kind: bytes, after: int, tmp_path: Path
) -> None:
    archive = _header_only_tar(tmp_path / "bomb.tar", kind, 256 << 20, after=after)
    with pytest.raises(UnsafeArchive, match=f"{256 << 20} bytes is over the {MAX_HEADER_BYTES}"):
        safe_extract(archive, tmp_path / "out")
    assert not (tmp_path / "out").exists() and [p.name for p in tmp_path.iterdir()] == ["bomb.tar"]


def test_a_sparse_member_is_refused(tmp_path: Path) -> None:
    archive = _tar(tmp_path / "sparse.tar", (_info("s.bin", tarfile.GNUTYPE_SPARSE), b""))
    with pytest.raises(UnsafeArchive, match="sparse"):
        safe_extract(archive, tmp_path / "out")
