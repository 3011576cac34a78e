"""The installed ``trainhub`` command against the live stack of tests/e2e (the web side on
pytest-django's live server, the stream process, the control plane's worker and a CPU GPU node
training the tiny model): upload → create → watch (live SSE) → download, a cancelled job's
exit code by polling, bad input named, login against the real key check."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import stat
import subprocess
import tarfile
import threading
import time
from pathlib import Path

import pytest

from gpu_worker.tiny_model import DEMO_DATASET_PATH
from jobs.models import TrainingJob
from jobs.services.fleet.nodes import node_create
from tests.cli.conftest import SCRIPT
from tests.e2e.conftest import Process, wait_for
from trainhub_cli.errors import ExitCode

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]
BROKEN = (
    b'{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}\n'
    b'{"messages": [{"role": "user", "content": "hi"}\n'
    b'{"messages": [{"role": "robot", "content": "beep"}]}\n'
)
TINY_JOB = ("--adapter", "lora", "-r", "8", "--alpha", "16", "--dropout", "0", "--epochs", "1",
            "--batch-size", "4", "--lr", "0.002", "--max-seq-length", "128", "--warmup-ratio", "0",
            "--no-gradient-checkpointing", "--eval-interval", "5", "--target", "local")  # fmt: skip


class Watch:
    """``trainhub jobs watch`` in the background, its stderr read line by line as it comes."""

    def __init__(self, env: dict[str, str], args: tuple[str, ...]) -> None:
        self.proc = subprocess.Popen(
            [str(SCRIPT), *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        self.said: list[str] = []
        assert self.proc.stderr is not None
        lines = iter(self.proc.stderr.readline, "")
        self.reader = threading.Thread(target=lambda: self.said.extend(lines), daemon=True)
        self.reader.start()

    def wait_said(self, text: str, *logs: Process) -> None:
        wait_for(f"the watch to say {text!r}", lambda: any(text in s for s in self.said), 30, *logs)

    def finish(self, timeout: float) -> tuple[int, str, str]:
        try:
            self.proc.wait(timeout=timeout)
            assert self.proc.stdout is not None
            stdout = self.proc.stdout.read()
        finally:
            self.proc.kill()
            self.reader.join(10)
        return self.proc.returncode, stdout, "".join(self.said)


def _json(result: subprocess.CompletedProcess[str]) -> dict:
    assert result.stdout, result.stderr
    return json.loads(result.stdout)


def test_upload_create_watch_download_on_the_tiny_model(
    plane,
    start_node,
    stream_server,
    settings,
    trainhub,
    env,
    cli_env,
    dataset,
    tiny_model_dir,
    tmp_path,
) -> None:
    settings.TRAINHUB_STREAM_URL = stream_server.url  # the web side names it; watch finds it
    uploaded = trainhub("files", "upload", str(dataset), "--json", env=env)
    assert uploaded.returncode == 0, uploaded.stderr
    file = _json(uploaded)
    assert file["status"] == "processed" and file["id"].startswith("file-")

    create = ("jobs", "create", "--model", str(tiny_model_dir), "--training-file", file["id"],
              *TINY_JOB, "--suffix", "cli", "--metadata", "via=cli", "--idempotency-key",
              f"cli-{time.time_ns()}", "--json")  # fmt: skip
    created = trainhub(*create, env=env)
    assert created.returncode == 0, created.stderr
    job = _json(created)
    assert job["adapter"]["r"] == 8 and job["hyperparameters"]["n_epochs"] == 1
    assert job["hyperparameters"]["eval_interval"] == 5
    assert job["metadata"] == {"via": "cli"} and job["target"] == "local"
    again = trainhub(*create, env=env)
    assert _json(again)["id"] == job["id"]  # the same Idempotency-Key: the first job

    # Watched from before it runs (a job already ended is answered at once, without a view).
    watch = Watch(env={**os.environ, **cli_env, **env}, args=("jobs", "watch", job["id"]))
    watch.wait_said("watching", plane)
    _, token = node_create(name="node-cli", actor="test")
    node = start_node("node-cli", token)
    code, stdout, stderr = watch.finish(timeout=240)
    assert code == 0, stderr + node.tail() + plane.tail()
    assert "polling" not in stderr  # it followed the live stream
    assert "status: running" in stderr and "step " in stderr
    assert f"{job['id']} succeeded" in stdout

    out = tmp_path / "out"
    downloaded = trainhub("--json", "jobs", "download", job["id"], str(out), env=env)
    assert downloaded.returncode == 0, downloaded.stderr
    record = _json(downloaded)["artifacts"][0]
    tar = Path(record["path"])
    stored = TrainingJob.objects.get(public_id=job["id"]).artifacts.get(kind="adapter")
    assert hashlib.sha256(tar.read_bytes()).hexdigest() == stored.sha256 == record["sha256"]
    folder = Path(record["extracted_to"])
    manifest = json.loads((folder / "manifest.json").read_text())["files"]
    assert {f["path"] for f in manifest} >= {"adapter_config.json"}
    for entry in manifest:
        assert hashlib.sha256((folder / entry["path"]).read_bytes()).hexdigest() == entry["sha256"]
    with tarfile.open(tar) as bundle:
        assert bundle.getnames()[0] == "manifest.json"
    printed = trainhub("jobs", "download", job["id"], str(tmp_path / "again"), env=env)
    assert printed.returncode == 0 and printed.stdout.strip().endswith(f"{job['id']}-adapter")

    # The adapter merged into its base, made by the control plane's worker, downloaded and
    # checked file by file; a plain model transformers loads without PEFT.
    exported = trainhub("--json", "jobs", "export", job["id"], "--download",
                        str(tmp_path / "merged"), "--timeout", "600", env=env)  # fmt: skip
    assert exported.returncode == 0, exported.stderr + plane.tail()
    merged = _json(exported)
    assert merged["status"] == "succeeded" and merged["artifact"]["kind"] == "merged"
    model_dir = Path(merged["extracted_to"])
    assert {"config.json", "model.safetensors"} <= {p.name for p in model_dir.iterdir()}
    assert not (model_dir / "adapter_config.json").exists()
    assert "merged" not in {a["kind"] for a in _json(downloaded)["artifacts"]}
    again_export = _json(trainhub("--json", "jobs", "export", job["id"], env=env))
    assert again_export["id"] == merged["id"], "asked again: the same export"

    listed = _json(trainhub("jobs", "list", "--json", "--metadata", "via=cli", env=env))
    assert [j["id"] for j in listed["data"]] == [job["id"]]
    assert _json(trainhub("jobs", "get", job["id"], "--json", env=env))["status"] == "succeeded"


def test_a_cancelled_job_ends_its_watch_with_11_by_polling(
    plane, trainhub, env, cli_env, dataset, tiny_model_dir, settings
) -> None:
    settings.TRAINHUB_STREAM_URL = ""
    with socket.socket() as s:  # a stream URL that answers nothing: watch falls back to polling
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    created = trainhub("jobs", "create", "--model", str(tiny_model_dir), "--training-file",
                       str(dataset), *TINY_JOB, "--gpu-count", "8", "--json", env=env)  # fmt: skip
    assert created.returncode == 0, created.stderr
    job_id = _json(created)["id"]
    environ = {**os.environ, **cli_env, **env, "TRAINHUB_STREAM_URL": dead}
    watch = Watch(env=environ, args=("jobs", "watch", job_id, "--interval", "0.3"))
    # Cancelled only once the watch follows it (else it would find the job already ended).
    watch.wait_said("polling", plane)
    assert TrainingJob.objects.get(public_id=job_id).status == "queued"
    cancelled = trainhub("jobs", "cancel", job_id, env=env)
    assert cancelled.returncode == 0, cancelled.stderr
    code, stdout, stderr = watch.finish(timeout=60)
    assert code == ExitCode.JOB_CANCELLED, stderr
    assert "unavailable" in stderr and "status: cancelled" in stderr
    assert f"{job_id} cancelled" in stdout


def test_bad_input_is_named_and_exits_non_zero(
    plane, trainhub, env, tmp_path, tiny_model_dir
) -> None:
    broken = tmp_path / "broken.jsonl"
    broken.write_bytes(BROKEN)
    result = trainhub("files", "upload", str(broken), env=env)
    assert result.returncode == ExitCode.DATASET_INVALID, result.stderr
    assert "line 2:" in result.stderr and "line 3:" in result.stderr
    as_json = trainhub("files", "upload", str(broken), "--json", env=env)
    assert as_json.returncode == ExitCode.DATASET_INVALID
    refusal = _json(as_json)
    assert refusal["error"]["code"] == "invalid_dataset"
    assert {e["line"] for e in refusal["file"]["errors"]} >= {2, 3}
    # a local path given to jobs create is uploaded first, and refused the same way
    refused = trainhub("jobs", "create", "--model", str(tiny_model_dir), "--training-file",
                       str(broken), env=env)  # fmt: skip
    assert refused.returncode == ExitCode.DATASET_INVALID and "line 2:" in refused.stderr
    assert not TrainingJob.objects.exists()

    good = _json(trainhub("files", "upload", str(DEMO_DATASET_PATH), "--json", env=env))["id"]
    model = trainhub("jobs", "create", "--model", "not a model", "--training-file", good, env=env)
    assert model.returncode == ExitCode.API and "param: model" in model.stderr, model.stderr
    rate = trainhub("--json", "jobs", "create", "--model", str(tiny_model_dir),
                    "--training-file", good, "--lr", "-1", env=env)  # fmt: skip
    assert rate.returncode == ExitCode.API
    assert _json(rate)["error"]["param"] == "hyperparameters.learning_rate"
    missing = trainhub("jobs", "get", "ftjob-nope", env=env)
    assert missing.returncode == ExitCode.API and "HTTP 404" in missing.stderr
    wrong_key = trainhub("jobs", "list", env={**env, "TRAINHUB_API_KEY": "th-not-a-key"})
    assert wrong_key.returncode == ExitCode.AUTH and "th-not-a-key" not in wrong_key.stderr
    nodes = trainhub("nodes", "list", env=env)  # an operator endpoint; alice is no staff
    assert nodes.returncode == ExitCode.AUTH, nodes.stderr


def test_login_verifies_the_key_and_stores_it_0600(
    plane, trainhub, live_server, key, cli_env
) -> None:
    bad = trainhub("login", "--url", live_server.url, "--api-key-stdin", input="th-wrong\n")
    assert bad.returncode == ExitCode.AUTH, bad.stderr
    path = Path(cli_env["XDG_CONFIG_HOME"]) / "trainhub" / "config.json"
    assert not path.exists()
    good = trainhub("login", "--url", f"{live_server.url}/v1", "--api-key-stdin", input=key + "\n")
    assert good.returncode == 0, good.stderr
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert json.loads(path.read_text())["api_key"] == key
    listed = trainhub("--json", "files", "list")  # the key from the file now
    assert listed.returncode == 0, listed.stderr
    assert _json(listed)["object"] == "list"
    for result in (bad, good, listed, trainhub("config")):
        assert key not in result.stdout + result.stderr


def test_a_dpo_job_with_graded_checkpoints_from_flags(
    plane, trainhub, env, tmp_path, tiny_model_dir
) -> None:
    pairs, items, grader = tmp_path / "pairs.jsonl", tmp_path / "evals.jsonl", tmp_path / "g.json"
    prompt = {"messages": [{"role": "user", "content": "What colour is owl 1?"}]}
    pairs.write_text("".join(json.dumps({
        "input": prompt,
        "preferred_output": [{"role": "assistant", "content": "Owl 1 is russet!"}],
        "non_preferred_output": [{"role": "assistant", "content": "Owl 1 is russet."}],
    }) + "\n" for _ in range(4)))  # fmt: skip
    items.write_text(json.dumps({"input": prompt, "reference": "russet"}) + "\n")
    grader.write_text(json.dumps({"type": "string_check", "name": "colour", "operation": "ilike",
                                  "input": "{{sample.output_text}}",
                                  "reference": "{{item.reference}}"}))  # fmt: skip
    base = ("jobs", "create", "--model", str(tiny_model_dir), "--training-file", str(pairs),
            "--method", "dpo", "--beta", "0.2", "--evals", str(items))  # fmt: skip

    alone = trainhub(*base, env=env)  # --evals without --grader
    assert alone.returncode == 2 and "--grader" in alone.stderr
    created = trainhub(*base, "--grader", f"@{grader}", "--eval-max-tokens", "16",
                       "--checkpoint-selection", "best_eval", "--json", env=env)  # fmt: skip

    assert created.returncode == 0, created.stderr
    job = _json(created)
    assert job["method"]["type"] == "dpo" and job["method"]["dpo"]["hyperparameters"]["beta"] == 0.2
    assert job["evals"]["grader"]["operation"] == "ilike" and job["evals"]["max_tokens"] == 16
    assert job["checkpoint_selection"] == "best_eval"
    shown = trainhub("jobs", "get", job["id"], env=env)
    assert shown.returncode == 0 and "best_eval" in shown.stdout and "dpo" in shown.stdout
