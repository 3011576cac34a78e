"""The storage contract, run against both backends: a folder, and a real S3 HTTP API (moto's
server process). Writes stream and either land whole or leave the key as it was; reads stream
back the same bytes; transfer URLs work with the executor's own client."""

from __future__ import annotations

import hashlib
import itertools
from pathlib import Path

import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpu_worker import transfer as client
from jobs import storage
from jobs.storage import s3
from jobs.storage.base import sha256_b64

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("storage_backend")]

KEY = storage.bundle_key(7, "ftjob-store", 1)
OLD = b"the object that was there before"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def read(key: str = KEY) -> bytes:
    return b"".join(storage.read_chunks(key))


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    return [data[a:b] for a, b in itertools.pairwise(points)]


# One example takes a few ms locally and ~20 ms on moto; 30 examples cover both in seconds.
@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.binary(max_size=3000), cuts=st.lists(st.integers(min_value=0), max_size=8))
def test_any_contents_in_any_chunking_round_trip(data: bytes, cuts: list[int]) -> None:
    stored = storage.save_stream(KEY, split(data, cuts))
    assert (stored.size, stored.sha256) == (len(data), sha(data))
    assert storage.size(KEY) == len(data)
    assert read() == data
    assert read() == data  # a second read is the same bytes


def test_large_object_streams_in_parts_and_reads_back(storage_backend: str) -> None:
    # Over two S3 parts (8 MiB each) plus a tail: the multipart path, checksummed per part.
    block = bytes(range(256)) * 4096  # 1 MiB
    chunks = [block] * (2 * s3.PART_BYTES // len(block)) + [b"tail"]
    data_sha = hashlib.sha256(b"".join(chunks)).hexdigest()
    stored = storage.save_stream(KEY, iter(chunks), expected_sha256=data_sha)
    assert stored.size == 2 * s3.PART_BYTES + 4
    digest = hashlib.sha256()
    pieces = 0
    for chunk in storage.read_chunks(KEY):
        assert len(chunk) <= storage.CHUNK_BYTES  # memory stays flat on the way out
        digest.update(chunk)
        pieces += 1
    assert digest.hexdigest() == data_sha and pieces >= 16


@pytest.mark.parametrize("size", [100, 2 * s3.PART_BYTES + 1], ids=["single-put", "multipart"])
def test_refused_writes_leave_the_object_as_it_was(size: int) -> None:
    storage.save_stream(KEY, [OLD])
    body = [b"x" * (size - 1), b"y"]
    with pytest.raises(storage.TooLarge):
        storage.save_stream(KEY, iter(body), max_bytes=size - 1)
    assert read() == OLD
    with pytest.raises(storage.HashMismatch) as info:
        storage.save_stream(KEY, iter(body), expected_sha256=sha(b"other").upper())
    assert info.value.expected == sha(b"other")
    assert read() == OLD
    assert [o.key for o in storage.list_objects(storage.project_prefix(7))] == [KEY]


def test_a_failing_source_stores_nothing() -> None:
    def chunks():
        yield b"a" * (s3.PART_BYTES + 10)  # one part already sent on S3
        raise ConnectionError("client went away")

    storage.save_stream(KEY, [OLD])
    with pytest.raises(ConnectionError):
        storage.save_stream(KEY, chunks())
    assert read() == OLD


def test_missing_objects() -> None:
    missing = storage.checkpoint_key(7, "ftjob-none", 1)
    with pytest.raises(storage.ObjectMissing):
        read(missing)
    with pytest.raises(FileNotFoundError):  # ingest catches the builtin
        storage.size(missing)
    assert not storage.exists(missing)
    storage.delete(missing)  # deleting nothing is fine


def test_list_and_delete_prefix_stay_inside_the_prefix() -> None:
    job = storage.job_prefix(7, "ftjob-one")
    keys = [
        storage.bundle_key(7, "ftjob-one", 1),
        storage.bundle_key(7, "ftjob-one", 2),
        storage.checkpoint_key(7, "ftjob-one", 2),
    ]
    neighbours = [
        storage.checkpoint_key(7, "ftjob-one2", 1),
        storage.training_file_key(7, "file-a"),
    ]
    for i, key in enumerate(keys + neighbours):
        storage.save_stream(key, [b"x" * i])
    listed = {o.key: o.size for o in storage.list_objects(job)}
    assert listed == {key: i for i, key in enumerate(keys)}
    assert storage.delete_prefix(job) == 3
    assert list(storage.list_objects(job)) == []
    assert all(storage.exists(key) for key in neighbours)
    with pytest.raises(ValueError):
        storage.delete_prefix("projects/7")  # not a folder key: would match projects/70…


def test_keys_refuse_anything_but_generated_ids() -> None:
    for bad in ["../etc", "ftjob-a/../../b", "ftjob-", "FTJOB-x", "ftjob-a b"]:
        with pytest.raises(ValueError):
            storage.bundle_key(1, bad, 1)


# --- sealing ----------------------------------------------------------------------------------


def test_seal_moves_the_upload_where_no_url_writes_and_never_again() -> None:
    sealed = storage.sealed_key(KEY)
    storage.save_stream(KEY, [b"first upload"])

    assert storage.seal(KEY) == sealed
    assert read(sealed) == b"first upload"
    assert not storage.exists(KEY), "moved, not copied"
    assert storage.exists(storage.seal_marker_key(KEY))

    # A later PUT to the upload key (an S3 presigned URL cannot be revoked) is never promoted.
    storage.save_stream(KEY, [b"replayed upload"])
    assert storage.seal(KEY) == sealed
    assert read(sealed) == b"first upload"


def test_sealing_nothing_closes_the_upload_for_good() -> None:
    assert storage.seal(KEY) is None
    storage.save_stream(KEY, [b"late upload"])
    assert storage.seal(KEY) is None
    assert not storage.exists(storage.sealed_key(KEY))


def test_move_of_nothing_is_object_missing() -> None:
    with pytest.raises(storage.ObjectMissing):
        storage.backend().move(KEY, storage.sealed_key(KEY))


def test_sealed_keys_markers_and_files_never_get_a_put_url() -> None:
    for key in [
        storage.sealed_key(KEY),
        storage.seal_marker_key(KEY),
        storage.training_file_key(7, "file-a"),
        storage.job_prefix(7, "ftjob-store") + "a1/adapter.tar",  # where bundles used to live
    ]:
        assert not storage.is_upload_key(key)
        with pytest.raises(ValueError, match="upload key"):
            storage.transfer_url(key, "PUT", ttl_seconds=60, max_bytes=10)
        assert storage.transfer_url(key, "GET", ttl_seconds=60)  # reading is fine
    with pytest.raises(ValueError):
        storage.sealed_key(storage.sealed_key(KEY))


def test_transfer_urls_round_trip_with_the_executor_client(
    live_server, settings, tmp_path: Path
) -> None:
    settings.TRAINHUB_CONTROL_URL = live_server.url
    src = tmp_path / "adapter.tar"
    body = bytes(range(256)) * 5000
    src.write_bytes(body)
    put = storage.transfer_url(KEY, "PUT", ttl_seconds=60, max_bytes=storage.MAX_PUT_BYTES)
    assert client.upload(src, put, what="bundle", content_type="application/x-tar") == len(body)
    assert read() == body
    dest = tmp_path / "down.tar"
    get = storage.transfer_url(KEY, "GET", ttl_seconds=60)
    assert client.download(get, dest, sha256=sha(body), what="bundle") == len(body)
    assert dest.read_bytes() == body


def test_pinned_put_url_takes_exactly_its_bytes(live_server, settings, tmp_path: Path) -> None:
    settings.TRAINHUB_CONTROL_URL = live_server.url
    body = b"exactly these bytes"
    src = tmp_path / "f"
    src.write_bytes(body)
    url = storage.transfer_url(KEY, "PUT", ttl_seconds=60, size=len(body), sha256=sha(body))
    # S3 signed both headers into the URL, so the request must carry exactly these values.
    headers = {"x-amz-checksum-sha256": sha256_b64(sha(body))}
    resp = requests.put(url, data=body, headers=headers, timeout=10)
    assert resp.status_code in (200, 201), resp.text
    assert read() == body


@pytest.mark.parametrize(
    ("method", "extra"),
    [
        ("DELETE", {}),
        ("PUT", {}),  # a PUT without a size cap could fill the disk
        ("PUT", {"max_bytes": storage.MAX_PUT_BYTES + 1}),  # over one S3 PUT
        ("PUT", {"max_bytes": 10, "sha256": "not-hex"}),
        ("GET", {"max_bytes": 10}),
        ("GET", {"sha256": "0" * 64}),
    ],
)
def test_transfer_url_refuses_bad_arguments(method: str, extra: dict) -> None:
    with pytest.raises(ValueError):
        storage.transfer_url(KEY, method, ttl_seconds=60, **extra)
