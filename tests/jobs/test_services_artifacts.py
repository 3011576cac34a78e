import hashlib
import io
from pathlib import Path

import pytest

from gpu_worker.bundle import write_bundle
from jobs import storage
from jobs.models import Artifact
from jobs.services.artifacts import artifact_ingest
from jobs.services.attempts import attempt_record_events, attempt_start


@pytest.fixture
def finalizing(make_job, tmp_path: Path, django_capture_on_commit_callbacks):
    """A job whose executor reported success, and the bundle it produced."""
    job = make_job()
    attempt = attempt_start(job=job, target="local")
    src = tmp_path / "adapter"
    src.mkdir()
    (src / "adapter_model.safetensors").write_bytes(bytes(range(256)) * 400)
    (src / "adapter_config.json").write_text('{"base_model_name_or_path": "acme/tiny-llama"}')
    buf = io.BytesIO()
    write_bundle(src, buf)
    bundle = buf.getvalue()
    sha = hashlib.sha256(bundle).hexdigest()
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        attempt_record_events(
            job_id=job.public_id,
            attempt_number=attempt.number,
            events=[
                {"seq": 0, "type": "status", "message": "training", "data": {"status": "running"}},
                {
                    "seq": 1,
                    "type": "status",
                    "message": "done",
                    "data": {"status": "succeeded", "sha256": sha},
                },
            ],
        )
    job.refresh_from_db()
    assert job.status == "finalizing"
    assert callbacks, "an ingest task is enqueued on commit"
    return job, attempt, bundle, sha


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
    download = api.get(f"/api/v1/artifacts/{artifact.public_id}/download/")
    assert download.status_code == 200
    assert download["X-Checksum-SHA256"] == sha
    assert b"".join(download.streaming_content) == bundle
    assert artifact_ingest(attempt_pk=attempt.pk, reported_sha256=sha) is None  # repeat: no-op
    assert Artifact.objects.filter(job=job).count() == 1


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
