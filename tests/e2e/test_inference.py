"""Deploying what a job trained, through the official ``openai`` SDK and real processes: a
GPU node trains the tiny model, the control plane's worker loads the adapter on an embedded
inference server (``python -m gpu_worker serve``, registered as an operator registers one)
through a signed URL it checks against the recorded sha256,
the model answers under its ``ft:`` name through trainhub's own ``/v1/chat/completions`` (the
web side redirects to the stream process, which relays, streamed or not), a second deployment
on a full server unloads the least recently used one, which a later call loads again, and
OpenAI's delete of a fine-tuned model undeploys it. Another project sees none of it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from jobs.models import Deployment, InferenceCall
from jobs.services.accounts.projects import api_key_create
from jobs.services.serving.servers import server_register
from tests.e2e.conftest import wait_for
from tests.e2e.test_openai_sdk import _create, _node, _upload, _wait_status

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

SERVER_KEY = "e2e-inference-key"
QUESTION = [  # a conversation of the demo data, without its answer
    {"role": "system", "content": "You are a concise assistant for the Owlbridge registry. "
     "Answer in one sentence."},
    {"role": "user", "content": "What colour is owl number 1?"},
]  # fmt: skip


@pytest.fixture(scope="module")
def embedded(tiny_model_dir: Path, tmp_path_factory: Any) -> Iterator[str]:
    """The embedded server for the tiny model, holding one adapter at a time."""
    cache = tmp_path_factory.mktemp("adapter-cache")
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpu_worker", "serve", str(tiny_model_dir), "--port", "0",
         "--served-model-name", "tiny", "--max-adapters", "1", "--api-key", SERVER_KEY,
         "--adapter-cache", str(cache)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"},
    )  # fmt: skip
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("serving on "), (line, proc.poll())
    yield line.removeprefix("serving on ").strip()
    proc.terminate()
    proc.wait(timeout=30)


def _state(client: openai.OpenAI, name: str) -> str | None:
    return (client.models.retrieve(name).model_extra or {}).get("state")


def _answer(client: openai.OpenAI, model: str) -> str:
    said = client.chat.completions.create(model=model, messages=QUESTION, temperature=0,
                                          max_tokens=16)  # fmt: skip
    assert said.model == model
    return str(said.choices[0].message.content)


def test_train_deploy_call_evict_and_delete_a_fine_tuned_model(
    client: openai.OpenAI, plane, start_node, demo_dataset, tiny_model_dir, embedded, make_user,
    stream_server, settings,
) -> None:  # fmt: skip
    settings.TRAINHUB_STREAM_URL = stream_server.url  # where the web side redirects completions
    server_register(name="tiny-cpu", url=embedded, base_model=str(tiny_model_dir),
                    served_name="tiny", api_key=SERVER_KEY, max_adapters=1)  # fmt: skip
    node = _node(start_node, "node-infer")
    training_file = _upload(client, demo_dataset, plane)
    first, second = (
        _wait_status(
            client,
            _create(client, str(tiny_model_dir), training_file, n_epochs=n).id,
            "succeeded",
            180,
            node,
            plane,
        )
        for n in (4, 1)
    )
    assert first.fine_tuned_model and second.fine_tuned_model
    with pytest.raises(openai.NotFoundError):  # not deployed yet
        _answer(client, first.fine_tuned_model)

    made = client.post(f"/fine_tuning/jobs/{first.id}/deploy", cast_to=object)
    assert made["id"] == first.fine_tuned_model and made["object"] == "model"
    again = client.post(f"/fine_tuning/jobs/{first.id}/deploy", cast_to=object)
    assert again["id"] == made["id"], "deploying twice is the same deployment"
    wait_for("the adapter loaded", lambda: _state(client, first.fine_tuned_model) == "loaded",
             60, plane)  # fmt: skip

    # Through trainhub (the web side redirects to the stream process, which relays) the answer
    # is the server's own, plain and streamed; usage is counted for the deployment.
    server = openai.OpenAI(base_url=embedded + "/v1", api_key=SERVER_KEY, max_retries=0)
    direct = _answer(server, first.fine_tuned_model)
    assert direct and _answer(client, first.fine_tuned_model) == direct
    chunks = list(client.chat.completions.create(
        model=first.fine_tuned_model, messages=QUESTION, temperature=0, max_tokens=16,
        stream=True, stream_options={"include_usage": True},
    ))  # fmt: skip
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == direct
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    counted = Deployment.objects.get(name=first.fine_tuned_model)
    assert (
        counted.requests == 2
        and counted.completion_tokens == 2 * chunks[-1].usage.completion_tokens
    )
    calls = list(InferenceCall.objects.filter(model=first.fine_tuned_model).order_by("pk"))
    assert [(c.streamed, c.status_code) for c in calls] == [(False, 200), (True, 200)]
    assert calls[1].first_token_ms is not None and calls[1].duration_ms >= calls[1].first_token_ms
    assert calls[1].completion_tokens == chunks[-1].usage.completion_tokens
    listed = {m.id for m in client.models.list()}
    assert {first.fine_tuned_model, str(tiny_model_dir)} <= listed

    # The server loses the adapter behind trainhub's back, as a restart does: its 404 has the
    # deployment placed again within the call, which then answers.
    server.post("/unload_lora_adapter", body={"lora_name": first.fine_tuned_model}, cast_to=str)
    assert first.fine_tuned_model not in {m.id for m in server.models.list()}
    assert _answer(client, first.fine_tuned_model) == direct
    assert first.fine_tuned_model in {m.id for m in server.models.list()}

    client.post(f"/fine_tuning/jobs/{second.id}/deploy", cast_to=object)
    wait_for("the second adapter loaded",
             lambda: _state(client, second.fine_tuned_model) == "loaded", 60, plane)  # fmt: skip
    assert _state(client, first.fine_tuned_model) == "pending", "unloaded to make room"
    assert {m.id for m in server.models.list()} == {"tiny", second.fine_tuned_model}
    # Called again, the unloaded one is loaded again (the other making room) and answers.
    assert _answer(client, first.fine_tuned_model) == direct
    assert {m.id for m in server.models.list()} == {"tiny", first.fine_tuned_model}

    bob = make_user("bob-infer")
    theirs = openai.OpenAI(base_url=client.base_url, api_key=api_key_create(user=bob, name="b")[1],
                           max_retries=0)  # fmt: skip
    for call in (lambda: theirs.models.retrieve(first.fine_tuned_model),
                 lambda: theirs.models.delete(first.fine_tuned_model),
                 lambda: _answer(theirs, first.fine_tuned_model)):  # fmt: skip
        with pytest.raises(openai.NotFoundError):
            call()
    assert first.fine_tuned_model not in {m.id for m in theirs.models.list()}

    deleted = client.models.delete(first.fine_tuned_model)
    assert deleted.deleted and deleted.id == first.fine_tuned_model
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve(first.fine_tuned_model)
    with pytest.raises(openai.NotFoundError):
        _answer(client, first.fine_tuned_model)
    assert {m.id for m in server.models.list()} == {"tiny"}, "unloaded from the server"
    assert Deployment.objects.filter(name=first.fine_tuned_model).get().undeployed_at
