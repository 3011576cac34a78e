"""DPO jobs and training on top of a fine-tuned model, through the jobs API: the method and its
files must agree before anything is queued, "auto" resolves to the documented defaults, an
``ft:`` model resolves to the exact stored bytes of this project's adapter (or checkpoint) and
the spec carries them; another project's name is a 404; a parent cannot be deleted under a
live child."""

from __future__ import annotations

import json
from typing import Any

import pytest

from jobs import storage
from jobs.models import TrainingJob
from jobs.services.core import specs
from jobs.services.core.attempts import attempt_end, attempt_start
from jobs.services.core.events import events_store
from jobs.services.core.files import file_validate
from jobs.services.core.jobs import job_cancel
from jobs.states import EndReason
from tests.jobs.services.core.test_specs import names
from tests.support.api import assert_error

JOBS = "/v1/fine_tuning/jobs"
PAIR = {
    "input": {"messages": [{"role": "user", "content": "What colour is owl 1?"}]},
    "preferred_output": [{"role": "assistant", "content": "Owl 1 is russet!"}],
    "non_preferred_output": [{"role": "assistant", "content": "Owl 1 is russet."}],
}
PAIRS = b"".join(json.dumps(PAIR).encode() + b"\n" for _ in range(12))

pytestmark = pytest.mark.usefixtures("sent")


def _create(client, **body: Any):
    return client.post(JOBS, {"model": "acme/tiny-llama", **body}, format="json")


def _dpo(beta: Any = "auto", **hyper: Any) -> dict[str, Any]:
    return {"type": "dpo", "dpo": {"hyperparameters": {"beta": beta, **hyper}}}


def test_a_dpo_job_on_preference_pairs_resolves_auto_to_the_documented_defaults(
    api, make_file
) -> None:
    pairs = make_file(PAIRS)
    assert pairs.format == "preference"

    created = _create(api, training_file=pairs.public_id, method=_dpo(n_epochs="auto"))

    assert created.status_code == 201, created.json()
    job = created.json()
    resolved = job["method"]["dpo"]["hyperparameters"]
    assert job["method"]["type"] == "dpo" and "supervised" not in job["method"]
    assert (resolved["beta"], resolved["learning_rate"]) == (0.1, 5e-5)
    assert (resolved["learning_rate_multiplier"], resolved["n_epochs"]) == (1.0, 3)
    row = TrainingJob.objects.get(public_id=job["id"])
    spec = specs.attempt_spec(attempt_start(job=row, target="local"))
    assert spec["method"] == "dpo" and spec["dataset"]["format"] == "preference"
    assert "beta" not in spec["hyperparameters"], "the default is left out for older executors"


def test_beta_and_the_multiplier_are_the_method_s(api, make_file) -> None:
    pairs = make_file(PAIRS).public_id
    job = _create(api, training_file=pairs, method=_dpo(0.3, learning_rate_multiplier=2)).json()
    assert job["method"]["dpo"]["hyperparameters"]["beta"] == 0.3
    assert job["method"]["dpo"]["hyperparameters"]["learning_rate"] == pytest.approx(1e-4)
    spec = specs.attempt_spec(
        attempt_start(job=TrainingJob.objects.get(public_id=job["id"]), target="local")
    )
    assert spec["hyperparameters"]["beta"] == 0.3
    sft = _create(api, training_file=make_file().public_id).json()
    assert "beta" not in sft["method"]["supervised"]["hyperparameters"]


def _upload(name: str, content: bytes) -> Any:
    from django.core.files.uploadedfile import SimpleUploadedFile

    return SimpleUploadedFile(name, content)


def _demo_upload() -> Any:
    from gpu_worker.tiny_model import DEMO_DATASET_PATH

    return _upload("demo.jsonl", DEMO_DATASET_PATH.read_bytes())


def test_the_method_and_its_files_must_agree_before_anything_is_queued(api, make_file) -> None:
    sft, pairs = make_file(), make_file(PAIRS)

    refused = [
        (_create(api, training_file=sft.public_id, method=_dpo()), "training_file", sft),
        (_create(api, training_file=pairs.public_id), "training_file", pairs),
        (
            _create(
                api, training_file=pairs.public_id, validation_file=sft.public_id, method=_dpo()
            ),
            "validation_file",
            sft,
        ),
    ]

    for response, param, file in refused:
        error = assert_error(response, 400, param=param, code="invalid_file")
        assert file.public_id in error["message"] and file.format in error["message"]
    assert not TrainingJob.objects.exists()


def test_a_file_validated_after_the_job_was_made_fails_the_job_when_it_does_not_fit(
    api, make_file
) -> None:
    sft = make_file(validate=False)
    job = _create(api, training_file=sft.public_id, method=_dpo()).json()
    assert job["status"] == "validating_files"

    file_validate(file_pk=sft.pk)

    row = TrainingJob.objects.get(public_id=job["id"])
    assert (row.status, row.error_code) == ("failed", "invalid_dataset")
    assert sft.public_id in row.error_message and "preference" in row.error_message
    assert not row.attempts.exists(), "no GPU was asked for"


# --- lineage ----------------------------------------------------------------------------------


def test_a_job_trains_on_from_a_succeeded_job_s_fine_tuned_model(api, ingested, make_file) -> None:
    parent, adapter, _ = ingested
    name = parent.fine_tuned_model_name

    created = _create(api, model=name, training_file=make_file(PAIRS).public_id, method=_dpo())

    assert created.status_code == 201, created.json()
    child = created.json()
    assert (child["model"], child["base_model"]) == (name, "acme/tiny-llama")
    assert child["parent"] == {
        "fine_tuned_model": name,
        "job_id": parent.public_id,
        "step_number": None,
        "sha256": adapter.sha256,
    }
    assert child["adapter"] == parent.adapter, "the parent's adapter is continued"
    assert child["fine_tuned_model"] is None
    spec = specs.attempt_spec(
        attempt_start(job=TrainingJob.objects.get(public_id=child["id"]), target="local")
    )
    assert spec["model"] == "acme/tiny-llama"
    assert spec["parent_adapter"]["sha256"] == adapter.sha256
    assert names(spec["parent_adapter"]["url"], adapter.storage_key, "GET")
    listed = api.get(f"{JOBS}/{child['id']}").json()
    assert listed["parent"]["job_id"] == parent.public_id


def test_another_project_s_or_an_unknown_ft_name_is_a_404(
    api, other_client, ingested, make_file
) -> None:
    parent = ingested.job
    theirs = parent.fine_tuned_model_name
    bob_file = other_client.post(
        "/v1/files", {"purpose": "fine-tune", "file": _demo_upload()}, format="multipart"
    ).json()["id"]

    assert_error(_create(other_client, model=theirs, training_file=bob_file), 404,
                 param="model", code="model_not_found")  # fmt: skip
    mine = make_file().public_id
    for made_up in (
        theirs.replace(parent.public_id.removeprefix("ftjob-"), "nosuchjob"),
        theirs.replace("acme/tiny-llama", "acme/other"),  # the right id, the wrong name
        f"{theirs}:ckpt-step-999",
        "ft:",
    ):
        assert_error(_create(api, model=made_up, training_file=mine), 404, param="model")
    assert TrainingJob.objects.count() == 1


def test_an_unfinished_job_cannot_be_trained_on_and_the_adapter_is_the_parent_s(
    api, make_job, ingested, make_file
) -> None:
    queued = make_job()
    mine = make_file().public_id
    error = assert_error(
        _create(api, model=queued.fine_tuned_model_name, training_file=mine),
        400,
        param="model",
        code="model_not_ready",
    )
    assert "queued" in error["message"]
    parent = ingested.job
    assert_error(
        _create(api, model=parent.fine_tuned_model_name, training_file=mine,
                adapter={"r": parent.adapter["r"] * 2}),
        400,
        param="adapter.r",
    )  # fmt: skip
    same = _create(api, model=parent.fine_tuned_model_name, training_file=mine,
                   adapter={"r": parent.adapter["r"]})  # fmt: skip
    assert same.status_code == 201, same.json()


def test_a_finished_job_s_newest_checkpoint_of_an_attempt_can_be_trained_on(
    api, make_job, make_file
) -> None:
    parent = make_job()
    attempt = attempt_start(job=parent, target="local")
    tar = b"a checkpoint tar"
    storage.save_stream(
        storage.checkpoint_key(parent.project_id, parent.public_id, attempt.number), [tar]
    )
    events_store(
        job=parent,
        attempt=attempt.number,
        events=[
            {"seq": 0, "type": "checkpoint", "level": "info", "message": "",
             "data": {"step": 5, "size": 3, "sha256": "0" * 64}},
            {"seq": 1, "type": "checkpoint", "level": "info", "message": "",
             "data": {"step": 10, "size": len(tar), "sha256": "1" * 64}},
        ],
    )  # fmt: skip
    assert attempt_end(attempt=attempt, reason=EndReason.WORKER_LOST)  # back to the queue
    job_cancel(job=TrainingJob.objects.get(pk=parent.pk))
    name = f"{parent.fine_tuned_model_name}:ckpt-step-10"
    mine = make_file().public_id

    created = _create(api, model=name, training_file=mine)
    assert created.status_code == 201, created.json()
    child = created.json()

    assert child["parent"]["step_number"] == 10 and child["parent"]["sha256"] == "1" * 64
    sealed = storage.sealed_key(
        storage.checkpoint_key(parent.project_id, parent.public_id, attempt.number)
    )
    row = TrainingJob.objects.get(public_id=child["id"])
    assert row.parent_key == sealed and b"".join(storage.read_chunks(sealed)) == tar
    stale = f"{parent.fine_tuned_model_name}:ckpt-step-5"  # overwritten by step 10
    assert_error(_create(api, model=stale, training_file=mine), 404, param="model")


def test_a_parent_is_not_deleted_under_a_live_child(api, ingested, make_file) -> None:
    parent = ingested.job
    child = _create(api, model=parent.fine_tuned_model_name, training_file=make_file().public_id)
    child_id = child.json()["id"]

    error = assert_error(api.delete(f"/api/v1/jobs/{parent.public_id}/"), 409,
                         code="job_has_live_children")  # fmt: skip
    assert child_id in error["message"]
    api.post(f"{JOBS}/{child_id}/cancel")
    assert api.delete(f"/api/v1/jobs/{parent.public_id}/").status_code == 200
    assert api.get(f"{JOBS}/{child_id}").json()["parent"]["job_id"] is None


# --- graded checkpoints ----------------------------------------------------------------------

EVAL_ITEMS = b"".join(
    json.dumps({"input": PAIR["input"], "reference": "Owl 1 is russet."}).encode() + b"\n"
    for _ in range(4)
)
EXACT = {"type": "string_check", "name": "exact", "operation": "eq",
         "input": "{{sample.output_text}}", "reference": "{{item.reference}}"}  # fmt: skip


def test_evals_and_best_eval_reach_the_spec_and_come_back_in_the_job(api, make_file) -> None:
    items = make_file(EVAL_ITEMS)
    assert items.format == "eval"
    created = _create(
        api,
        training_file=make_file().public_id,
        evals={"file": items.public_id, "grader": EXACT, "max_tokens": 32},
        checkpoint_selection="best_eval",
    )

    assert created.status_code == 201, created.json()
    job = created.json()
    assert job["evals"] == {"file": items.public_id, "grader": EXACT, "max_tokens": 32}
    assert job["checkpoint_selection"] == "best_eval"
    spec = specs.attempt_spec(
        attempt_start(job=TrainingJob.objects.get(public_id=job["id"]), target="local")
    )
    assert spec["evals"]["grader"] == EXACT and spec["evals"]["sha256"] == items.sha256
    assert names(spec["evals"]["url"], items.storage_key, "GET")
    assert spec["checkpoint_selection"] == "best_eval"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"checkpoint_selection": "best_eval"}, "checkpoint_selection"),  # nothing to score
        ({"checkpoint_selection": "best_valid_loss"}, "checkpoint_selection"),  # no validation
        ({"checkpoint_selection": "first"}, "checkpoint_selection"),
        ({"evals": "file-x"}, "evals"),
        ({"evals": {"file": "ITEMS", "grader": EXACT, "judge": 1}}, "evals.judge"),
        ({"evals": {"file": "SFT", "grader": EXACT}}, "evals.file"),  # not the eval format
        ({"evals": {"file": "file-nope", "grader": EXACT}}, "evals.file"),
        (
            {"evals": {"file": "ITEMS", "grader": {**EXACT, "operation": "gt"}}},
            "evals.grader.operation",
        ),
        (
            {"evals": {"file": "ITEMS", "grader": {**EXACT, "type": "score_model"}}},
            "evals.grader.type",
        ),
        ({"evals": {"file": "ITEMS", "grader": EXACT, "max_tokens": 0}}, "evals.max_tokens"),
    ],
)
def test_graded_checkpoints_refuse_what_cannot_be_scored(api, make_file, body, param) -> None:
    files = {"ITEMS": make_file(EVAL_ITEMS).public_id, "SFT": make_file().public_id}
    evals = body.get("evals")
    if isinstance(evals, dict):
        body = {**body, "evals": {**evals, "file": files.get(evals["file"], evals["file"])}}

    assert_error(_create(api, training_file=files["SFT"], **body), 400, param=param)
    assert not TrainingJob.objects.exists()


def test_another_project_s_evals_file_is_not_found(api, other_client, make_file) -> None:
    theirs = other_client.post(
        "/v1/files",
        {"purpose": "fine-tune", "file": _upload("items.jsonl", EVAL_ITEMS)},
        format="multipart",
    ).json()["id"]
    body = {"evals": {"file": theirs, "grader": EXACT}}
    assert_error(_create(api, training_file=make_file().public_id, **body), 400,
                 param="evals.file", code="file_not_found")  # fmt: skip
