import hashlib
import io
import itertools
import tarfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainhub_contract.bundle import (
    MANIFEST,
    MAX_HEADER_BYTES,
    BundleError,
    verify_bundle,
    write_bundle,
)


def _bundle(tmp: Path, files: dict[str, bytes]) -> bytes:
    for name, content in files.items():
        (tmp / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp / name).write_bytes(content)
    out = io.BytesIO()
    write_bundle(tmp, out)
    return out.getvalue()


def _chunks(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    return [data[a:b] for a, b in itertools.pairwise(points)]


def test_manifest_comes_first_and_lists_every_file(tmp_path: Path) -> None:
    data = _bundle(
        tmp_path, {"adapter_model.safetensors": b"w" * 5000, "cfg/adapter_config.json": b"{}"}
    )
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        names = tar.getnames()
    assert names[0] == MANIFEST
    assert sorted(names[1:]) == ["adapter_model.safetensors", "cfg/adapter_config.json"]
    verified = verify_bundle([data])
    assert verified.sha256 == hashlib.sha256(data).hexdigest()
    assert verified.size == len(data)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    contents=st.lists(st.binary(min_size=0, max_size=4096), min_size=1, max_size=4),
    cuts=st.lists(st.integers(min_value=0, max_value=1 << 20), max_size=12),
    flip=st.integers(min_value=0),
)
def test_any_chunking_verifies_and_any_flipped_content_byte_is_caught(
    tmp_path_factory: pytest.TempPathFactory, contents: list[bytes], cuts: list[int], flip: int
) -> None:
    tmp = tmp_path_factory.mktemp("b")
    data = _bundle(tmp, {f"f{i}.bin": c for i, c in enumerate(contents)})
    assert verify_bundle(_chunks(data, cuts)).sha256 == hashlib.sha256(data).hexdigest()

    # Flip one byte inside some member's content: the member's hash must catch it.
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        spans = [(m.offset_data, m.size) for m in tar.getmembers()[1:] if m.size]
    if not spans:
        return
    offset, size = spans[flip % len(spans)]
    corrupted = bytearray(data)
    corrupted[offset + (flip // len(spans)) % size] ^= 0x01
    with pytest.raises(BundleError):
        verify_bundle(_chunks(bytes(corrupted), cuts))


def test_unlisted_member_missing_member_and_traversal_are_refused(tmp_path: Path) -> None:
    data = _bundle(tmp_path, {"a.bin": b"a"})
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        manifest = tar.extractfile(MANIFEST).read()  # type: ignore[union-attr]

    def rebuild(members: list[tuple[str, bytes]]) -> bytes:
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w") as tar:
            for name, body in members:
                info = tarfile.TarInfo(name)
                info.size = len(body)
                tar.addfile(info, io.BytesIO(body))
        return out.getvalue()

    with pytest.raises(BundleError, match="not in the manifest") as extra:
        verify_bundle([rebuild([(MANIFEST, manifest), ("a.bin", b"a"), ("b.bin", b"b")])])
    assert extra.value.member == "b.bin"
    with pytest.raises(BundleError, match="not in the bundle"):
        verify_bundle([rebuild([(MANIFEST, manifest)])])
    with pytest.raises(BundleError, match="safe name"):
        verify_bundle([rebuild([(MANIFEST, manifest), ("../a.bin", b"a")])])
    with pytest.raises(BundleError, match="first member"):
        verify_bundle([rebuild([("a.bin", b"a"), (MANIFEST, manifest)])])
    with pytest.raises(BundleError):
        verify_bundle([b"this is not a tar file at all" * 40])


def _header(name: str, kind: bytes, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.type, info.size = kind, size
    return info.tobuf(format=tarfile.USTAR_FORMAT)


@pytest.mark.parametrize("kind", [tarfile.XHDTYPE, tarfile.XGLTYPE])
def test_a_pax_header_over_the_cap_is_refused_unread(kind: bytes) -> None:
    """Only the header block is sent: had the record been read, the stream would end first
    ("truncated"); the refusal names the size and the limit."""
    with pytest.raises(BundleError) as exc:
        verify_bundle([_header("././@PaxHeader", kind, MAX_HEADER_BYTES + 1)])
    assert "PAX header" in exc.value.message and str(MAX_HEADER_BYTES) in exc.value.message


def test_a_long_member_name_still_verifies(tmp_path: Path) -> None:
    """write_bundle puts names over 100 characters in a PAX header: well under the cap."""
    data = _bundle(tmp_path, {"d" * 150 + "/adapter_model.safetensors": b"w" * 100})
    assert len(verify_bundle([data]).files) == 1


@pytest.mark.parametrize("size", ["12abc", "-5", ""])
def test_a_pax_size_that_is_not_a_size_is_refused(size: str) -> None:
    record = f"size={size}\n"
    record = f"{len(record) + len(str(len(record))) + 1} {record}".encode()
    header = _header("././@PaxHeader", tarfile.XHDTYPE, len(record))
    body = record + bytes(-len(record) % tarfile.BLOCKSIZE)
    with pytest.raises(BundleError, match="invalid size"):
        verify_bundle([header + body + _header(MANIFEST, tarfile.REGTYPE, 0) + bytes(1024)])


def test_a_member_twice_is_refused(tmp_path: Path) -> None:
    """A repeated member would be hashed and listed again and again: refused at the second."""
    data = _bundle(tmp_path, {"a.bin": b"a" * 10})
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        member = tar.getmembers()[1]
    end = member.offset_data + tarfile.BLOCKSIZE  # its header and its one data block
    doubled = data[:end] + data[member.offset : end] + data[end:]
    with pytest.raises(BundleError, match="appears twice"):
        verify_bundle([doubled])
