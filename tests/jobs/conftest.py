"""Fixtures shared by the tests/jobs modules (the project-wide ones are in tests/conftest.py)."""

from __future__ import annotations

import hashlib
import io
from pathlib import Path
from typing import NamedTuple

import pytest

from gpu_worker.bundle import write_bundle
from jobs import storage
from jobs.models import Artifact, TrainingJob
from jobs.services.artifacts import artifact_ingest
from jobs.services.attempts import attempt_record_events, attempt_start


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings) -> None:
    # make_user sets a password; PBKDF2 costs ~0.3 s a user, which adds up over the suite.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


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


class Ingested(NamedTuple):
    job: TrainingJob
    artifact: Artifact
    bundle: bytes

    def __repr__(self) -> str:  # hypothesis prints fixtures; the bundle is 100 kB
        return f"Ingested({self.artifact.public_id}, {len(self.bundle)} bytes)"


@pytest.fixture
def ingested(finalizing) -> Ingested:
    """A succeeded job and its verified adapter, stored through the real ingest."""
    job, attempt, bundle, sha = finalizing
    key = storage.bundle_key(job.project_id, job.public_id, attempt.number)
    storage.save_stream(key, [bundle])
    artifact = artifact_ingest(attempt_pk=attempt.pk, reported_sha256=sha)
    assert artifact is not None
    job.refresh_from_db()
    return Ingested(job, artifact, bundle)
