"""``trainhub chat`` against trainhub's two doors scripted on loopback (_fake_inference.py: the
web server's 307 with a one-use grant, the stream process's SSE chunks): the text streamed, the
body re-sent through the redirect without the key, options as request fields, the prompt from
stdin, errors and cut streams with their exit codes, and a conversation at a real
pseudo-terminal (history, Ctrl-C, Ctrl-D). Against the real stack: tests/cli/live/test_chat.py."""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import threading
import time

import pytest

from tests.cli._fake_inference import Stream, Whole, completion, error, fake_inference
from tests.cli._terminal import Terminal, sigint_as_at_a_shell
from tests.cli.conftest import SCRIPT
from trainhub_cli.errors import ExitCode

KEY = "th-cli-chat-key-0123456789abcdefghijklmnop"
USAGE = {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12}
ASK = ("chat", "ft:acme/tiny:p::x", "What colour", "is owl 1?")
ASKED = {"model": "ft:acme/tiny:p::x", "stream": True,
         "messages": [{"role": "user", "content": "What colour is owl 1?"}]}  # fmt: skip
NOT_FOUND = error("The model 'ft:acme/tiny:p::x' does not exist or you do not have access to it.",
                  "model_not_found", "model")  # fmt: skip


def _env(fake) -> dict[str, str]:
    return {"TRAINHUB_URL": fake.web_url, "TRAINHUB_API_KEY": KEY}


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_one_shot_streams_the_answer_through_the_307_with_the_grant_alone(run_cli) -> None:
    with fake_inference() as fake:
        fake.answers = [Stream(["Owl 1 ", "is ", "russet."], usage=USAGE)]
        result = run_cli(*ASK, env=_env(fake))
    assert result.exit_code == 0, result.output
    assert result.stdout == "Owl 1 is russet.\n"
    assert result.stderr == ""
    assert [s.body for s in fake.web_seen] == [ASKED] and fake.asked == [ASKED]  # re-sent as is
    assert fake.web_seen[0].headers["Authorization"] == f"Bearer {KEY}"
    hop = fake.stream_seen[0]
    assert hop.query == {"grant": ["grant-0"]}
    assert "authorization" not in {h.lower() for h in hop.headers}  # another origin: no key


def test_options_are_request_fields_and_usage_goes_to_stderr(run_cli) -> None:
    with fake_inference() as fake:
        fake.answers = [Stream(["Brief."], usage=USAGE, finish="length")]
        result = run_cli("chat", "tiny", "hi", "--system", "Be brief.", "--temperature", "0",
                         "--top-p", "0.5", "--max-tokens", "8", "--seed", "7", "--stop", "###",
                         "--stop", "\n\n", "--usage", env=_env(fake))  # fmt: skip
    assert result.exit_code == 0, result.output
    assert fake.asked == [{
        "model": "tiny",
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
        "temperature": 0.0, "top_p": 0.5, "max_tokens": 8, "seed": 7, "stop": ["###", "\n\n"],
        "stream": True, "stream_options": {"include_usage": True},
    }]  # fmt: skip
    assert result.stdout == "Brief.\n"
    assert result.stderr.splitlines() == [
        "(the answer reached its token limit: raise it with --max-tokens)",
        "usage: 9 prompt + 3 completion = 12 tokens",
    ]


def test_no_stream_prints_the_whole_answer_and_json_the_whole_object(run_cli) -> None:
    whole = completion("Owl 1 is russet.", USAGE)
    with fake_inference() as fake:
        fake.answers = [Whole(whole)]
        plain = run_cli(*ASK, "--no-stream", "--usage", env=_env(fake))
        as_json = run_cli("--json", *ASK, "--usage", env=_env(fake))
    assert plain.exit_code == 0 and as_json.exit_code == 0, plain.output + as_json.output
    assert plain.stdout == "Owl 1 is russet.\n"
    assert plain.stderr == "usage: 9 prompt + 3 completion = 12 tokens\n"
    assert json.loads(as_json.stdout) == whole and as_json.stderr == ""
    assert fake.asked == [{**ASKED, "stream": False}] * 2  # --json: one answer, not streamed


@pytest.mark.parametrize("args", [(), ("-",)], ids=["piped", "dash"])
def test_the_prompt_comes_from_stdin(run_cli, args) -> None:
    with fake_inference() as fake:
        fake.answers = [Stream(["Russet."])]
        result = run_cli("chat", "tiny", *args, env=_env(fake), input="What colour\nis owl 1?\n")
        empty = run_cli("chat", "tiny", *args, env=_env(fake), input=" \n")
    assert result.exit_code == 0, result.output
    assert result.stdout == "Russet.\n"
    assert fake.asked[0]["messages"] == [{"role": "user", "content": "What colour\nis owl 1?"}]
    assert empty.exit_code == ExitCode.USAGE and "stdin is empty" in empty.stderr
    assert len(fake.asked) == 1  # the empty prompt was never sent


def test_an_unknown_model_is_the_api_s_error_with_the_models_to_ask(run_cli) -> None:
    with fake_inference() as fake:
        fake.answers = [Whole(NOT_FOUND, 404)]
        fake.models = ["ft:acme/tiny:p::y", "tiny"]
        result = run_cli(*ASK, env=_env(fake))
        as_json = run_cli(*ASK, "--json", env=_env(fake))
    assert result.exit_code == ExitCode.API
    assert result.stdout == ""
    assert result.stderr.strip() == (
        "error: The model 'ft:acme/tiny:p::x' does not exist or you do not have access to it. "
        "Models to ask: ft:acme/tiny:p::y, tiny. (param: model, code: model_not_found, HTTP 404)"
    )
    assert as_json.exit_code == ExitCode.API and json.loads(as_json.stdout) == NOT_FOUND


def test_refusals_at_the_web_server_exit_with_their_codes(run_cli) -> None:
    refused = error("Invalid or revoked API key.", "authentication_failed")
    unset = error("Completions are served by the stream process; the operator has not set "
                  "TRAINHUB_STREAM_URL.", "stream_url_unset")  # fmt: skip
    with fake_inference() as fake:
        fake.web_answers = [Whole(refused, 401), Whole(unset, 503)]
        key = run_cli(*ASK, env=_env(fake))
        stream = run_cli(*ASK, env=_env(fake))
    assert key.exit_code == ExitCode.AUTH and "Check the key" in key.stderr
    assert stream.exit_code == ExitCode.API
    assert "TRAINHUB_STREAM_URL" in stream.stderr and "HTTP 503" in stream.stderr
    assert fake.stream_seen == []


def test_a_model_being_loaded_is_asked_again(run_cli) -> None:
    loading = error("The model 'tiny' is being loaded on a server; retry shortly.",
                    "model_loading")  # fmt: skip
    with fake_inference() as fake:
        fake.answers = [Whole(loading, 503, {"Retry-After": "20"}), Stream(["Ready."])]
        result = run_cli(*ASK, env=_env(fake))
    assert result.exit_code == 0, result.output
    assert result.stdout == "Ready.\n"
    assert "being loaded on a server; asking again" in result.stderr
    assert fake.asked == [ASKED, ASKED]
    assert [s.query["grant"] for s in fake.stream_seen] == [["grant-0"], ["grant-1"]]  # each new


@pytest.mark.parametrize(
    ("stream", "shown", "said"),
    [
        (Stream(["Owl 1 ", "is ", "russet."], cut=2), "Owl 1 is \n", "cut off mid-stream"),
        (Stream(["Owl 1 ", "is ", "russet."], no_done=True), "Owl 1 is russet.\n", "[DONE]"),
    ],
    ids=["connection-dropped", "no-done"],
)
def test_a_stream_that_stops_short_keeps_what_came_and_exits_5(run_cli, stream, shown, said):
    with fake_inference() as fake:
        fake.answers = [stream]
        result = run_cli(*ASK, env=_env(fake))
    assert result.exit_code == ExitCode.NETWORK
    assert result.stdout == shown
    assert said in result.stderr and "Ask again" in result.stderr


def test_an_error_event_in_the_stream_is_an_api_error(run_cli) -> None:
    failed = error("The server failed to answer; see its log.", "server_error")
    with fake_inference() as fake:
        fake.answers = [Stream(["Owl"], error=failed)]
        result = run_cli(*ASK, env=_env(fake))
    assert result.exit_code == ExitCode.API
    assert result.stdout == "Owl\n"
    assert "The server failed to answer" in result.stderr


def test_a_stream_process_that_cannot_be_reached_is_a_network_error(run_cli) -> None:
    with fake_inference() as fake:
        fake.stream_url = f"http://127.0.0.1:{_closed_port()}"
        result = run_cli(*ASK, env=_env(fake))
    assert result.exit_code == ExitCode.NETWORK
    assert f"{fake.stream_url}/api/v1/chat/completions: could not connect" in result.stderr
    assert "grant" not in result.stderr  # the redirect's credential is not shown


def _read_until(proc: subprocess.Popen[bytes], text: bytes, timeout: float = 60) -> bytes:
    assert proc.stdout is not None
    got, deadline = b"", time.monotonic() + timeout
    while text not in got and time.monotonic() < deadline:
        if select.select([proc.stdout], [], [], 0.5)[0]:
            got += os.read(proc.stdout.fileno(), 1024)
    return got


@pytest.mark.slow  # starts the console script
def test_the_console_script_writes_each_piece_as_it_comes(cli_env) -> None:
    """The second piece is held until the first has reached the program's stdout pipe; a
    Ctrl-C (SIGINT) then stops the answer: a newline after what came, exit 130."""
    gate = threading.Event()
    with fake_inference() as fake:
        fake.answers = [Stream(["Owl 1 ", "is russet."], gate=gate)]
        env = {**os.environ, **cli_env, **_env(fake)}
        proc = subprocess.Popen([str(SCRIPT), *ASK], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, preexec_fn=sigint_as_at_a_shell)  # fmt: skip
        first = _read_until(proc, b"Owl 1 ")
        gate.set()
        rest, stderr = proc.communicate(timeout=60)
        assert first == b"Owl 1 ", stderr
        assert first + rest == b"Owl 1 is russet.\n" and proc.returncode == 0

        held = threading.Event()
        fake.answers = [Stream(["Owl 1 ", "is russet."], gate=held)]
        proc = subprocess.Popen([str(SCRIPT), *ASK], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, preexec_fn=sigint_as_at_a_shell)  # fmt: skip
        first = _read_until(proc, b"Owl 1 ")
        proc.send_signal(signal.SIGINT)
        rest, stderr = proc.communicate(timeout=60)
        held.set()
    assert first + rest == b"Owl 1 \n"
    assert proc.returncode == ExitCode.INTERRUPTED and b"Traceback" not in stderr
    assert b"interrupted" in stderr


@pytest.mark.slow  # starts the console script
def test_a_conversation_at_a_terminal(cli_env) -> None:
    """Each question goes with the conversation before it; a stopped (Ctrl-C) or failed one is
    left out; /clear starts over; Ctrl-D at the prompt ends it with 0."""
    held = threading.Event()
    system = {"role": "system", "content": "Be brief."}
    u1, a1 = {"role": "user", "content": "Owl 1?"}, {"role": "assistant", "content": "Russet."}
    u2, a2 = {"role": "user", "content": "Owl 2?"}, {"role": "assistant", "content": "Grey."}
    u5 = {"role": "user", "content": "Owl 5?"}
    too_long = error("This model's maximum context length is 512 tokens.",
                     "context_length_exceeded", "messages")  # fmt: skip
    with fake_inference() as fake:
        fake.answers = [
            Stream(["Russet."]),
            Stream(["Gr", "ey."], usage=USAGE),
            Stream(["Owl 3 ", "is white."], gate=held),
            Whole(too_long, 400),
            Stream(["Brown."]),
            Stream(["Hello."]),
        ]
        with Terminal("chat", "tiny", "--system", "Be brief.", "--usage",
                      env={**os.environ, **cli_env, **_env(fake)}) as term:  # fmt: skip
            term.expect("Chatting with tiny")
            term.line("Owl 1?")
            term.expect("Russet.")
            term.line("Owl 2?")
            assert "Grey." in term.expect("usage: 9 prompt + 3 completion = 12 tokens")
            term.line("Owl 3?")
            term.expect("Owl 3 ")
            term.type("\x03")  # Ctrl-C while it answers
            term.expect("(stopped: this question is left out of the conversation)")
            held.set()  # the rest goes to a closed connection
            term.line("Owl 4?")
            term.expect("maximum context length is 512 tokens")
            term.line("Owl 5?")
            term.expect("Brown.")
            term.line("/clear")
            term.expect("conversation cleared")
            term.line("Hi")
            term.expect("Hello.")
            term.at_prompt()
            term.type("\x04")  # Ctrl-D at an empty line
            code = term.finish()
    assert code == 0, term.output
    assert "Traceback" not in term.output
    assert [b["messages"] for b in fake.asked] == [
        [system, u1],
        [system, u1, a1, u2],
        [system, u1, a1, u2, a2, {"role": "user", "content": "Owl 3?"}],
        [system, u1, a1, u2, a2, {"role": "user", "content": "Owl 4?"}],
        [system, u1, a1, u2, a2, u5],
        [system, {"role": "user", "content": "Hi"}],
    ]
    assert all(b["stream_options"] == {"include_usage": True} for b in fake.asked)


@pytest.mark.slow
@pytest.mark.parametrize("leave", ["\x03", "/exit\r"], ids=["ctrl-c", "exit"])
def test_leaving_a_conversation_at_the_prompt_is_clean(cli_env, leave) -> None:
    with (
        fake_inference() as fake,
        Terminal("chat", "tiny", env={**os.environ, **cli_env, **_env(fake)}) as term,
    ):
        term.at_prompt()
        term.type(leave)
        code = term.finish()
    assert code == 0, term.output
    assert "Traceback" not in term.output and "Aborted" not in term.output
    assert fake.web_seen == []


@pytest.mark.slow  # starts the console script
def test_a_model_that_does_not_exist_ends_the_conversation(cli_env) -> None:
    with fake_inference() as fake:
        fake.answers = [Whole(NOT_FOUND, 404)]
        env = {**os.environ, **cli_env, **_env(fake)}
        with Terminal("chat", "ft:acme/tiny:p::x", env=env) as term:
            term.line("Hi")
            term.expect("does not exist")
            code = term.finish()
    assert code == ExitCode.API, term.output
