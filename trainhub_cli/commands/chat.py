"""``trainhub chat MODEL [PROMPT]``: ask a deployed fine-tuned model (``ft:…``) or a base model
a server serves, through the API's OpenAI ``/chat/completions`` (the web server's 307 to the
stream process is followed by ``Api.completion``).

With a prompt (or ``-``, or none and stdin piped: the prompt read from stdin) one answer is
streamed to stdout as it comes; with none at a terminal, a conversation: each question is sent
with the ones before it and their answers.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
from dataclasses import dataclass
from typing import Any

import click
import httpx
from rich.text import Text

from trainhub_cli import sse
from trainhub_cli.client import Api
from trainhub_cli.errors import CliError, ExitCode
from trainhub_cli.render import Output
from trainhub_cli.state import get_state, json_option

PATH = "/chat/completions"
PROMPT = ">>> "
EXIT_WORDS = ("/exit", "/quit", "/bye")
# The stream process waits this long on a model being loaded before its 503 `model_loading`;
# asked again at once, it waits again. A deployed adapter on a cold server may need a minute.
LOADING_TRIES = 4
MODELS_SHOWN = 10
HELP = "/exit or Ctrl-D quits, /clear forgets the conversation, Ctrl-C stops an answer."


@dataclass(frozen=True)
class Answer:
    text: str
    finish_reason: str | None
    usage: dict[str, Any] | None


class Chat:
    """One model and the request's settings; ``ask`` sends a conversation and prints the answer
    to stdout (streamed as it arrives, or whole), notes (usage, a cut answer) to stderr."""

    def __init__(
        self, api: Api, out: Output, model: str, params: dict[str, Any], *, stream: bool,
        usage: bool,
    ) -> None:  # fmt: skip
        self.api, self.out, self.model, self.params = api, out, model, params
        self.stream, self.usage = stream and not out.json_mode, usage

    def body(self, messages: list[dict[str, str]]) -> dict[str, Any]:
        body = {"model": self.model, "messages": messages, **self.params, "stream": self.stream}
        if self.stream and self.usage:
            body["stream_options"] = {"include_usage": True}
        return body

    def ask(self, messages: list[dict[str, str]]) -> Answer:
        body = self.body(messages)
        for attempt in range(1, LOADING_TRIES + 1):
            try:
                with self.api.completion(PATH, body) as resp:
                    answer = self._streamed(resp) if self.stream else self._whole(resp)
                break
            except CliError as exc:
                if exc.code == "model_not_found" or (exc.status == 404 and exc.param == "model"):
                    raise _with_models(exc, self.api) from None
                if exc.code != "model_loading" or attempt == LOADING_TRIES:
                    raise
                self.out.say(Text(f"{self.model} is being loaded on a server; asking again…"))
        if answer.finish_reason == "length":
            self.out.say("(the answer reached its token limit: raise it with --max-tokens)")
        if self.usage:
            self.out.say(_usage_line(answer.usage))
        return answer

    def _whole(self, resp: httpx.Response) -> Answer:
        resp.read()
        try:
            obj = resp.json()
        except ValueError:
            raise CliError(f"The answer from {resp.url.copy_with(query=None)} is not JSON.",
                           ExitCode.API) from None  # fmt: skip
        choice = (obj.get("choices") or [{}])[0]
        text = str((choice.get("message") or {}).get("content") or "")
        if self.out.json_mode:
            self.out.json(obj)
        else:
            _write(text + "\n")
        return Answer(text, choice.get("finish_reason"), obj.get("usage"))

    def _streamed(self, resp: httpx.Response) -> Answer:
        """OpenAI's ``chat.completion.chunk`` events to ``data: [DONE]``; the text written as it
        comes, and a newline after it however the stream ends (Ctrl-C included)."""
        pieces: list[str] = []
        finish, usage, done = None, None, False
        try:
            for event in sse.parse(resp.iter_lines()):
                if event is None:
                    continue
                if event.data == "[DONE]":
                    done = True
                    break
                chunk = event.data if isinstance(event.data, dict) else {}
                if isinstance(chunk.get("error"), dict):  # an error after the stream began
                    error = chunk["error"]
                    raise CliError(str(error.get("message")), ExitCode.API,
                                   code=error.get("code"), body={"error": error})  # fmt: skip
                usage = chunk.get("usage") or usage
                for choice in chunk.get("choices") or []:
                    piece = (choice.get("delta") or {}).get("content")
                    if piece:
                        pieces.append(piece)
                        _write(piece)
                    finish = choice.get("finish_reason") or finish
        except httpx.HTTPError as exc:
            raise CliError(
                f"The answer was cut off mid-stream ({exc.__class__.__name__}: {exc}); what came "
                "is above. Ask again.",
                ExitCode.NETWORK,
            ) from None
        finally:
            _write("\n")
        if not done:
            raise CliError(
                "The answer stream ended before its `data: [DONE]`: what came is above and may "
                "be incomplete. Ask again.",
                ExitCode.NETWORK,
            )
        return Answer("".join(pieces), finish, usage)


def _write(text: str) -> None:
    # The model's text as it is: not click.echo, which strips ANSI codes off a pipe.
    sys.stdout.write(text)
    sys.stdout.flush()


def _usage_line(usage: dict[str, Any] | None) -> str:
    if not usage:
        return "usage: not reported by the server"
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    total = usage.get("total_tokens")
    return f"usage: {prompt} prompt + {completion} completion = {total} tokens"


def _with_models(exc: CliError, api: Api) -> CliError:
    """The API's model_not_found, naming the models that can be asked (GET /models)."""
    try:
        names = [str(m.get("id")) for m in api.get("/models").get("data") or []]
    except (CliError, AttributeError):
        return exc
    if not names:
        hint = "No model is deployed or served now."
    else:
        more = ", …" if len(names) > MODELS_SHOWN else ""
        hint = f"Models to ask: {', '.join(names[:MODELS_SHOWN])}{more}."
    return CliError(f"{exc.message} {hint}", exc.exit_code, param=exc.param, code=exc.code,
                    status=exc.status, body=exc.body)  # fmt: skip


def _read_line() -> str:
    if sys.stdout.isatty():
        return input(PROMPT)  # readline draws the prompt and redraws it while editing
    click.echo(PROMPT, nl=False, err=True)  # stdout is the answers' alone
    return input()


def converse(chat: Chat, system: str | None) -> None:
    """A conversation at a terminal until /exit, EOF or Ctrl-C at the prompt. A question whose
    answer failed or was stopped is left out of what is sent next."""
    with contextlib.suppress(ImportError):  # line editing and history where the OS has it
        importlib.import_module("readline")
    start = [{"role": "system", "content": system}] if system else []
    history = list(start)
    chat.out.say(Text(f"Chatting with {chat.model}. {HELP}"))
    while True:
        try:
            line = _read_line().strip()
        except (EOFError, KeyboardInterrupt):
            click.echo(err=True)  # the shell's prompt on a line of its own
            return
        if not line:
            continue
        if line in EXIT_WORDS:
            return
        if line == "/clear":
            history = list(start)
            chat.out.say("conversation cleared")
            continue
        if line == "/help":
            chat.out.say(HELP)
            continue
        turn = [*history, {"role": "user", "content": line}]
        try:
            answer = chat.ask(turn)
        except KeyboardInterrupt:
            chat.out.say("(stopped: this question is left out of the conversation)")
            continue
        except CliError as exc:
            if exc.exit_code == ExitCode.AUTH or exc.code == "model_not_found":
                raise  # no later question can succeed
            chat.out.error(exc)
            continue
        history = [*turn, {"role": "assistant", "content": answer.text}]


def _prompt_from(words: tuple[str, ...]) -> str | None:
    """The one-shot prompt: the words, or stdin for ``-`` or when it is not a terminal; None for
    a conversation."""
    if words and words != ("-",):
        return " ".join(words)
    if not words and sys.stdin.isatty():
        return None
    text = sys.stdin.read().strip()
    if not text:
        raise CliError("The prompt read from stdin is empty.", ExitCode.USAGE, param="PROMPT")
    return text


@click.command("chat")
@click.argument("model")
@click.argument("prompt", nargs=-1)
@click.option("-s", "--system", metavar="TEXT", help="A system message to start with.")
@click.option("--temperature", type=click.FloatRange(0, 2), help="0: greedy (the same answer).")
@click.option("--top-p", type=click.FloatRange(0, 1), help="Nucleus sampling's probability mass.")
@click.option("--max-tokens", type=click.IntRange(1), help="The answer's token limit.")
@click.option("--seed", type=int, help="For a repeatable sampled answer.")
@click.option("--stop", multiple=True, metavar="TEXT", help="Stop before this text (repeatable).")
@click.option("--no-stream", is_flag=True, help="Print the answer once it is whole.")
@click.option("--usage", is_flag=True, help="Then print the prompt and completion tokens (stderr).")
@json_option
def chat(
    model: str,
    prompt: tuple[str, ...],
    system: str | None,
    temperature: float | None,
    top_p: float | None,
    max_tokens: int | None,
    seed: int | None,
    stop: tuple[str, ...],
    no_stream: bool,
    usage: bool,
) -> None:
    """Ask MODEL: a deployed fine-tuned model (ft:…) or a base model a server serves (GET
    /v1/models lists them).

    \b
    trainhub chat ft:… "Where is my order?"      one answer, streamed to stdout
    echo "Summarize: …" | trainhub chat MODEL    the prompt from stdin (or PROMPT -)
    trainhub chat MODEL --system "Be brief."     a conversation, at a terminal

    In a conversation each question is sent with those before it and their answers: /clear
    forgets them, /exit or Ctrl-D quits, Ctrl-C stops an answer (at the prompt: quits).
    --json prints one answer's whole response object (not streamed).
    """
    state = get_state()
    out = state.output
    text = _prompt_from(prompt)
    if text is None and out.json_mode:
        raise CliError("--json takes a prompt: it prints one answer's object.", ExitCode.USAGE)
    given = {"temperature": temperature, "top_p": top_p, "max_tokens": max_tokens, "seed": seed}
    params: dict[str, Any] = {k: v for k, v in given.items() if v is not None}  # else the server's
    if stop:
        params["stop"] = list(stop)
    session = Chat(state.api, out, model, params, stream=not no_stream, usage=usage)
    if text is None:
        converse(session, system)
        return
    messages = [{"role": "system", "content": system}] if system else []
    session.ask([*messages, {"role": "user", "content": text}])
