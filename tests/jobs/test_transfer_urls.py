"""Signed transfer URLs, mostly over real HTTP: the executor's own client against live_server.

The view never touches the database, but live_server needs database access for its thread.
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import socket
import time
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
import requests

from gpu_worker import transfer as client
from gpu_worker.errors import ExecutorError
from jobs import storage
from jobs.storage import transfer

pytestmark = pytest.mark.django_db

KEY = storage.bundle_key(1, "ftjob-abc", 1)
BODY = bytes(range(256)) * 10_000 + b"tail"  # ~2.5 MB: several 1 MiB chunks each way
OLD = b"the object that was there before"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def base(live_server, settings) -> str:
    settings.TRAINHUB_CONTROL_URL = live_server.url + "/"  # the trailing slash is dropped
    return live_server.url


@pytest.fixture
def stored() -> bytes:
    storage.save_stream(KEY, [BODY])
    return BODY


@pytest.fixture
def old_object() -> bytes:
    storage.save_stream(KEY, [OLD])
    return OLD


def get_url(ttl: int = 60) -> str:
    return storage.transfer_url(KEY, "GET", ttl_seconds=ttl)


def put_url(*, max_bytes: int = 10 * len(BODY), sha256: str | None = None, ttl: int = 60) -> str:
    return storage.transfer_url(KEY, "PUT", ttl_seconds=ttl, max_bytes=max_bytes, sha256=sha256)


def error_code(resp: requests.Response) -> str:
    return resp.json()["error"]["code"]


def current() -> bytes:
    return b"".join(storage.read_chunks(KEY))


def no_temp_files() -> bool:
    folder = storage.backend().path(KEY).parent
    return not any(p.name.startswith(".upload-") for p in folder.iterdir())


# --- issuing ----------------------------------------------------------------------------------


def _request_target(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.path}?{parts.query}"


def test_url_shape(base: str) -> None:
    url = put_url(sha256=sha(BODY).upper())
    assert url.startswith(f"{base}/transfer/?t=")
    token = parse_qs(urlsplit(url).query)["t"][0]
    # The executor strips query strings from every message, so the token never reaches a log.
    assert token not in client.redact(url)
    assert transfer.signing.loads(token, salt=transfer.SALT)["sha256"] == sha(BODY)


@pytest.mark.parametrize(
    ("method", "extra"),
    [
        ("DELETE", {}),
        ("PUT", {}),  # a PUT without a size cap could fill the disk
        ("PUT", {"max_bytes": 10, "sha256": "not-hex"}),
        ("GET", {"max_bytes": 10}),
    ],
)
def test_transfer_url_refuses_bad_arguments(method: str, extra: dict) -> None:
    with pytest.raises(ValueError):
        storage.transfer_url(KEY, method, ttl_seconds=60, **extra)


# --- the round trip through the executor's client ---------------------------------------------


def test_upload_then_download_round_trip(base: str, tmp_path: Path) -> None:
    src = tmp_path / "adapter.tar"
    src.write_bytes(BODY)

    size = client.upload(
        src, put_url(sha256=sha(BODY)), what="bundle", content_type="application/x-tar"
    )
    assert size == len(BODY)
    assert current() == BODY

    dest = tmp_path / "down" / "adapter.tar"
    assert client.download(get_url(), dest, sha256=sha(BODY), what="bundle") == len(BODY)
    assert dest.read_bytes() == BODY


def test_put_answers_size_and_sha256(base: str) -> None:
    resp = requests.put(put_url(), data=BODY, timeout=10)
    assert resp.status_code == 201
    assert resp.json() == {"size": len(BODY), "sha256": sha(BODY)}


def test_get_headers(base: str, stored: bytes) -> None:
    resp = requests.get(get_url(), timeout=10)
    assert resp.status_code == 200
    assert resp.content == stored
    assert resp.headers["Content-Length"] == str(len(stored))
    assert resp.headers["Accept-Ranges"] == "bytes"
    assert resp.headers["Content-Type"] == "application/octet-stream"


# --- refusals ---------------------------------------------------------------------------------


def test_expired_url_is_refused(base: str, stored: bytes, tmp_path: Path) -> None:
    url = get_url(ttl=-1)
    resp = requests.get(url, timeout=10)
    assert resp.status_code == 403
    assert error_code(resp) == "transfer_expired"
    assert "expired" in resp.json()["error"]["message"]

    with pytest.raises(ExecutorError, match=r"HTTP 403.*expired"):
        client.download(url, tmp_path / "x", what="bundle", attempts=1)


def test_expired_put_leaves_the_object(base: str, old_object: bytes) -> None:
    resp = requests.put(put_url(ttl=-1), data=BODY, timeout=10)
    assert (resp.status_code, error_code(resp)) == (403, "transfer_expired")
    assert current() == old_object


def test_tampered_token_is_refused(base: str, stored: bytes) -> None:
    url = get_url()
    i = url.index("?t=") + len("?t=") + 5
    flipped = url[:i] + ("A" if url[i] != "A" else "B") + url[i + 1 :]
    resp = requests.get(flipped, timeout=10)
    assert (resp.status_code, error_code(resp)) == (403, "transfer_forbidden")


def test_token_from_another_secret_is_refused(base: str, stored: bytes, settings) -> None:
    url = get_url()
    settings.SECRET_KEY = "another-secret-key-" * 3
    resp = requests.get(url, timeout=10)
    assert (resp.status_code, error_code(resp)) == (403, "transfer_forbidden")


def test_get_url_cannot_put(base: str, old_object: bytes, tmp_path: Path) -> None:
    src = tmp_path / "evil"
    src.write_bytes(b"overwrite")
    with pytest.raises(ExecutorError, match="HTTP 403"):
        client.upload(src, get_url(), what="bundle", attempts=1)
    assert current() == old_object


def test_put_url_cannot_get(base: str, stored: bytes) -> None:
    resp = requests.get(put_url(), timeout=10)
    assert (resp.status_code, error_code(resp)) == (403, "transfer_forbidden")


@pytest.mark.parametrize("method", ["POST", "DELETE", "PATCH", "HEAD"])
def test_other_methods_are_not_allowed(base: str, stored: bytes, method: str) -> None:
    resp = requests.request(method, get_url(), timeout=10)
    assert resp.status_code == 405
    assert resp.headers["Allow"] == "GET, PUT"
    assert storage.exists(KEY)


def test_missing_object_is_404(base: str, tmp_path: Path) -> None:
    resp = requests.get(get_url(), timeout=10)
    assert (resp.status_code, error_code(resp)) == (404, "not_found")
    with pytest.raises(ExecutorError, match="HTTP 404"):
        client.download(get_url(), tmp_path / "x", what="bundle", attempts=1)


def test_error_messages_never_quote_the_token(base: str, old_object: bytes) -> None:
    capped = put_url(max_bytes=4, sha256=sha(b"nope"))
    cases = [
        ("GET", get_url(ttl=-1), None),
        ("PUT", get_url(), b"x"),
        ("PUT", capped, b"xxxxxxxx"),
        ("PUT", capped, b"xxx"),
        ("DELETE", capped, None),
    ]
    for method, url, data in cases:
        resp = requests.request(method, url, data=data, timeout=10)
        assert resp.status_code >= 400
        assert url.rsplit("/", 1)[1] not in resp.text
        assert set(resp.json()["error"]) >= {"message", "type", "code"}


# --- failed uploads leave the object as it was ------------------------------------------------


def test_put_over_max_bytes_is_413(base: str, old_object: bytes, tmp_path: Path) -> None:
    src = tmp_path / "big"
    src.write_bytes(BODY)
    url = put_url(max_bytes=len(BODY) - 1)
    resp = requests.put(url, data=BODY, timeout=10)
    assert (resp.status_code, error_code(resp)) == (413, "too_large")
    with pytest.raises(ExecutorError, match="HTTP 413"):
        client.upload(src, url, what="bundle", attempts=1)
    assert current() == old_object
    assert no_temp_files()


def test_oversized_content_length_is_refused_before_the_body(base: str, old_object: bytes) -> None:
    # Announce 10 GB and send nothing: the answer must come without waiting for the body.
    host = urlsplit(base)
    conn = http.client.HTTPConnection(host.hostname, host.port, timeout=10)
    conn.putrequest("PUT", _request_target(put_url(max_bytes=1000)))
    conn.putheader("Content-Length", str(10 * 1024**3))
    conn.endheaders()
    resp = conn.getresponse()
    assert resp.status == 413
    conn.close()
    assert current() == old_object


def test_truncated_body_is_not_stored(base: str, old_object: bytes) -> None:
    # The client dies mid-upload: the server sees EOF before Content-Length bytes.
    host = urlsplit(base)
    conn = http.client.HTTPConnection(host.hostname, host.port, timeout=10)
    conn.putrequest("PUT", _request_target(put_url()))
    conn.putheader("Content-Length", "1000")
    conn.endheaders(b"only ten b")
    assert conn.sock is not None
    conn.sock.shutdown(socket.SHUT_WR)
    resp = conn.getresponse()
    assert resp.status == 400
    assert b"incomplete_body" in resp.read()
    conn.close()
    assert current() == old_object
    assert no_temp_files()


def test_put_without_content_length_is_411(base: str, old_object: bytes) -> None:
    resp = requests.put(put_url(), data=iter([b"chunked", b"body"]), timeout=10)
    assert (resp.status_code, error_code(resp)) == (411, "length_required")
    assert current() == old_object


def test_wrong_sha256_is_400(base: str, old_object: bytes, tmp_path: Path) -> None:
    wrong = sha(b"something else")
    resp = requests.put(put_url(sha256=wrong), data=BODY, timeout=10)
    assert (resp.status_code, error_code(resp)) == (400, "checksum_mismatch")
    message = resp.json()["error"]["message"]
    assert wrong in message and sha(BODY) in message
    assert current() == old_object
    assert no_temp_files()


def test_save_stream_hash_mismatch_keeps_the_object(old_object: bytes) -> None:
    with pytest.raises(storage.HashMismatch) as info:
        storage.save_stream(KEY, [b"new"], expected_sha256=sha(b"other").upper())
    assert (info.value.expected, info.value.actual) == (sha(b"other"), sha(b"new"))
    assert current() == old_object
    assert no_temp_files()
    assert storage.save_stream(KEY, [b"new"], expected_sha256=sha(b"new")).size == 3


# --- ranges -----------------------------------------------------------------------------------


def ranged(url: str, spec: str) -> requests.Response:
    return requests.get(url, headers={"Range": f"bytes={spec}"}, timeout=10)


def test_ranges_reassemble_the_object(base: str, stored: bytes) -> None:
    url, size = get_url(), len(stored)
    head = ranged(url, "0-99")
    middle = ranged(url, f"100-{size - 1001}")
    tail = ranged(url, "-1000")
    for resp in (head, middle, tail):
        assert resp.status_code == 206
        assert resp.headers["Content-Length"] == str(len(resp.content))
    assert head.headers["Content-Range"] == f"bytes 0-99/{size}"
    assert tail.headers["Content-Range"] == f"bytes {size - 1000}-{size - 1}/{size}"
    assert head.content + middle.content + tail.content == stored


def test_open_ended_range_resumes_a_download(base: str, stored: bytes) -> None:
    resp = ranged(get_url(), "1048577-")
    assert resp.status_code == 206
    assert resp.headers["Content-Range"] == f"bytes 1048577-{len(stored) - 1}/{len(stored)}"
    assert stored[:1048577] + resp.content == stored


@pytest.mark.parametrize(
    ("spec", "first", "last"),
    [("0-0", 0, 0), ("10-999999999", 10, None), ("-999999999", 0, None)],
)
def test_ranges_clamp_to_the_object(
    base: str, stored: bytes, spec: str, first: int, last: int | None
) -> None:
    last = len(stored) - 1 if last is None else last
    resp = ranged(get_url(), spec)
    assert resp.status_code == 206
    assert resp.content == stored[first : last + 1]


@pytest.mark.parametrize("spec", [f"{len(BODY)}-", f"{len(BODY) + 5}-{len(BODY) + 9}", "-0"])
def test_unsatisfiable_range_is_416(base: str, stored: bytes, spec: str) -> None:
    resp = ranged(get_url(), spec)
    assert (resp.status_code, error_code(resp)) == (416, "range_not_satisfiable")
    assert resp.headers["Content-Range"] == f"bytes */{len(stored)}"


@pytest.mark.parametrize(
    "spec",
    ["0-1,5-6", "9-3", "abc", "-", "", "1-2-3", "0x10-", "9" * 5000 + "-", "0-" + "9" * 20],
    ids=["multi", "reversed", "words", "dash", "empty", "three", "hex", "5000-digits", "20-digits"],
)
def test_malformed_and_absurd_ranges_are_a_clear_416(base: str, stored: bytes, spec: str) -> None:
    resp = ranged(get_url(), spec)
    assert (resp.status_code, error_code(resp)) == (416, "invalid_range")
    assert "bytes=FIRST-LAST" in resp.json()["error"]["message"]
    assert resp.headers["Content-Range"] == f"bytes */{len(stored)}"


@pytest.mark.parametrize("header", ["items=0-5", "none", "BYTES=0-0"])
def test_other_range_units_are_ignored_and_the_unit_is_case_blind(
    base: str, stored: bytes, header: str
) -> None:
    resp = requests.get(get_url(), headers={"Range": header}, timeout=10)
    if header.startswith("BYTES"):
        assert (resp.status_code, resp.content) == (206, stored[:1])
    else:  # RFC 9110: a range unit the server does not know is ignored
        assert (resp.status_code, resp.content) == (200, stored)


# --- Content-MD5 and pinned sizes, as S3 checks them ------------------------------------------


def md5_b64(data: bytes) -> str:
    return base64.b64encode(hashlib.md5(data, usedforsecurity=False).digest()).decode()


def test_content_md5_is_checked(base: str, old_object: bytes) -> None:
    resp = requests.put(put_url(), data=BODY, headers={"Content-MD5": md5_b64(BODY)}, timeout=10)
    assert resp.status_code == 201
    assert current() == BODY


def test_a_body_damaged_in_transit_is_refused_and_nothing_stored(
    base: str, old_object: bytes
) -> None:
    damaged = BODY[:-1] + b"X"
    resp = requests.put(put_url(), data=damaged, headers={"Content-MD5": md5_b64(BODY)}, timeout=10)
    assert (resp.status_code, error_code(resp)) == (400, "bad_digest")
    assert "damaged in transit" in resp.json()["error"]["message"]
    assert current() == old_object
    assert no_temp_files()


@pytest.mark.parametrize("header", ["not base64!", base64.b64encode(b"short").decode(), ""])
def test_a_malformed_content_md5_is_400(base: str, old_object: bytes, header: str) -> None:
    resp = requests.put(put_url(), data=BODY, headers={"Content-MD5": header}, timeout=10)
    assert (resp.status_code, error_code(resp)) == (400, "invalid_digest")
    assert current() == old_object


def test_a_size_pinned_url_takes_only_that_length(base: str, old_object: bytes) -> None:
    url = storage.transfer_url(KEY, "PUT", ttl_seconds=60, size=len(BODY))
    resp = requests.put(url, data=BODY + b"!", timeout=10)
    assert (resp.status_code, error_code(resp)) == (400, "size_mismatch")
    assert str(len(BODY)) in resp.json()["error"]["message"]
    assert current() == old_object
    assert requests.put(url, data=BODY, timeout=10).status_code == 201


# --- sealed uploads ---------------------------------------------------------------------------


def test_a_put_after_the_seal_is_409_and_stores_nothing(base: str) -> None:
    url = put_url()
    assert requests.put(url, data=b"first", timeout=10).status_code == 201
    sealed = storage.seal(KEY)
    assert sealed is not None

    resp = requests.put(url, data=BODY, timeout=10)

    assert (resp.status_code, error_code(resp)) == (409, "upload_closed")
    assert not storage.exists(KEY)
    assert b"".join(storage.read_chunks(sealed)) == b"first"


def test_an_upload_sealed_while_it_streams_is_dropped(base: str) -> None:
    """The seal lands after the route's first check, while the body streams: the body is read,
    then refused instead of renamed into place."""
    url = put_url()
    folder = storage.backend().path(KEY).parent

    def body():
        yield BODY[:100]
        deadline = time.monotonic() + 10
        # The route checked the seal and opened its temp file: now seal, mid-body.
        while not any(p.name.startswith(".upload-") for p in folder.glob(".*")):
            assert time.monotonic() < deadline, "the upload never started"
            time.sleep(0.01)
        storage.seal(KEY)
        yield BODY[100:]

    resp = requests.put(url, data=body(), headers={"Content-Length": str(len(BODY))}, timeout=10)
    assert (resp.status_code, error_code(resp)) == (409, "upload_closed")
    assert not storage.exists(KEY) and not storage.exists(storage.sealed_key(KEY))
    assert no_temp_files()


def test_a_put_grant_for_anything_but_an_upload_key_is_refused(base: str, settings) -> None:
    """A token signed for another key (one issued before uploads moved to upload keys, or a
    bug) cannot write there: what ingest verified lives at such keys."""
    from jobs.storage import grants
    from jobs.storage.base import Transfer

    target = storage.sealed_key(KEY)
    storage.save_stream(target, [OLD])
    token_url = grants.sign(Transfer(key=target, method="PUT", ttl_seconds=60, max_bytes=100))
    resp = requests.put(token_url, data=b"replacement", timeout=10)
    assert (resp.status_code, error_code(resp)) == (403, "transfer_forbidden")
    assert b"".join(storage.read_chunks(target)) == OLD


def test_transfer_route_is_closed_when_storage_is_s3(base: str, stored: bytes, settings) -> None:
    url = get_url()
    settings.TRAINHUB_STORAGE = "s3"
    settings.TRAINHUB_S3_BUCKET = "unused"
    resp = requests.get(url, timeout=10)
    assert (resp.status_code, error_code(resp)) == (404, "not_found")
