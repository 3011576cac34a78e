"""The embedded server (``python -m gpu_worker serve``) as a real process on loopback, driven by
the official ``openai`` SDK and plain HTTP: a greedy answer is token for token what
``PeftModel.generate`` gives for the same adapter and messages, streamed or not, with the
tokenizer's counts; vLLM's adapter endpoints load, list, reuse and evict (least recently used);
what a client gets wrong is a 4xx in OpenAI's error shape."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.gpu_worker.conftest import _demo_records, spec_dict
from trainhub_contract.bundle import MANIFEST

KEY = "serve-test-key"
MAX_ADAPTERS = 2
QUESTION = _demo_records()[4]["messages"][:-1]  # a system prompt and a question


@dataclass
class Served:
    url: str
    proc: subprocess.Popen[str]

    def post(self, path: str, body: Any, key: str | None = KEY) -> httpx.Response:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.post(self.url + path, json=body, headers=headers, timeout=60)


@pytest.fixture(scope="module")
def adapter_dir(tiny_model_dir: Path, dataset_files: dict, tmp_path_factory: Any) -> Path:
    """A LoRA adapter trained on the demo chats by the real executor, unpacked."""
    from gpu_worker import train
    from gpu_worker.report import MemorySink, Reporter
    from trainhub_contract.spec import parse_job_spec

    root = tmp_path_factory.mktemp("adapter")
    spec = parse_job_spec(
        spec_dict(tiny_model_dir, dataset_files["messages"], root / "out", n_epochs=3)
    )
    with Reporter(job_id=spec.job_id, attempt=1, sinks=[MemorySink()]) as reporter:
        result = train.run(spec, reporter=reporter, workdir=root / "work")
    assert result.status == "succeeded", result.message
    with tarfile.open(root / "out" / "adapter.tar") as tar:
        members = [m for m in tar.getmembers() if m.name != MANIFEST]
        tar.extractall(root / "adapter", members=members, filter="data")
    return root / "adapter"


def _bundle(adapter_dir: Path) -> tuple[Path, str]:
    """The adapter's bundle as the executor uploaded it, and its sha256."""
    tar = adapter_dir.parent / "out" / "adapter.tar"
    return tar, hashlib.sha256(tar.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def served(tiny_model_dir: Path) -> Iterator[Served]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpu_worker", "serve", str(tiny_model_dir), "--port", "0",
         "--max-adapters", str(MAX_ADAPTERS), "--served-model-name", "tiny", "--api-key", KEY],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"},
    )  # fmt: skip
    assert proc.stdout is not None
    line = proc.stdout.readline()  # blocks until it listens (or dies: an empty line)
    assert line.startswith("serving on "), (line, proc.poll())
    yield Served(line.removeprefix("serving on ").strip(), proc)
    proc.terminate()
    assert proc.wait(timeout=30) == 0


def _local_answer(
    tiny_model_dir: Path, adapter_dir: Path, max_tokens: int
) -> tuple[list[int], list[int]]:
    """The prompt ids and the greedy new tokens of PeftModel.generate, as a script gets them."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32), adapter_dir
    ).eval()
    prompt = list(
        tok.apply_chat_template(QUESTION, add_generation_prompt=True, return_dict=True)["input_ids"]
    )
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=max_tokens, do_sample=False,
                             pad_token_id=tok.eos_token_id)  # fmt: skip
    new = out[0, len(prompt) :].tolist()
    if tok.eos_token_id in new:
        new = new[: new.index(tok.eos_token_id)]
    return prompt, new


def test_a_greedy_answer_is_the_adapter_s_own_streamed_or_not(
    served: Served, adapter_dir: Path, tiny_model_dir: Path
) -> None:
    from transformers import AutoTokenizer

    loaded = served.post(
        "/v1/load_lora_adapter", {"lora_name": "owls", "lora_path": str(adapter_dir)}
    )
    assert loaded.status_code == 200, loaded.text
    assert loaded.text == "Success: LoRA adapter 'owls' added successfully."
    client = openai.OpenAI(base_url=served.url + "/v1", api_key=KEY, max_retries=0)
    prompt, expected = _local_answer(tiny_model_dir, adapter_dir, max_tokens=24)
    text = AutoTokenizer.from_pretrained(tiny_model_dir).decode(expected, skip_special_tokens=True)

    whole = client.chat.completions.create(model="owls", messages=QUESTION, temperature=0,
                                           max_tokens=24)  # fmt: skip
    assert whole.choices[0].message.content == text and text
    assert whole.usage is not None
    assert (whole.usage.prompt_tokens, whole.usage.completion_tokens) == (
        len(prompt),
        len(expected),
    )
    chunks = list(client.chat.completions.create(
        model="owls", messages=QUESTION, temperature=0, max_tokens=24, stream=True,
        stream_options={"include_usage": True},
    ))  # fmt: skip
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == text
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == len(expected)
    finish = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finish == [whole.choices[0].finish_reason]
    base = client.chat.completions.create(model="tiny", messages=QUESTION, temperature=0,
                                          max_tokens=24)  # fmt: skip
    assert base.choices[0].message.content != text, "the base model is not the adapter"


def test_adapters_are_listed_reused_and_the_least_recently_used_goes_first(
    served: Served, adapter_dir: Path
) -> None:
    for name in ("first", "second"):
        served.post("/v1/unload_lora_adapter", {"lora_name": name})  # whatever an earlier test left
    served.post("/v1/unload_lora_adapter", {"lora_name": "owls"})
    path = str(adapter_dir)
    assert (
        served.post("/v1/load_lora_adapter", {"lora_name": "first", "lora_path": path}).status_code
        == 200
    )
    assert (
        served.post("/v1/load_lora_adapter", {"lora_name": "second", "lora_path": path}).status_code
        == 200
    )
    again = served.post("/v1/load_lora_adapter", {"lora_name": "first", "lora_path": path})
    assert again.status_code == 400 and "already been loaded" in again.json()["error"]["message"]
    ask = {"messages": QUESTION, "max_tokens": 2, "temperature": 0}
    assert served.post("/v1/chat/completions", {**ask, "model": "first"}).status_code == 200

    third = served.post("/v1/load_lora_adapter", {"lora_name": "third", "lora_path": path})

    assert third.status_code == 200
    listed = httpx.get(served.url + "/v1/models", headers={"Authorization": f"Bearer {KEY}"}).json()
    assert [(m["id"], m["parent"]) for m in listed["data"]] == [
        ("tiny", None),
        ("first", "tiny"),
        ("third", "tiny"),
    ], "second was the least recently used"
    for stream in (False, True):  # streamed too: refused before the stream begins, as vLLM does
        gone = served.post("/v1/chat/completions", {**ask, "model": "second", "stream": stream})
        assert gone.status_code == 404 and gone.json()["error"]["code"] == "model_not_found"
    assert served.post("/v1/unload_lora_adapter", {"lora_name": "second"}).status_code == 404
    assert served.post("/v1/unload_lora_adapter", {"lora_name": "first"}).status_code == 200


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [
        ("/v1/chat/completions", {"model": "tiny", "messages": QUESTION, "n": 2}, 400, "n"),
        ("/v1/chat/completions", {"model": "tiny", "messages": QUESTION, "max_tokens": 0}, 400, "max_tokens"),
        ("/v1/chat/completions", {"model": "tiny", "messages": QUESTION, "temperature": 3}, 400, "temperature"),
        ("/v1/chat/completions", {"model": "tiny", "messages": QUESTION, "stop": 4}, 400, "stop"),
        ("/v1/chat/completions", {"model": "tiny", "messages": QUESTION, "bogus": 1}, 400, "bogus"),
        ("/v1/chat/completions", {"model": "tiny", "messages": "hi"}, 400, "messages"),
        ("/v1/chat/completions", {"model": "nope", "messages": QUESTION}, 404, "model"),
        ("/v1/completions", {"model": "tiny", "prompt": ""}, 400, "prompt"),
        ("/v1/load_lora_adapter", {"lora_name": "x", "lora_path": "/etc"}, 400, "lora_path"),
        ("/v1/load_lora_adapter", {"lora_name": "tiny", "lora_path": "/etc"}, 400, "lora_name"),
    ],
)  # fmt: skip
def test_a_bad_request_is_a_4xx_in_openai_s_shape(
    served: Served, path: str, body: dict[str, Any], status: int, param: str
) -> None:
    answer = served.post(path, body)
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert error["param"] == param and error["message"] and error["type"] == "invalid_request_error"


def test_the_api_key_and_the_body_are_checked_before_anything_runs(served: Served) -> None:
    ask = {"model": "tiny", "messages": QUESTION, "max_tokens": 2}
    assert served.post("/v1/chat/completions", ask, key=None).status_code == 401
    assert served.post("/v1/chat/completions", ask, key="wrong").status_code == 401
    assert httpx.get(served.url + "/health").status_code == 200, "health needs no key"
    broken = httpx.post(served.url + "/v1/chat/completions", content=b"{oops",
                        headers={"Authorization": f"Bearer {KEY}"})  # fmt: skip
    assert broken.status_code == 400 and "not valid JSON" in broken.json()["error"]["message"]
    text = served.post("/v1/completions", {"model": "tiny", "prompt": "Owl number", "max_tokens": 3,
                                           "temperature": 0, "stop": ["zzz"]})  # fmt: skip
    assert text.status_code == 200 and text.json()["object"] == "text_completion"
    assert json.loads(text.text)["usage"]["completion_tokens"] <= 3


def test_a_bundle_url_is_loaded_only_when_its_bytes_are_the_recorded_ones(
    served: Served, adapter_dir: Path, tmp_path: Path
) -> None:
    tar, sha256 = _bundle(adapter_dir)
    corrupted = tmp_path / "corrupted.tar"
    with tarfile.open(tar) as bundle:
        weights = bundle.getmember("adapter_model.safetensors").offset_data
    data = bytearray(tar.read_bytes())
    data[weights + 100] ^= 0xFF  # the weights no longer match the manifest's hash
    corrupted.write_bytes(bytes(data))

    refused = [
        {"lora_name": "bad-sha", "lora_path": tar.as_uri(), "sha256": "0" * 64},
        {"lora_name": "no-sha", "lora_path": tar.as_uri()},
        {"lora_name": "bad-bytes", "lora_path": corrupted.as_uri(),
         "sha256": hashlib.sha256(bytes(data)).hexdigest()},
    ]  # fmt: skip
    for body in refused:
        answer = served.post("/v1/load_lora_adapter", body)
        assert answer.status_code == 400, answer.text
    listed = httpx.get(served.url + "/v1/models", headers={"Authorization": f"Bearer {KEY}"})
    assert not {b["lora_name"] for b in refused} & {m["id"] for m in listed.json()["data"]}

    body = {"lora_name": "fetched", "lora_path": tar.as_uri(), "sha256": sha256}
    assert served.post("/v1/load_lora_adapter", body).status_code == 200
    ask = {"model": "fetched", "messages": QUESTION, "max_tokens": 4, "temperature": 0}
    assert served.post("/v1/chat/completions", ask).status_code == 200
    assert served.post("/v1/unload_lora_adapter", {"lora_name": "fetched"}).status_code == 200
