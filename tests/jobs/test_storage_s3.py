"""S3 presigned URLs carry the right signed parameters.

moto does not check presigned signatures, expiry or checksums, so these tests check what S3
would: a SigV4 verifier written from AWS's published algorithm recomputes each URL's signature
over the request a client would send. A pinned PUT verifies only with the exact content-length
and x-amz-checksum-sha256 it was issued for; the expiry is the one asked for (at most 7 days).
"""

from __future__ import annotations

import hashlib
import hmac
from datetime import UTC, datetime, timedelta
from urllib.parse import parse_qsl, quote, urlsplit

import pytest
import requests
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from jobs import storage
from jobs.storage.base import sha256_b64

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("s3_storage")]

SECRET = "trainhub-test-secret"  # tests/conftest.py: s3_endpoint
KEY = storage.bundle_key(3, "ftjob-presign", 2)
BODY = b"adapter bytes" * 100


def _hmac(key: bytes, msg: str) -> bytes:
    return hmac.new(key, msg.encode(), hashlib.sha256).digest()


def sigv4_valid(url: str, method: str, headers: dict[str, str], *, now: datetime) -> bool:
    """Would S3 accept ``method url`` with ``headers`` at ``now``? (AWS SigV4, query auth.)"""
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    signature = query.pop("X-Amz-Signature")
    signed = query["X-Amz-SignedHeaders"].split(";")
    sent = {k.lower(): v.strip() for k, v in {**headers, "host": parts.netloc}.items()}
    if any(name not in sent for name in signed):
        return False
    # S3 refuses x-amz-* headers that the URL did not sign.
    if any(k.startswith("x-amz-") and k not in signed for k in sent):
        return False
    issued = datetime.strptime(query["X-Amz-Date"], "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
    if now > issued + timedelta(seconds=int(query["X-Amz-Expires"])):
        return False
    canonical_query = "&".join(
        f"{quote(k, safe='-_.~')}={quote(v, safe='-_.~')}" for k, v in sorted(query.items())
    )
    canonical = "\n".join(
        [
            method,
            quote(parts.path, safe="/-_.~"),
            canonical_query,
            "".join(f"{name}:{sent[name]}\n" for name in signed),
            ";".join(signed),
            "UNSIGNED-PAYLOAD",
        ]
    )
    day, region, service, _ = query["X-Amz-Credential"].split("/")[1:]
    scope = f"{day}/{region}/{service}/aws4_request"
    to_sign = "\n".join(
        [
            "AWS4-HMAC-SHA256",
            query["X-Amz-Date"],
            scope,
            hashlib.sha256(canonical.encode()).hexdigest(),
        ]
    )
    key = _hmac(_hmac(_hmac(_hmac(f"AWS4{SECRET}".encode(), day), region), service), "aws4_request")
    return hmac.compare_digest(
        signature, hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    )


def params(url: str) -> dict[str, str]:
    return dict(parse_qsl(urlsplit(url).query))


def test_get_url_is_scoped_to_one_object_and_expires(settings) -> None:
    url = storage.transfer_url(KEY, "GET", ttl_seconds=3600)
    now = datetime.now(UTC)
    assert urlsplit(url).path == f"/{settings.TRAINHUB_S3_BUCKET}/{KEY}"
    assert params(url)["X-Amz-Expires"] == "3600"
    assert params(url)["X-Amz-SignedHeaders"] == "host"
    assert SECRET not in url
    assert sigv4_valid(url, "GET", {}, now=now)
    assert not sigv4_valid(url, "PUT", {}, now=now), "a GET URL cannot write"
    assert not sigv4_valid(
        url.replace("a2/upload/adapter", "a1/upload/adapter"), "GET", {}, now=now
    )
    assert not sigv4_valid(url, "GET", {}, now=now + timedelta(seconds=3601)), "expired"


def test_ttl_is_capped_at_seven_days() -> None:
    url = storage.transfer_url(KEY, "GET", ttl_seconds=30 * 24 * 3600)
    assert params(url)["X-Amz-Expires"] == str(7 * 24 * 3600)


def test_pinned_put_signs_length_and_checksum() -> None:
    sha = hashlib.sha256(BODY).hexdigest()
    url = storage.transfer_url(KEY, "PUT", ttl_seconds=600, size=len(BODY), sha256=sha)
    assert params(url)["X-Amz-SignedHeaders"] == "content-length;host;x-amz-checksum-sha256"
    good = {"Content-Length": str(len(BODY)), "x-amz-checksum-sha256": sha256_b64(sha)}
    now = datetime.now(UTC)
    assert sigv4_valid(url, "PUT", good, now=now)
    other = hashlib.sha256(b"other").hexdigest()
    assert not sigv4_valid(
        url, "PUT", {**good, "x-amz-checksum-sha256": sha256_b64(other)}, now=now
    )
    assert not sigv4_valid(url, "PUT", {**good, "Content-Length": str(len(BODY) + 1)}, now=now)
    assert not sigv4_valid(url, "PUT", {"Content-Length": str(len(BODY))}, now=now)
    # And the wire protocol accepts the request as signed:
    assert requests.put(url, data=BODY, headers=good, timeout=10).status_code == 200
    assert b"".join(storage.read_chunks(KEY)) == BODY


def test_capped_put_signs_no_body_headers_so_content_md5_may_ride_along() -> None:
    # Issued before the bytes exist (an attempt's adapter): nothing body-specific is signed,
    # S3 caps one PUT at 5 GiB, and the executor's unsigned Content-MD5 is allowed and checked.
    url = storage.transfer_url(KEY, "PUT", ttl_seconds=600, max_bytes=storage.MAX_PUT_BYTES)
    assert params(url)["X-Amz-SignedHeaders"] == "host"
    headers = {"Content-Length": str(len(BODY)), "Content-MD5": "bm90IGNoZWNrZWQgaGVyZQ=="}
    assert sigv4_valid(url, "PUT", headers, now=datetime.now(UTC))
    # An x-amz-checksum header the URL did not sign is refused by S3, which is why the
    # executor sends Content-MD5 instead.
    assert not sigv4_valid(
        url, "PUT", {**headers, "x-amz-checksum-sha256": "x"}, now=datetime.now(UTC)
    )


def test_download_url_names_the_file_and_is_short_lived(settings) -> None:
    url = storage.backend().download_url(KEY, filename="ftjob-presign-adapter.tar", ttl_seconds=900)
    assert url is not None
    assert params(url)["X-Amz-Expires"] == "900"
    assert params(url)["response-content-disposition"] == (
        'attachment; filename="ftjob-presign-adapter.tar"'
    )
    assert sigv4_valid(url, "GET", {}, now=datetime.now(UTC))


def test_misconfiguration_is_named() -> None:
    bucketless = override_settings(TRAINHUB_S3_BUCKET="")
    with bucketless, pytest.raises(ImproperlyConfigured, match="TRAINHUB_S3_BUCKET"):
        storage.backend()
    with (
        override_settings(TRAINHUB_STORAGE="gcs"),
        pytest.raises(ImproperlyConfigured, match="'local' or 's3'"),
    ):
        storage.backend()
