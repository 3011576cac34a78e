"""OpenAI's official Python SDK driving a whole fine-tune over real HTTP, with real processes
(the live server, the control plane's worker on Redis, a GPU node running the real executor on
the tiny model): upload, create, list, pause, resume, download the results; and a cancel.

Every client action goes through ``openai.OpenAI``, as a user's script would; the database is
only read, to check what the API says against what is stored. The in-process SDK tests (no
worker, no node) are tests/api/test_api_openai_sdk.py."""

from __future__ import annotations

import csv
import hashlib
import io
import json
from pathlib import Path
from typing import Any

import openai
import pytest
from openai.types.fine_tuning import FineTuningJob, FineTuningJobEvent

from gpu_worker.tiny_model import DEMO_EVALS_PATH, DEMO_PREFERENCE_PATH
from jobs.models import Artifact, GpuNode, JobAttempt
from jobs.services.fleet.nodes import node_create
from tests.e2e.conftest import Process, wait_for
from trainhub_contract.bundle import verify_bundle

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

TRAIN_TIMEOUT = 180
STEPS_PER_EPOCH = 15  # the demo dataset's 60 examples at the default ("auto") batch size of 4
# Long enough that a pause sent at the first metrics event reaches the run (the node polls for
# stop requests every second) well before its last step, short enough to finish in seconds.
PAUSE_EPOCHS = 6


def _node(start_node: Any, name: str) -> Process:
    """A node started with its own token. Not waited for: a queued job goes to it the moment
    it registers, and the tiny run can be over before a poll would see the node idle."""
    _, token = node_create(name=name, actor="test")
    return start_node(name, token)


def _node_status(name: str) -> str | None:
    return GpuNode.objects.filter(name=name).values_list("status", flat=True).first()


def _upload(client: openai.OpenAI, content: bytes, *procs: Process) -> str:
    """Upload a dataset and wait for the control worker to validate it, as a client polls."""
    uploaded = client.files.create(file=("demo.jsonl", content), purpose="fine-tune")
    assert uploaded.bytes == len(content) and uploaded.purpose == "fine-tune"
    wait_for(
        "the file to be validated",
        lambda: client.files.retrieve(uploaded.id).status in ("processed", "error"),
        60,
        *procs,
    )
    checked = client.files.retrieve(uploaded.id)
    assert checked.status == "processed", checked
    return uploaded.id


def _create(
    client: openai.OpenAI, model: str, training_file: str, *, n_epochs: int, **fields: Any
) -> FineTuningJob:
    """OpenAI's ``method`` for what OpenAI has; trainhub's own settings in ``extra_body``,
    including the hyperparameters OpenAI has no name for (merged with method's: no clash)."""
    return client.fine_tuning.jobs.create(
        model=model,
        training_file=training_file,
        method={
            "type": "supervised",
            "supervised": {
                "hyperparameters": {
                    "n_epochs": n_epochs,
                    "batch_size": "auto",
                    "learning_rate_multiplier": 5,
                }
            },
        },
        extra_body={
            "adapter": {"type": "lora", "r": 8, "alpha": 16, "dropout": 0.0},
            "target": "local",
            "hyperparameters": {
                "max_seq_length": 128,
                "warmup_ratio": 0.0,
                "gradient_checkpointing": False,
            },
        },
        **fields,
    )


def _status(client: openai.OpenAI, job_id: str) -> str:
    return client.fine_tuning.jobs.retrieve(job_id).status


def _wait_status(
    client: openai.OpenAI, job_id: str, want: str, timeout: float, *procs: Process
) -> FineTuningJob:
    """Poll the job until it is ``want``; a terminal status other than that fails at once."""
    final = {"succeeded", "failed", "cancelled"} - {want}
    wait_for(
        f"the job to be {want}",
        lambda: _status(client, job_id) in final | {want},
        timeout,
        *procs,
    )
    job = client.fine_tuning.jobs.retrieve(job_id)
    assert job.status == want, (job.status, job.error)
    return job


def _events(client: openai.OpenAI, job_id: str) -> list[FineTuningJobEvent]:
    """All of the job's events, oldest first (the SDK pages through them with ``after``)."""
    return list(client.fine_tuning.jobs.list_events(job_id, limit=100))


def _attempt(event: FineTuningJobEvent) -> int | None:
    return (event.model_extra or {}).get("attempt")


def _kind(event: FineTuningJobEvent) -> str | None:
    """trainhub's event kind (status, log, checkpoint, metrics, ...) beside OpenAI's type."""
    return (event.model_extra or {}).get("kind")


def _data(event: FineTuningJobEvent) -> dict[str, Any]:
    return event.data if isinstance(event.data, dict) else {}  # the SDK types it as object


def _metrics(events: list[FineTuningJobEvent], attempt: int | None = None) -> list[dict[str, Any]]:
    """The training steps reported (OpenAI's metrics events), oldest first."""
    return [
        _data(e)
        for e in events
        if e.type == "metrics" and "train_loss" in _data(e)
        if attempt is None or _attempt(e) == attempt
    ]


def _wait_training(client: openai.OpenAI, job_id: str, *procs: Process) -> None:
    """Running, and at least one training step reported (metrics event)."""
    _wait_status(client, job_id, "running", TRAIN_TIMEOUT, *procs)
    wait_for("a metrics event", lambda: _metrics(_events(client, job_id)), TRAIN_TIMEOUT, *procs)


def test_upload_train_pause_resume_and_download_the_results(
    client, plane, start_node, demo_dataset, tiny_model_dir
) -> None:
    training_file = _upload(client, demo_dataset, plane)
    created = _create(
        client,
        str(tiny_model_dir),
        training_file,
        n_epochs=PAUSE_EPOCHS,
        suffix="e2e",
        metadata={"suite": "e2e", "run": "pause-resume"},
    )
    job_id = created.id
    # No node yet: a validated file means the job waits in the queue.
    assert created.status == "queued" and created.training_file == training_file
    assert created.method and created.method.supervised
    hyper = created.method.supervised.hyperparameters
    assert hyper and (hyper.n_epochs, hyper.batch_size, hyper.learning_rate_multiplier) == (
        PAUSE_EPOCHS,
        4,  # "auto": the default batch size
        5,
    )
    # extra_body's hyperparameters were merged, not dropped.
    extra = created.hyperparameters.model_extra or {}
    assert (extra["max_seq_length"], extra["gradient_checkpointing"]) == (128, False)
    assert created.metadata == {"suite": "e2e", "run": "pause-resume"}
    assert [j.id for j in client.fine_tuning.jobs.list(metadata={"run": "pause-resume"})] == [
        job_id
    ]
    assert list(client.fine_tuning.jobs.list(metadata={"run": "other"})) == []
    assert client.fine_tuning.jobs.retrieve(job_id).suffix == "e2e"

    node = _node(start_node, "node-sdk")
    procs = (node, plane)
    _wait_training(client, job_id, *procs)

    # Pause: the run saves a checkpoint, stops, and gives the node back.
    paused = client.fine_tuning.jobs.pause(job_id)
    assert paused.status == "paused"
    with pytest.raises(openai.ConflictError) as caught:
        client.fine_tuning.jobs.pause(job_id)
    assert caught.value.code == "job_not_pausable"
    wait_for(
        "the paused attempt to end",
        lambda: JobAttempt.objects.filter(job__public_id=job_id, ended_at__isnull=False).exists(),
        60,
        *procs,
    )
    first = JobAttempt.objects.get(job__public_id=job_id, number=1)
    assert first.end_reason == "paused"
    wait_for("the node to be idle", lambda: _node_status("node-sdk") == "idle", 20, *procs)
    assert GpuNode.objects.get(name="node-sdk").current_attempt is None
    assert _status(client, job_id) == "paused"

    # The executor's last event batch (the pause's checkpoint) can be stored a moment after
    # the attempt ended on its final status (seen once under load): wait for it, bounded.
    def checkpoint_of_the_last_step() -> bool:
        listed = list(client.fine_tuning.jobs.checkpoints.list(job_id))
        last_step = _metrics(_events(client, job_id), attempt=1)[-1]["step"]
        return len(listed) == 1 and listed[0].step_number == last_step

    wait_for("the pause's checkpoint of the last step", checkpoint_of_the_last_step, 20, *procs)
    checkpoints = list(client.fine_tuning.jobs.checkpoints.list(job_id))
    assert len(checkpoints) == 1, checkpoints  # one per attempt: the newest
    (checkpoint,) = checkpoints
    assert checkpoint.id.startswith("ftckpt-") and checkpoint.fine_tuning_job_id == job_id
    total = PAUSE_EPOCHS * STEPS_PER_EPOCH
    assert 0 < checkpoint.step_number < total, "the pause came too late: the run had ended"
    assert checkpoint.metrics.step == checkpoint.step_number and checkpoint.metrics.train_loss
    # The pause kept the last finished step, not the last periodic checkpoint before it.
    last = _metrics(_events(client, job_id), attempt=1)[-1]
    assert checkpoint.step_number == last["step"]
    assert checkpoint.metrics.train_loss == last["train_loss"]  # that step's, not an earlier one

    # Resume: queued again, the same node takes it, the run goes on from the checkpoint.
    resumed = client.fine_tuning.jobs.resume(job_id)
    assert resumed.status == "queued"
    job = _wait_status(client, job_id, "succeeded", TRAIN_TIMEOUT, *procs)
    second = JobAttempt.objects.get(job__public_id=job_id, number=2)
    assert (second.node_name, second.end_reason) == ("node-sdk", "succeeded")
    events = _events(client, job_id)
    said = [e for e in events if _attempt(e) == 2 and "Resuming from the checkpoint" in e.message]
    assert said, "the resumed attempt started from step 0"
    assert f"at step {checkpoint.step_number}." in said[0].message
    after = _metrics(events, attempt=2)
    assert after[0]["step"] == checkpoint.step_number + 1
    assert after[-1]["step"] == after[-1]["total_steps"] == total
    # Every epoch reads every token once: the resumed run neither lost nor re-counted the
    # tokens trained before the pause.
    (data,) = [
        _data(e) for e in events if _attempt(e) == 1 and e.message.startswith("Training data")
    ]
    assert job.trained_tokens == PAUSE_EPOCHS * data["tokens"]

    # The job's own status changes (attempt 0), as a client reads them in the events.
    changes = [_data(e) for e in events if _kind(e) == "status" and _attempt(e) == 0]
    assert [c["status"] for c in changes if "status" in c] == [
        "validating_files", "queued", "provisioning", "running", "paused",
        "queued", "provisioning", "running", "finalizing", "succeeded",
    ]  # fmt: skip

    _assert_results(client, job, total)


def _assert_results(client: openai.OpenAI, job: FineTuningJob, total_steps: int) -> None:
    """A succeeded job's OpenAI fields, and its two result files as a client downloads them."""
    assert job.fine_tuned_model and job.fine_tuned_model.startswith("ft:")
    assert ":e2e:" in job.fine_tuned_model
    assert job.trained_tokens and job.trained_tokens > 0
    assert job.finished_at and job.error is None
    assert len(job.result_files) == 2, job.result_files
    metrics_id, adapter_id = sorted(job.result_files, key=lambda f: "adapter" in f)
    assert metrics_id.startswith("file-metrics-") and adapter_id.startswith("file-adapter-")

    # The adapter: the stored, verified bundle, byte for byte.
    stored = Artifact.objects.get(job__public_id=job.id, kind="adapter", verified=True)
    raw = client.files.with_raw_response.content(adapter_id)
    body = raw.parse().read()
    assert hashlib.sha256(body).hexdigest() == stored.sha256
    assert raw.headers.get("X-Checksum-SHA256") == stored.sha256
    assert verify_bundle([body]).sha256 == stored.sha256
    described = client.files.retrieve(adapter_id)
    assert (described.bytes, described.purpose) == (len(body), "fine-tune-results")

    # The metrics: OpenAI's columns first, rows in step order (one per metrics event: the
    # executor merges steps reported within a second) up to the last step.
    text = client.files.content(metrics_id).read().decode()
    assert text.startswith("step,train_loss")
    steps = [int(row["step"]) for row in csv.DictReader(io.StringIO(text))]
    assert steps and steps == sorted(set(steps)), steps
    assert steps[-1] == total_steps


def test_a_validation_file_gives_openai_metrics_in_checkpoints_and_the_result_csv(
    client, plane, start_node, demo_dataset, tiny_model_dir
) -> None:
    """With a validation file the node's executor reports OpenAI's metrics: a checkpoint's
    train and valid figures, and the result CSV read by OpenAI's column names."""
    training_file = _upload(client, demo_dataset, plane)
    validation_file = _upload(client, demo_dataset, plane)
    job_id = _create(
        client, str(tiny_model_dir), training_file, n_epochs=1, validation_file=validation_file
    ).id
    node = _node(start_node, "node-sdk-v")
    job = _wait_status(client, job_id, "succeeded", TRAIN_TIMEOUT, node, plane)

    (checkpoint,) = client.fine_tuning.jobs.checkpoints.list(job_id)  # the newest: step 10
    figures = checkpoint.metrics
    assert figures.step == checkpoint.step_number and figures.train_loss
    for accuracy in (figures.train_mean_token_accuracy, figures.valid_mean_token_accuracy):
        assert accuracy is not None and 0.0 <= accuracy <= 1.0
    assert figures.valid_loss and figures.full_valid_loss is None  # the whole file: at the end

    metrics_id = next(f for f in job.result_files if f.startswith("file-metrics-"))
    rows = list(csv.DictReader(io.StringIO(client.files.content(metrics_id).read().decode())))
    trained = [r for r in rows if r["train_loss"]]
    assert trained and all(0.0 <= float(r["train_accuracy"]) <= 1.0 for r in trained)
    assert all(r["train_accuracy"] == r["train_mean_token_accuracy"] for r in rows)
    sampled = [r for r in rows if r["valid_loss"]]
    assert len(sampled) >= 5 and all(r["valid_mean_token_accuracy"] for r in sampled)
    (whole,) = [r for r in rows if r["full_valid_loss"]]
    assert int(whole["step"]) == STEPS_PER_EPOCH and whole["full_valid_mean_token_accuracy"]


def test_cancel_a_running_job_frees_the_node(
    client, plane, start_node, demo_dataset, tiny_model_dir
) -> None:
    training_file = _upload(client, demo_dataset, plane)
    # Hundreds of steps: the cancel always finds it training.
    job_id = _create(client, str(tiny_model_dir), training_file, n_epochs=50).id
    node = _node(start_node, "node-sdk-c")
    _wait_training(client, job_id, node, plane)
    running = client.fine_tuning.jobs.retrieve(job_id)
    assert running.estimated_finish and running.started_at
    assert running.estimated_finish > running.started_at  # from the pace of the steps so far

    cancelling = client.fine_tuning.jobs.cancel(job_id)
    assert cancelling.status == "cancelling"  # until the executor confirms the stop
    job = _wait_status(client, job_id, "cancelled", 60, node, plane)
    assert job.fine_tuned_model is None and job.result_files == []
    assert JobAttempt.objects.get(job__public_id=job_id).end_reason == "cancelled"
    wait_for("the node to be idle", lambda: _node_status("node-sdk-c") == "idle", 20, node)
    assert node.alive()
    with pytest.raises(openai.ConflictError) as caught:
        client.fine_tuning.jobs.cancel(job_id)
    assert caught.value.code == "job_not_cancellable"


def _held_out(path: Path, first: int = 12) -> tuple[bytes, bytes]:
    """A bundled demo file's lines after ``first``, and its first ``first`` (held out)."""
    lines = path.read_bytes().splitlines(keepends=True)
    return b"".join(lines[first:]), b"".join(lines[:first])


def _plain_endings() -> bytes:
    """The bundled eval items with the reference the SFT data taught: a reply ending in "."."""
    lines = [json.loads(line) for line in DEMO_EVALS_PATH.read_text().splitlines()]
    return b"".join(json.dumps({**item, "reference": "."}).encode() + b"\n" for item in lines)


def test_sft_then_dpo_on_top_of_its_fine_tuned_model(
    client, plane, start_node, demo_dataset, tiny_model_dir
) -> None:
    """The path OpenAI's users take: a supervised job, then a DPO job whose model is the first
    one's fine_tuned_model, through the official SDK and a real node; the DPO job's checkpoints
    are graded (trainhub's evals, in extra_body) and the best-scored one becomes its adapter."""
    node = _node(start_node, "node-sdk-dpo")
    sft_id = _create(client, str(tiny_model_dir), _upload(client, demo_dataset, plane),
                     n_epochs=2).id  # fmt: skip
    sft = _wait_status(client, sft_id, "succeeded", TRAIN_TIMEOUT, node, plane)
    pairs, held_out = _held_out(DEMO_PREFERENCE_PATH)
    with pytest.raises(openai.BadRequestError) as caught:  # pairs are not SFT data
        _create(client, str(tiny_model_dir), _upload(client, pairs, plane), n_epochs=1)
    assert caught.value.param == "training_file"

    created = client.fine_tuning.jobs.create(
        model=str(sft.fine_tuned_model),
        training_file=_upload(client, pairs, plane),
        validation_file=_upload(client, held_out, plane),
        method={
            "type": "dpo",
            "dpo": {
                "hyperparameters": {"beta": 0.5, "n_epochs": 2, "learning_rate_multiplier": 10}
            },
        },
        extra_body={
            "target": "local",
            "hyperparameters": {
                "max_seq_length": 128,
                "warmup_ratio": 0.0,
                "gradient_checkpointing": False,
                "eval_interval": 6,
            },
            "evals": {
                "file": _upload(client, _plain_endings(), plane),
                "max_tokens": 24,
                "grader": {
                    "type": "string_check",
                    "name": "ends plain",
                    "operation": "like",
                    "input": "{{sample.output_text}}",
                    "reference": "{{item.reference}}",
                },
            },
            "checkpoint_selection": "best_eval",
        },
    )

    assert created.model == sft.fine_tuned_model and created.method.type == "dpo"
    assert created.method.dpo and created.method.dpo.hyperparameters
    assert created.method.dpo.hyperparameters.beta == 0.5
    assert (created.model_extra or {})["parent"]["job_id"] == sft_id
    dpo = _wait_status(client, created.id, "succeeded", TRAIN_TIMEOUT, node, plane)
    assert dpo.fine_tuned_model and dpo.fine_tuned_model != sft.fine_tuned_model

    steps = _metrics(_events(client, dpo.id))
    assert steps and all("rewards/accuracies" in s and "rewards/margins" in s for s in steps)
    assert steps[-1]["rewards/margins"] > steps[0]["rewards/margins"]
    (checkpoint,) = client.fine_tuning.jobs.checkpoints.list(dpo.id)  # the newest of the attempt
    assert checkpoint.metrics.train_loss is not None and checkpoint.metrics.valid_loss is not None
    assert 0 <= (checkpoint.metrics.model_extra or {})["eval_score"] <= 1
    events = [_data(e) for e in _events(client, dpo.id)]
    graded = [e for e in events if "eval_score" in e]
    assert graded[0]["step"] == 0 and len(graded) >= 3, "before training, checkpoints, the end"
    (chosen,) = [e for e in events if "selected_step" in e]
    best = max(g["eval_score"] for g in graded[1:])
    assert chosen["selected_step"] in {g["step"] for g in graded[1:] if g["eval_score"] == best}
    metrics_id = next(f for f in dpo.result_files if f.startswith("file-metrics-"))
    rows = list(csv.DictReader(io.StringIO(client.files.content(metrics_id).read().decode())))
    assert [r for r in rows if r["train_loss"]] and [r for r in rows if r["valid_loss"]]
    (whole,) = [r for r in rows if r["full_valid_loss"]]
    assert float(whole["full_valid_loss"]) < 0.6931, "below the loss of a coin toss"
