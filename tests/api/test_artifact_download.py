"""GET /api/v1/artifacts/{id}/download/ on both backends: the project's verified adapter only,
its sha256 in X-Checksum-SHA256, Range for resuming (served here, or by S3 after a redirect to a
short-lived presigned GET), identical bytes every time."""

from __future__ import annotations

import hashlib
import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobs import storage
from jobs.models import Artifact
from tests.support.api import assert_error, download

pytestmark = pytest.mark.usefixtures("storage_backend")


def test_download_carries_its_sha256_and_the_bytes(ingested, api, storage_backend: str) -> None:
    _, artifact, bundle = ingested
    got = download(api, artifact.public_id)
    assert got.status == 200
    assert got.sha256_header == artifact.sha256 == hashlib.sha256(got.body).hexdigest()
    assert got.body == bundle
    assert got.redirected == (storage_backend == "s3")
    assert got.headers["Content-Disposition"] == f'attachment; filename="{artifact.filename}"'
    assert got.headers["Content-Length"] == str(len(bundle))
    if storage_backend == "local":
        assert got.headers["Accept-Ranges"] == "bytes"


@pytest.mark.parametrize("accept", ["application/octet-stream", "application/binary", "*/*"])
def test_any_accept_header_gets_the_bytes(ingested, api, accept: str) -> None:
    _, artifact, bundle = ingested
    got = api.get(f"/api/v1/artifacts/{artifact.public_id}/download/", HTTP_ACCEPT=accept)
    assert got.status_code in (200, 302), (accept, got.status_code)
    assert got["X-Checksum-SHA256"] == artifact.sha256
    if got.status_code == 200:  # served here (local); S3 redirects to the presigned GET
        body = b"".join(got.streaming_content) if got.streaming else got.content
        assert body == bundle


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(cuts=st.lists(st.floats(min_value=0, max_value=1), min_size=1, max_size=4))
def test_range_pieces_reassemble_and_repeat_identically(ingested, api, cuts: list[float]) -> None:
    _, artifact, bundle = ingested
    size = len(bundle)
    points = sorted({0, size, *(int(c * size) for c in cuts)})
    pieces = []
    for first, end in itertools.pairwise(points):
        if first == end:
            continue
        got = download(api, artifact.public_id, f"{first}-{end - 1}")
        assert got.status == 206
        assert got.headers["Content-Range"] == f"bytes {first}-{end - 1}/{size}"
        pieces.append(got.body)
    assert b"".join(pieces) == bundle
    assert download(api, artifact.public_id).body == bundle


def test_open_ended_range_resumes(ingested, api) -> None:
    _, artifact, bundle = ingested
    got = download(api, artifact.public_id, "1000-")
    assert got.status == 206
    assert bundle[:1000] + got.body == bundle


def test_range_past_the_end_is_416(ingested, api) -> None:
    _, artifact, bundle = ingested
    assert download(api, artifact.public_id, f"{len(bundle)}-").status == 416


@pytest.mark.parametrize("spec", ["9" * 5000 + "-", "0-1,5-6", "abc"])
def test_a_malformed_or_absurd_range_is_a_clear_416_never_a_500(
    ingested, api, storage_backend: str, spec: str
) -> None:
    _, artifact, bundle = ingested
    resp = api.get(f"/api/v1/artifacts/{artifact.public_id}/download/", HTTP_RANGE=f"bytes={spec}")
    if storage_backend == "s3":  # the API only redirects; S3 answers the Range itself
        assert resp.status_code == 302
        return
    body = assert_error(resp, 416, code="invalid_range")
    assert "bytes=FIRST-LAST" in body["message"]
    assert resp["Content-Range"] == f"bytes */{len(bundle)}"


def test_another_project_and_unknown_ids_get_404(ingested, api, make_user, make_client) -> None:
    _, artifact, _ = ingested
    stranger = make_client(make_user("mallory"))
    assert_error(
        stranger.get(f"/api/v1/artifacts/{artifact.public_id}/download/"),
        404,
        code="artifact_not_found",
    )
    for bad in ["artifact-nope", "../../etc/passwd", "a" * 300]:
        assert_error(api.get(f"/api/v1/artifacts/{bad}/download/"), 404)


def test_a_quarantined_upload_is_never_served(ingested, api) -> None:
    _, artifact, _ = ingested
    Artifact.objects.filter(pk=artifact.pk).update(verified=False)
    assert_error(
        api.get(f"/api/v1/artifacts/{artifact.public_id}/download/"), 404, code="artifact_not_found"
    )


def test_bytes_lost_from_storage_are_a_clear_503(ingested, api) -> None:
    _, artifact, _ = ingested
    storage.delete(artifact.storage_key)
    body = assert_error(
        api.get(f"/api/v1/artifacts/{artifact.public_id}/download/"),
        503,
        code="artifact_unavailable",
    )
    assert body["type"] == "server_error"
