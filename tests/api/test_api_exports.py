"""Exports: a succeeded job's adapter merged into its base (``merged_safetensors``), made by the
``run_export`` task and downloaded like any artifact. The merged model, loaded by plain
transformers with no PEFT, answers exactly as the base with the adapter does; a bundle whose
bytes were changed is never merged; what cannot be exported is refused before anything queues."""

from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path

import pytest

from jobs import storage
from jobs.models import Artifact, Export, TrainingJob
from jobs.services.core.exports import export_run
from jobs.states import JobStatus
from tests.support.api import assert_error
from trainhub_contract import celery_conf as cc
from trainhub_contract.bundle import MANIFEST, verify_bundle, write_bundle

pytestmark = pytest.mark.usefixtures("sent")
PROMPT = "What colour is owl number 3?"


@pytest.fixture(scope="module")
def adapter_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A LoRA adapter with random (non-zero) weights on every linear layer of the tiny model."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    config = LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", init_lora_weights=False)
    out = tmp_path_factory.mktemp("adapter") / "adapter"
    get_peft_model(model, config).save_pretrained(str(out))
    return out


def _succeeded_job(make_job, tiny_model_dir: Path, bundle: bytes) -> TrainingJob:
    """A succeeded job of the tiny model whose adapter bundle is ``bundle``."""
    job = make_job()
    TrainingJob.objects.filter(pk=job.pk).update(
        status=JobStatus.SUCCEEDED, model=str(tiny_model_dir)
    )
    job.refresh_from_db()
    key = storage.bundle_key(job.project_id, job.public_id, 1)
    stored = storage.save_stream(key, [bundle])
    Artifact.objects.create(
        job=job, kind=Artifact.Kind.ADAPTER, storage_key=key, filename="adapter.tar",
        size=stored.size, sha256=stored.sha256, verified=True,
    )  # fmt: skip
    return job


def _bundle_of(folder: Path) -> bytes:
    buf = io.BytesIO()
    write_bundle(folder, buf)
    return buf.getvalue()


def _greedy(model, tokenizer, max_new_tokens: int = 12) -> tuple[list[int], object]:  # type: ignore[no-untyped-def]
    import torch

    ids = tokenizer(PROMPT, return_tensors="pt").input_ids
    with torch.no_grad():
        logits = model(ids).logits[0, -1]
        out = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False)
    return out[0, ids.shape[1] :].tolist(), logits


def test_the_merged_model_answers_as_the_base_with_its_adapter(
    api,
    make_job,
    tiny_model_dir: Path,
    adapter_dir: Path,
    sent,
    tmp_path: Path,
    django_capture_on_commit_callbacks,
) -> None:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    job = _succeeded_job(make_job, tiny_model_dir, _bundle_of(adapter_dir))
    url = f"/v1/fine_tuning/jobs/{job.public_id}/exports"
    with django_capture_on_commit_callbacks(execute=True):
        made = api.post(url, {"format": "merged_safetensors"}, format="json")
    assert made.status_code == 201, made.content
    export = made.json()
    assert export["status"] == "queued" and export["artifact"] is None
    assert sent.named(cc.RUN_EXPORT) == [[Export.objects.get().pk]]
    again = api.post(url, {"format": "merged_safetensors"}, format="json")
    assert again.status_code == 200 and again.json()["id"] == export["id"], "asked twice: one"
    assert cc.base_config("redis://x")["task_routes"][cc.RUN_EXPORT] == {"queue": "exports"}

    export_run(export_pk=Export.objects.get().pk)  # the task, as the exports worker runs it
    (done,) = api.get(url).json()["data"]
    assert done["status"] == "succeeded", done["error"]
    artifact = done["artifact"]
    assert artifact["kind"] == "merged" and artifact["verified"]
    listed = api.get(f"/v1/fine_tuning/jobs/{job.public_id}/artifacts").json()["data"]
    assert artifact["id"] in {a["id"] for a in listed}, "listed with the job's artifacts"

    download = api.get(f"/api/v1/artifacts/{artifact['id']}/download/")
    assert download.status_code == 200
    data = b"".join(download.streaming_content)
    assert hashlib.sha256(data).hexdigest() == artifact["sha256"] and len(data) == artifact["bytes"]
    verify_bundle([data])  # every file matches the manifest inside
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        names = {m.name for m in tar.getmembers()}
        tar.extractall(tmp_path / "merged", members=[m for m in tar.getmembers()
                                                     if m.name != MANIFEST], filter="data")  # fmt: skip
    assert {"config.json", "model.safetensors", "tokenizer_config.json"} <= names
    assert not any(n.startswith("adapter_") for n in names), "a plain model, no adapter left"

    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "merged")
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged", dtype=torch.float32)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    with_adapter = PeftModel.from_pretrained(base, adapter_dir)
    plain = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    merged_tokens, merged_logits = _greedy(merged, tokenizer)
    peft_tokens, peft_logits = _greedy(with_adapter, tokenizer)
    _, plain_logits = _greedy(plain, tokenizer)
    assert merged_tokens == peft_tokens
    assert torch.allclose(merged_logits, peft_logits, atol=1e-4)
    assert not torch.allclose(merged_logits, plain_logits, atol=1e-3), "the adapter is in there"


def test_a_bundle_whose_bytes_changed_is_never_merged(
    api, make_job, tiny_model_dir: Path, adapter_dir: Path
) -> None:
    bundle = bytearray(_bundle_of(adapter_dir))
    config_at = bundle.index(b'"peft_type"')
    bundle[config_at + 1 : config_at + 5] = b"PEFT"  # same size, other bytes than the manifest
    job = _succeeded_job(make_job, tiny_model_dir, bytes(bundle))
    api.post(f"/v1/fine_tuning/jobs/{job.public_id}/exports", {"format": "merged_safetensors"},
             format="json")  # fmt: skip
    export = export_run(export_pk=Export.objects.get().pk)
    assert export is not None and export.status == Export.Status.FAILED
    assert "damaged" in export.error and export.artifact is None
    assert not Artifact.objects.filter(kind=Artifact.Kind.MERGED).exists()
    (shown,) = api.get(f"/v1/fine_tuning/jobs/{job.public_id}/exports").json()["data"]
    assert shown["status"] == "failed" and shown["error"] == export.error
    retried = api.post(f"/v1/fine_tuning/jobs/{job.public_id}/exports",
                       {"format": "merged_safetensors"}, format="json")  # fmt: skip
    assert retried.status_code == 201, "a failed export is made again when asked"


@pytest.mark.parametrize(
    ("body", "param"),
    [({"format": "gguf"}, "format"), ({}, "format"), ({"format": 1}, "format"),
     ({"format": "merged_safetensors", "dtype": "fp8"}, "dtype")],
)  # fmt: skip
def test_what_cannot_be_exported_is_refused_before_anything_queues(
    api, other_client, make_job, ingested, sent, body: dict, param: str
) -> None:
    url = f"/v1/fine_tuning/jobs/{ingested.job.public_id}/exports"
    assert_error(api.post(url, body, format="json"), 400, param=param)
    assert_error(other_client.post(url, {"format": "merged_safetensors"}, format="json"), 404)
    assert_error(other_client.get(url), 404)
    queued = make_job()
    assert_error(api.post(f"/v1/fine_tuning/jobs/{queued.public_id}/exports",
                          {"format": "merged_safetensors"}, format="json"), 409,
                 code="job_not_exportable")  # fmt: skip
    assert not Export.objects.exists() and not sent.named(cc.RUN_EXPORT)
