"""Fixtures for the executor tests: the tiny model (built once per session), datasets in every
format derived from the bundled demo chat data, and a helper that runs the real executor with
file:// URLs in a temporary directory."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpu_worker.tiny_model import DEMO_DATASET_PATH


def _demo_records() -> list[dict[str, Any]]:
    with DEMO_DATASET_PATH.open(encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def _as_format(record: dict[str, Any], fmt: str) -> dict[str, Any]:
    by_role = {m["role"]: m["content"] for m in record["messages"]}
    system, user, answer = by_role.get("system", ""), by_role["user"], by_role["assistant"]
    if fmt == "messages":
        return record
    if fmt == "alpaca":
        return {"instruction": user, "input": system, "output": answer}
    if fmt == "prompt_completion":
        return {"prompt": f"Question: {user}\nAnswer: ", "completion": answer}
    if fmt == "text":
        return {"text": f"{user} {answer}"}
    raise ValueError(fmt)


def write_jsonl(path: Path, records: Sequence[dict[str, Any]] | Sequence[str]) -> tuple[Path, str]:
    """Write records (dicts, or raw lines) as JSONL; returns (path, sha256)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [r if isinstance(r, str) else json.dumps(r) for r in records]
    data = ("\n".join(lines) + "\n").encode()
    path.write_bytes(data)
    return path, hashlib.sha256(data).hexdigest()


@pytest.fixture(scope="session")
def dataset_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, str]]:
    """format -> (path, sha256) of the 60 demo examples in that format."""
    root = tmp_path_factory.mktemp("datasets")
    records = _demo_records()
    return {
        fmt: write_jsonl(root / f"{fmt}.jsonl", [_as_format(r, fmt) for r in records])
        for fmt in ("messages", "alpaca", "prompt_completion", "text")
    }


@dataclass
class Outcome:
    result: Any  # gpu_worker.train.RunResult
    events: list[dict[str, Any]]
    out_dir: Path  # where the artifact/checkpoint URLs point
    workdir: Path

    @property
    def artifact(self) -> Path:
        return self.out_dir / "adapter.tar"

    @property
    def checkpoint(self) -> Path:
        return self.out_dir / "checkpoint.tar"

    def of_type(self, type_: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["type"] == type_]

    @property
    def final_status(self) -> dict[str, Any]:
        return self.of_type("status")[-1]


def spec_dict(
    model: Path | str,
    dataset: tuple[Path, str],
    out_dir: Path,
    *,
    fmt: str = "messages",
    adapter: str = "lora",
    attempt: int = 1,
    resume: Path | None = None,
    **hyper: Any,
) -> dict[str, Any]:
    path, sha256 = dataset
    hp = {"n_epochs": 1, "batch_size": 4, "learning_rate": 2e-3, "max_seq_length": 128,
          "warmup_ratio": 0.0, **hyper}  # fmt: skip
    return {
        "version": 1,
        "job_id": "ftjob-test",
        "attempt": attempt,
        "model": str(model),
        "dataset": {"url": path.as_uri(), "sha256": sha256, "format": fmt},
        "outputs": {
            "artifact_url": (out_dir / "adapter.tar").as_uri(),
            "checkpoint_url": (out_dir / "checkpoint.tar").as_uri(),
            "resume_url": resume.as_uri() if resume else None,
        },
        "adapter": {"type": adapter, "r": 8, "alpha": 16, "dropout": 0.0},
        "hyperparameters": hp,
        "seed": 7,
    }


@pytest.fixture(scope="session")
def tok(tiny_model_dir: Path) -> Any:
    """The tiny model's tokenizer."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture
def run_executor(tmp_path: Path) -> Iterator[Callable[..., Outcome]]:
    """``run_executor(spec_or_dict, **run_kwargs) -> Outcome``: the real train.run with a
    MemorySink reporter; every call gets its own workdir under tmp_path."""
    from gpu_worker import train
    from gpu_worker.report import MemorySink, Reporter
    from trainhub_contract.spec import JobSpec, parse_job_spec

    counter = iter(range(1000))

    def call(spec: JobSpec | dict[str, Any], **kwargs: Any) -> Outcome:
        if isinstance(spec, dict):
            spec = parse_job_spec(spec)
        out_dir = Path(spec.outputs.artifact_url.removeprefix("file://")).parent
        workdir = tmp_path / f"work{next(counter)}"
        workdir.mkdir()
        sink = MemorySink()
        with Reporter(job_id=spec.job_id, attempt=spec.attempt, sinks=[sink]) as reporter:
            result = train.run(spec, reporter=reporter, workdir=workdir, **kwargs)
        return Outcome(result, sink.events, out_dir, workdir)

    yield call
