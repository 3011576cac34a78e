"""OpenAI's official Python SDK against the live HTTP server: OpenAI's paths (with and without
the trailing slash, under /v1 and /api/v1), OpenAI's request bodies and objects, the errors it
raises. No worker runs here: a file is validated through the service, as the worker would;
the whole run on a real node is tests/e2e/test_openai_sdk.py."""

from __future__ import annotations

import csv
import hashlib
import io

import openai
import pytest
import requests

from jobs.models import TrainingFile, TrainingJob
from jobs.services.accounts.projects import api_key_create, project_default_for_user
from jobs.services.core.events import event_append, events_store
from jobs.services.core.files import file_validate

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def key(user) -> str:
    return api_key_create(user=user, name="sdk")[1]


@pytest.fixture(params=["/v1", "/api/v1"])
def client(request, live_server, key) -> openai.OpenAI:
    return openai.OpenAI(base_url=live_server.url + request.param, api_key=key, max_retries=0)


def _upload(client: openai.OpenAI, content: bytes) -> str:
    uploaded = client.files.create(file=("data.jsonl", content), purpose="fine-tune")
    file_validate(file_pk=TrainingFile.objects.get(public_id=uploaded.id).pk)  # the worker's part
    return uploaded.id


def test_files_upload_list_retrieve_content_delete(client, demo_dataset) -> None:
    uploaded = client.files.create(file=("data.jsonl", demo_dataset), purpose="fine-tune")
    assert uploaded.object == "file" and uploaded.id.startswith("file-")
    assert uploaded.bytes == len(demo_dataset) and uploaded.purpose == "fine-tune"
    stored = TrainingFile.objects.get(public_id=uploaded.id)  # really stored, not a redirect
    assert stored.sha256 == hashlib.sha256(demo_dataset).hexdigest()

    assert client.files.retrieve(uploaded.id).filename == "data.jsonl"
    assert [f.id for f in client.files.list(purpose="fine-tune")] == [uploaded.id]
    assert list(client.files.list(purpose="batch")) == []
    assert client.files.content(uploaded.id).read() == demo_dataset

    deleted = client.files.delete(uploaded.id)
    assert (deleted.id, deleted.deleted) == (uploaded.id, True)
    with pytest.raises(openai.NotFoundError) as caught:
        client.files.retrieve(uploaded.id)
    assert caught.value.code == "file_not_found"


def test_create_with_method_and_extra_body_resolves_auto(client, demo_dataset) -> None:
    training_file = _upload(client, demo_dataset)
    job = client.fine_tuning.jobs.create(
        model="acme/tiny-llama",
        training_file=training_file,
        method={
            "type": "supervised",
            "supervised": {
                "hyperparameters": {
                    "n_epochs": 2,
                    "batch_size": "auto",
                    "learning_rate_multiplier": 0.5,
                }
            },
        },
        suffix="support-bot",
        seed=7,
        metadata={"team": "search", "run": "7"},
        extra_body={
            "adapter": {"type": "dora", "r": 8, "alpha": 16},
            "target": "local",
            "gpu": {"count": 1, "min_vram_gb": 24},
            "node_selector": {"region": "eu-*"},
            "max_runtime_seconds": 600,
            "priority": 5,
        },
    )
    assert job.object == "fine_tuning.job" and job.status == "queued"
    resolved = job.method.supervised.hyperparameters
    assert (resolved.n_epochs, resolved.batch_size) == (2, 4)  # "auto" batch size: the default
    assert resolved.learning_rate_multiplier == 0.5
    assert job.hyperparameters.n_epochs == 2
    assert job.seed == 7 and job.metadata == {"team": "search", "run": "7"}
    assert job.fine_tuned_model is None and job.result_files == [] and job.error is None
    extras = job.model_extra or {}
    assert extras["adapter"]["type"] == "dora" and extras["adapter"]["r"] == 8
    assert extras["priority"] == 5 and extras["target"] == "local"
    assert extras["node_selector"] == {"region": "eu-*"}
    row = TrainingJob.objects.get(public_id=job.id)
    assert row.hyperparameters["learning_rate"] == pytest.approx(1e-4)
    assert row.max_runtime_seconds == 600 and row.gpu["min_vram_gb"] == 24

    assert client.fine_tuning.jobs.retrieve(job.id).id == job.id


def test_list_filters_by_metadata_and_pages_with_after(client, demo_dataset) -> None:
    training_file = _upload(client, demo_dataset)
    ids = [
        client.fine_tuning.jobs.create(
            model="acme/tiny-llama", training_file=training_file, metadata={"team": team}
        ).id
        for team in ("a", "b", "a")
    ]
    assert [j.id for j in client.fine_tuning.jobs.list(metadata={"team": "a"})] == [
        ids[2],
        ids[0],
    ]
    first = client.fine_tuning.jobs.list(limit=1)
    assert [j.id for j in first.data] == [ids[2]] and first.has_more
    assert [j.id for j in client.fine_tuning.jobs.list(limit=1)] == ids[::-1]  # auto-paging


def test_unsupported_method_and_bad_fields_are_400s_naming_the_field(client, demo_dataset) -> None:
    training_file = _upload(client, demo_dataset)
    cases = [
        ({"method": {"type": "dpo", "dpo": {}}}, "training_file"),  # SFT data, not pairs
        (
            {"method": {"type": "supervised", "supervised": {"hyperparameters": {"beta": 0.2}}}},
            "method.supervised.hyperparameters.beta",
        ),
        (
            {"method": {"type": "dpo", "dpo": {"hyperparameters": {"beta": 3}}}},
            "hyperparameters.beta",
        ),
        ({"method": {"type": "reinforcement"}}, "method.type"),
        ({"hyperparameters": {"n_epochs": "many"}}, "hyperparameters.n_epochs"),
        ({"metadata": {"k": 1}}, "metadata.k"),
        ({"integrations": [{"type": "wandb", "wandb": {"project": "x"}}]}, "integrations"),
        ({"extra_body": {"adapter": {"type": "ia3"}}}, "adapter.type"),
    ]
    for fields, param in cases:
        extra = fields.pop("extra_body", None)
        with pytest.raises(openai.BadRequestError) as caught:
            client.fine_tuning.jobs.create(
                model="acme/tiny-llama", training_file=training_file, extra_body=extra, **fields
            )
        assert caught.value.param == param, (fields, caught.value.body)
    assert TrainingJob.objects.count() == 0


def test_events_checkpoints_and_cancel(client, demo_dataset) -> None:
    job_id = client.fine_tuning.jobs.create(
        model="acme/tiny-llama", training_file=_upload(client, demo_dataset)
    ).id
    row = TrainingJob.objects.get(public_id=job_id)
    # What an executor reports, stored through the same service as its real reports.
    events_store(
        job=row,
        attempt=1,
        events=[
            {"seq": 0, "type": "metrics", "level": "info", "message": "",
             "data": {"step": 5, "total_steps": 10, "loss": 2.5, "lr": 1e-4}},
            {"seq": 1, "type": "checkpoint", "level": "info", "message": "Checkpoint saved.",
             "data": {"step": 5, "size": 10, "sha256": "0" * 64}},
            {"seq": 2, "type": "checkpoint", "level": "info", "message": "Checkpoint saved.",
             "data": {"step": 10, "size": 12, "sha256": "1" * 64}},
        ],
    )  # fmt: skip
    event_append(job=row, type="log", message="Validation loss 2.0000 at step 10.",
                 data={"step": 10, "eval_loss": 2.0})  # fmt: skip

    events = list(client.fine_tuning.jobs.list_events(job_id, limit=100))
    by_kind = {e.model_extra["kind"]: e for e in events}
    assert by_kind["metrics"].type == "metrics"
    assert by_kind["metrics"].data["train_loss"] == 2.5 and by_kind["metrics"].data["step"] == 5
    assert by_kind["status"].type == "message" and by_kind["checkpoint"].type == "message"
    valid = [e for e in events if e.type == "metrics" and "valid_loss" in e.data]
    assert valid and valid[0].data["valid_loss"] == 2.0

    checkpoints = list(client.fine_tuning.jobs.checkpoints.list(job_id))
    assert len(checkpoints) == 1  # an attempt keeps only its newest checkpoint
    (checkpoint,) = checkpoints
    assert checkpoint.id.startswith("ftckpt-") and checkpoint.step_number == 10
    assert checkpoint.fine_tuning_job_id == job_id
    assert checkpoint.metrics.train_loss == 2.5 and checkpoint.metrics.step == 10
    assert checkpoint.fine_tuned_model_checkpoint.endswith(":ckpt-step-10")

    cancelled = client.fine_tuning.jobs.cancel(job_id)
    assert cancelled.status == "cancelled"
    with pytest.raises(openai.ConflictError) as caught:
        client.fine_tuning.jobs.cancel(job_id)
    assert caught.value.code == "job_not_cancellable"


def test_openai_metric_names_in_events_checkpoints_and_the_result_csv(client, demo_dataset) -> None:
    """What an executor with a validation file reports (gpu_worker.token_accuracy) reads as
    OpenAI names it: in the events, the checkpoint's metrics and the result CSV's columns."""
    job_id = client.fine_tuning.jobs.create(
        model="acme/tiny-llama", training_file=_upload(client, demo_dataset)
    ).id
    row = TrainingJob.objects.get(public_id=job_id)
    events_store(
        job=row,
        attempt=1,
        events=[
            {"seq": 0, "type": "metrics", "level": "info", "message": "",
             "data": {"step": 5, "loss": 2.5, "mean_token_accuracy": 0.4, "lr": 1e-4}},
            {"seq": 1, "type": "log", "level": "info", "message": "Validation loss 2.2000",
             "data": {"step": 5, "eval_loss": 2.2, "eval_mean_token_accuracy": 0.45}},
            {"seq": 2, "type": "checkpoint", "level": "info", "message": "Checkpoint saved.",
             "data": {"step": 10, "size": 12, "sha256": "1" * 64}},
            {"seq": 3, "type": "metrics", "level": "info", "message": "",
             "data": {"step": 10, "loss": 2.0, "mean_token_accuracy": 0.5, "lr": 1e-4}},
            {"seq": 4, "type": "log", "level": "info", "message": "Validation loss 1.9000",
             "data": {"step": 10, "full_valid_loss": 1.9, "full_valid_mean_token_accuracy": 0.55}},
        ],
    )  # fmt: skip

    events = [e for e in client.fine_tuning.jobs.list_events(job_id, limit=100)]
    metrics = [e.data for e in events if e.type == "metrics"]
    assert {"step": 5, "train_loss": 2.5, "train_mean_token_accuracy": 0.4}.items() <= next(
        m for m in metrics if m.get("train_loss") == 2.5
    ).items()
    assert any(m.get("valid_mean_token_accuracy") == 0.45 for m in metrics)
    assert any(m.get("full_valid_loss") == 1.9 for m in metrics)

    (checkpoint,) = client.fine_tuning.jobs.checkpoints.list(job_id)
    assert (
        checkpoint.metrics.model_dump(exclude_none=True).items()
        >= {
            "step": 10,
            "train_loss": 2.0,
            "train_mean_token_accuracy": 0.5,
            "valid_loss": 2.2,
            "valid_mean_token_accuracy": 0.45,
            "full_valid_loss": 1.9,
            "full_valid_mean_token_accuracy": 0.55,
        }.items()
    )

    TrainingJob.objects.filter(pk=row.pk).update(status="succeeded")  # its CSV is a result now
    (metrics_file,) = [
        f for f in client.fine_tuning.jobs.retrieve(job_id).result_files if "metrics" in f
    ]
    rows = list(csv.DictReader(io.StringIO(client.files.content(metrics_file).read().decode())))
    assert {"step", "train_loss", "train_accuracy", "valid_loss", "valid_mean_token_accuracy",
            "train_mean_token_accuracy", "full_valid_loss", "full_valid_mean_token_accuracy"
            } <= set(rows[0])  # fmt: skip
    by_step = [(r["step"], r["train_loss"], r["train_accuracy"], r["valid_loss"],
                r["valid_mean_token_accuracy"], r["full_valid_loss"]) for r in rows]  # fmt: skip
    assert by_step == [
        ("5", "2.5", "0.4", "", "", ""),
        ("5", "", "", "2.2", "0.45", ""),
        ("10", "2.0", "0.5", "", "", ""),
        ("10", "", "", "", "", "1.9"),
    ]


def test_pause_and_resume_refuse_a_job_that_is_not_running(client, demo_dataset) -> None:
    job_id = client.fine_tuning.jobs.create(
        model="acme/tiny-llama", training_file=_upload(client, demo_dataset)
    ).id
    with pytest.raises(openai.ConflictError) as caught:
        client.fine_tuning.jobs.pause(job_id)
    assert caught.value.code == "job_not_pausable"
    with pytest.raises(openai.ConflictError) as caught:
        client.fine_tuning.jobs.resume(job_id)
    assert caught.value.code == "job_not_resumable"


def test_another_projects_objects_are_not_found(client, demo_dataset, make_user) -> None:
    job_id = client.fine_tuning.jobs.create(
        model="acme/tiny-llama", training_file=_upload(client, demo_dataset)
    ).id
    file_id = TrainingJob.objects.get(public_id=job_id).training_file.public_id
    mallory = make_user("mallory")
    project_default_for_user(user=mallory)
    other = client.with_options(api_key=api_key_create(user=mallory, name="m")[1])
    for call in (
        lambda: other.fine_tuning.jobs.retrieve(job_id),
        lambda: other.fine_tuning.jobs.cancel(job_id),
        lambda: other.fine_tuning.jobs.list_events(job_id),
        lambda: other.fine_tuning.jobs.checkpoints.list(job_id),
        lambda: other.files.retrieve(file_id),
        lambda: other.files.content(file_id),
        lambda: other.files.retrieve("file-adapter-" + job_id.removeprefix("ftjob-")),
    ):
        with pytest.raises(openai.NotFoundError):
            call()
    assert TrainingJob.objects.get(public_id=job_id).status == "queued"


def test_a_post_without_the_slash_is_served_not_redirected(live_server, key) -> None:
    headers = {"Authorization": f"Bearer {key}"}
    for base in ("/v1", "/api/v1"):
        response = requests.post(
            f"{live_server.url}{base}/files",
            headers=headers,
            files={"file": ("d.jsonl", b'{"text": "hi"}\n')},
            data={"purpose": "fine-tune"},
            allow_redirects=False,
            timeout=10,
        )
        assert response.status_code == 201, (base, response.status_code, response.text[:200])
        jobs = requests.get(
            f"{live_server.url}{base}/fine_tuning/jobs", headers=headers, timeout=10
        )
        assert jobs.status_code == 200 and jobs.json()["object"] == "list"
    assert TrainingFile.objects.count() == 2
