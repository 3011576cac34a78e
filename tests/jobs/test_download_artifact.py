"""`manage.py download_artifact`: the stored bundle re-verified on the way out and unpacked
safely; damage in storage is caught and leaves nothing behind."""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from jobs import storage
from jobs.models import Artifact
from tests.support.factories import ArtifactFactory
from trainhub_contract.bundle import write_bundle

WEIGHTS = bytes(range(256)) * 400
pytestmark = pytest.mark.usefixtures("storage_backend")


@pytest.fixture
def artifact(make_job, tmp_path: Path) -> Artifact:
    """A verified adapter as ingest stores it (the ingest itself: test_services_artifacts)."""
    job = make_job()
    src = tmp_path / "adapter"
    src.mkdir()
    (src / "adapter_model.safetensors").write_bytes(WEIGHTS)
    (src / "adapter_config.json").write_text('{"base_model_name_or_path": "acme/tiny-llama"}')
    buf = io.BytesIO()
    write_bundle(src, buf)
    key = storage.bundle_key(job.project_id, job.public_id, 1)
    stored = storage.save_stream(key, [buf.getvalue()])
    return ArtifactFactory(
        job=job, kind=Artifact.Kind.ADAPTER, storage_key=key, filename=f"{job.public_id}.tar",
        size=stored.size, sha256=stored.sha256, verified=True,
    )  # fmt: skip


def _run(*args: str) -> str:
    out = io.StringIO()
    call_command("download_artifact", *args, stdout=out)
    return out.getvalue()


def test_downloads_verifies_and_extracts(artifact: Artifact, tmp_path: Path) -> None:
    printed = _run(artifact.public_id, str(tmp_path / "dl"))
    tar = tmp_path / "dl" / artifact.filename
    assert hashlib.sha256(tar.read_bytes()).hexdigest() == artifact.sha256
    assert artifact.sha256 in printed and "verified" in printed
    folder = tmp_path / "dl" / f"{artifact.job.public_id}-adapter"
    assert (folder / "adapter_model.safetensors").read_bytes() == WEIGHTS
    assert (folder / "manifest.json").exists()


def test_a_flipped_byte_in_storage_is_caught(artifact: Artifact, tmp_path: Path) -> None:
    data = bytearray(b"".join(storage.read_chunks(artifact.storage_key)))
    data[len(data) // 2] ^= 0x01
    storage.save_stream(artifact.storage_key, [bytes(data)])
    with pytest.raises(CommandError, match="damaged in storage"):
        _run(artifact.public_id, str(tmp_path / "dl"))
    assert list((tmp_path / "dl").iterdir()) == []


def test_an_unverified_or_unknown_artifact_is_refused(artifact: Artifact, tmp_path: Path) -> None:
    Artifact.objects.filter(pk=artifact.pk).update(verified=False)
    with pytest.raises(CommandError, match="failed verification"):
        _run(artifact.public_id, str(tmp_path / "dl"))
    with pytest.raises(CommandError, match="No artifact"):
        _run("artifact-nope", str(tmp_path / "dl"))


def test_a_second_download_never_overwrites_the_first_extraction(
    artifact: Artifact, tmp_path: Path
) -> None:
    _run(artifact.public_id, str(tmp_path / "dl"))
    with pytest.raises(CommandError, match="already exists"):
        _run(artifact.public_id, str(tmp_path / "dl"))
    assert _run(artifact.public_id, str(tmp_path / "dl"), "--no-extract").count("verified") == 1
