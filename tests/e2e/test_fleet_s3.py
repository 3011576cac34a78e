"""The fleet end to end with S3 storage (moto's server): the node reads the dataset and writes
checkpoints and the adapter through presigned S3 URLs only, never through the control plane;
the control worker ingests from S3; the client downloads after a redirect to S3."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from jobs import storage
from jobs.models import TrainingJob
from tests.e2e.conftest import submit_tiny_job
from tests.e2e.test_fleet import _node, _wait_idle, assert_trains_to_a_verified_adapter

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]
BUCKET = f"trainhub-e2e-{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="module")
def control_worker_env(s3_endpoint: str) -> dict[str, str]:
    import boto3

    boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1").create_bucket(
        Bucket=BUCKET
    )
    return {
        "TRAINHUB_STORAGE": "s3",
        "TRAINHUB_S3_BUCKET": BUCKET,
        "TRAINHUB_S3_ENDPOINT_URL": s3_endpoint,
        "TRAINHUB_S3_REGION": "us-east-1",
        "TRAINHUB_S3_ADDRESSING_STYLE": "path",
    }


@pytest.fixture
def s3_plane(plane, settings, control_worker_env: dict[str, str]) -> Any:
    """The web side (this process) on the same bucket as the control worker."""
    for name, value in control_worker_env.items():
        setattr(settings, name, value)
    return plane


def test_a_job_trains_with_s3_storage_and_its_adapter_is_verified(
    s3_plane, start_node, api, demo_dataset, tiny_model_dir, tmp_path, shared_dir, s3_endpoint
) -> None:
    node = start_node("node-s3", _node("node-s3"))
    _wait_idle("node-s3", node, s3_plane)

    job_id = submit_tiny_job(api, tiny_model_dir, demo_dataset)
    assert_trains_to_a_verified_adapter(
        api, job_id, "node-s3", tiny_model_dir, tmp_path, node, s3_plane
    )

    job = TrainingJob.objects.get(public_id=job_id)
    stored = {o.key for o in storage.list_objects(storage.project_prefix(job.project_id))}
    # Ingest sealed the upload: the adapter moved where no URL writes, its upload URL closed.
    upload = storage.bundle_key(job.project_id, job.public_id, 1)
    assert storage.sealed_key(upload) in stored and upload not in stored
    assert storage.seal_marker_key(upload) in stored
    assert storage.checkpoint_key(job.project_id, job.public_id, 1) in stored  # every 5 steps
    assert job.training_file.storage_key in stored
    # Nothing went through the control plane's own transfer route or local folder.
    assert not (shared_dir / "storage" / "projects" / str(job.project_id)).exists()
    assert "X-Amz-Signature" not in node.tail(200_000)  # signed query strings never logged
