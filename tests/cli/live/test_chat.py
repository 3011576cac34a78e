"""``trainhub chat`` through the real stack: the installed console script posts to the web side
(pytest-django's live server), follows its 307 with the one-use grant to the stream process,
which relays to an embedded inference server (``python -m gpu_worker serve``) holding the tiny
model, registered as an operator registers one. Its answers must be the server's own, streamed
or whole, alone or within a conversation at a terminal."""

from __future__ import annotations

import json
import os
from typing import Any

import httpx
import pytest

from jobs.services.serving.servers import server_register
from tests.cli._terminal import Terminal
from tests.e2e import test_inference
from tests.e2e.test_inference import QUESTION, SERVER_KEY
from trainhub_cli.errors import ExitCode

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]
SAMPLING = {"temperature": 0, "max_tokens": 12}
embedded = test_inference.embedded  # the tiny model's embedded server (module-scoped), reused


def _direct(server: str, messages: list[dict[str, str]]) -> dict[str, Any]:
    """The inference server's own answer, asked without trainhub."""
    answer = httpx.post(f"{server}/v1/chat/completions", timeout=120,
                        json={"model": "tiny", "messages": messages, **SAMPLING},
                        headers={"Authorization": f"Bearer {SERVER_KEY}"})  # fmt: skip
    assert answer.status_code == 200, answer.text
    return answer.json()


@pytest.fixture
def served(embedded: str, tiny_model_dir, stream_server, settings) -> str:
    """The tiny model served as a base model; its name (the model's path) as the API lists it."""
    settings.TRAINHUB_STREAM_URL = stream_server.url  # where the web side redirects completions
    server_register(name="tiny-cli", url=embedded, base_model=str(tiny_model_dir),
                    served_name="tiny", api_key=SERVER_KEY, max_adapters=1)  # fmt: skip
    return str(tiny_model_dir)


def test_one_answer_streamed_and_whole_is_the_server_s_own(served, embedded, trainhub, env) -> None:
    direct = _direct(embedded, QUESTION)
    text = direct["choices"][0]["message"]["content"]
    assert text, "the tiny model said nothing: nothing to compare"
    args = ("chat", served, QUESTION[1]["content"], "--system", QUESTION[0]["content"],
            "--temperature", "0", "--max-tokens", "12")  # fmt: skip

    streamed = trainhub(*args, "--usage", env=env)
    assert streamed.returncode == 0, streamed.stderr
    assert streamed.stdout == text + "\n"
    assert _usage_line(direct) in streamed.stderr
    cut = direct["choices"][0]["finish_reason"] == "length"
    assert ("token limit" in streamed.stderr) == cut

    whole = trainhub(*args, "--json", env=env)
    assert whole.returncode == 0, whole.stderr
    obj = json.loads(whole.stdout)
    assert obj["object"] == "chat.completion" and obj["model"] == served  # the caller's name
    assert obj["choices"][0]["message"]["content"] == text and obj["usage"] == direct["usage"]

    piped = trainhub("chat", served, "-", "--system", QUESTION[0]["content"], "--temperature",
                     "0", "--max-tokens", "12", "--no-stream", env=env,
                     input=QUESTION[1]["content"] + "\n")  # fmt: skip
    assert piped.returncode == 0 and piped.stdout == text + "\n", piped.stderr


def test_refusals_of_the_real_stack(served, trainhub, env) -> None:
    unknown = trainhub("chat", "ft:acme/nope:x::y", "hi", env=env)
    assert unknown.returncode == ExitCode.API, unknown.stderr
    assert "'ft:acme/nope:x::y' does not exist" in unknown.stderr
    assert f"Models to ask: {served}." in unknown.stderr  # GET /v1/models
    assert "code: model_not_found" in unknown.stderr and unknown.stdout == ""
    wrong_key = trainhub("chat", served, "hi", env={**env, "TRAINHUB_API_KEY": "th-not-a-key"})
    assert wrong_key.returncode == ExitCode.AUTH and "th-not-a-key" not in wrong_key.stderr
    bad = trainhub("chat", served, "hi", "--stop", "a", "--stop", "b", "--stop", "c", "--stop",
                   "d", "--stop", "e", env=env)  # fmt: skip
    assert bad.returncode == ExitCode.API and "param: stop" in bad.stderr, bad.stderr


def _usage_line(answer: dict[str, Any]) -> str:
    u = answer["usage"]
    return (f"usage: {u['prompt_tokens']} prompt + {u['completion_tokens']} completion "
            f"= {u['total_tokens']} tokens")  # fmt: skip


def test_a_conversation_sends_its_history(served, embedded, env, cli_env) -> None:
    """The second answer and its prompt's token count are the server's own for the whole
    conversation (the tiny model's text alone may not tell the two turns apart)."""
    first = _direct(embedded, QUESTION)
    said = first["choices"][0]["message"]["content"]
    follow = {"role": "user", "content": "And owl number 2?"}
    second = _direct(embedded, [*QUESTION, {"role": "assistant", "content": said}, follow])
    assert second["usage"]["prompt_tokens"] > first["usage"]["prompt_tokens"]
    args = ("chat", served, "--system", QUESTION[0]["content"], "--temperature", "0",
            "--max-tokens", "12", "--usage")  # fmt: skip
    with Terminal(*args, env={**os.environ, **cli_env, **env}) as term:
        term.line(QUESTION[1]["content"])
        shown = term.expect(">>> ")
        term.type(follow["content"] + "\r")
        shown_next = term.expect(">>> ")
        term.type("/exit\r")
        code = term.finish()
    assert code == 0, term.output
    for answer, where in ((first, shown), (second, shown_next)):
        # The terminal shows "\r\n" for each newline of the answer.
        text = answer["choices"][0]["message"]["content"].replace("\n", "\r\n")
        assert f"{text}\r\n" in where and _usage_line(answer) in where, term.output
