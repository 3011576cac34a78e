import pytest

from jobs import storage
from jobs.models import Artifact
from jobs.services.core.artifacts import artifact_ingest
from tests.support.api import download

pytestmark = pytest.mark.usefixtures("storage_backend")


def _upload(job, attempt, data: bytes) -> None:
    storage.save_stream(storage.bundle_key(job.project_id, job.public_id, attempt.number), [data])


def test_verified_bundle_succeeds_the_job_and_downloads_intact(finalizing, api) -> None:
    job, attempt, bundle, sha = finalizing
    _upload(job, attempt, bundle)

    artifact = artifact_ingest(attempt_pk=attempt.pk, reported_sha256=sha)

    job.refresh_from_db()
    attempt.refresh_from_db()
    assert job.status == "succeeded"
    assert attempt.end_reason == "succeeded"
    assert artifact is not None and artifact.verified and artifact.sha256 == sha
    listed = api.get(f"/api/v1/jobs/{job.public_id}/artifacts/").json()["data"]
    assert [a["id"] for a in listed] == [artifact.public_id]
    downloaded = download(api, artifact.public_id)
    assert (downloaded.status, downloaded.sha256_header) == (200, sha)
    assert downloaded.body == bundle
    assert artifact_ingest(attempt_pk=attempt.pk, reported_sha256=sha) is None  # repeat: no-op
    assert Artifact.objects.filter(job=job).count() == 1


def test_ingest_records_the_sealed_copy_not_the_upload(finalizing) -> None:
    job, attempt, bundle, sha = finalizing
    upload = storage.bundle_key(job.project_id, job.public_id, attempt.number)
    _upload(job, attempt, bundle)

    artifact = artifact_ingest(attempt_pk=attempt.pk, reported_sha256=sha)

    assert artifact is not None
    assert artifact.storage_key == storage.sealed_key(upload) != upload
    assert not storage.exists(upload), "moved out of reach of the upload URL"
    assert storage.exists(storage.seal_marker_key(upload)), "the upload URL is closed"
    assert b"".join(storage.read_chunks(artifact.storage_key)) == bundle


def test_flipped_byte_fails_the_job_as_artifact_corrupt_and_serves_nothing(finalizing, api) -> None:
    job, attempt, bundle, sha = finalizing
    corrupted = bytearray(bundle)
    corrupted[len(bundle) // 2] ^= 0xFF
    _upload(job, attempt, bytes(corrupted))

    assert artifact_ingest(attempt_pk=attempt.pk, reported_sha256=sha) is None

    job.refresh_from_db()
    assert job.status == "failed"
    assert job.error_code == "artifact_corrupt"
    assert "adapter_model.safetensors" in job.error_message
    assert api.get(f"/api/v1/jobs/{job.public_id}/artifacts/").json()["data"] == []
    # Quarantined: the upload is kept (sealed) for inspection, but nothing serves it.
    key = storage.sealed_key(storage.bundle_key(job.project_id, job.public_id, attempt.number))
    assert b"".join(storage.read_chunks(key)) == bytes(corrupted)
    assert not Artifact.objects.filter(job=job, verified=True).exists()


def test_reported_hash_mismatch_fails_clearly(finalizing) -> None:
    job, attempt, bundle, _ = finalizing
    _upload(job, attempt, bundle)
    artifact_ingest(attempt_pk=attempt.pk, reported_sha256="0" * 64)
    job.refresh_from_db()
    assert (job.status, job.error_code) == ("failed", "artifact_corrupt")
    assert "reported" in job.error_message


def test_success_reported_without_an_upload_fails_clearly(finalizing) -> None:
    job, attempt, _, sha = finalizing
    artifact_ingest(attempt_pk=attempt.pk, reported_sha256=sha)
    job.refresh_from_db()
    assert (job.status, job.error_code) == ("failed", "artifact_corrupt")
    assert "no bundle was uploaded" in job.error_message
