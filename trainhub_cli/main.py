"""The ``trainhub`` command: the root group, its global options and how errors end it."""

from __future__ import annotations

from typing import Any

import click

from trainhub_cli import __version__
from trainhub_cli.commands import auth, chat, files, jobs, nodes, providers
from trainhub_cli.errors import EXIT_CODES_HELP, CliError, ExitCode
from trainhub_cli.state import State, json_option

EPILOG = (
    EXIT_CODES_HELP
    + """
\b
Configuration: `trainhub login` stores the URL and key in
$XDG_CONFIG_HOME/trainhub/config.json (mode 0600); TRAINHUB_URL, TRAINHUB_API_KEY and
TRAINHUB_STREAM_URL override it. Docs: docs/CLI.md.
"""
)


class TrainhubGroup(click.Group):
    """Reports a ``CliError`` (message, param, code; JSON under --json) and exits with its code,
    for the console script and Click's test runner alike."""

    def invoke(self, ctx: click.Context) -> Any:
        state = ctx.ensure_object(State)
        try:
            return super().invoke(ctx)
        except CliError as exc:
            state.output.error(exc)
            ctx.exit(int(exc.exit_code))
        except KeyboardInterrupt:
            state.output.say("interrupted (anything started on the server goes on)")
            ctx.exit(int(ExitCode.INTERRUPTED))
        finally:
            state.close()


@click.group(
    cls=TrainhubGroup, epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]}
)
@click.version_option(__version__, prog_name="trainhub")
@click.option(
    "--url",
    metavar="URL",
    help="The trainhub server (default: TRAINHUB_URL, else the one `trainhub login` saved).",
)
@json_option
@click.pass_context
def app(ctx: click.Context, url: str | None) -> None:
    """trainhub: fine-tune LLMs on your own GPUs or cloud GPUs, from the command line.

    \b
    trainhub login
    trainhub files upload data.jsonl
    trainhub jobs create --model meta-llama/Llama-3.2-1B-Instruct --training-file data.jsonl --watch
    trainhub jobs download ftjob-... ./out
    trainhub chat ft:... "Hello!"
    """
    state = ctx.ensure_object(State)
    state.url = url


for group in (
    auth.login,
    auth.logout,
    auth.show_config,
    files.files,
    jobs.jobs,
    chat.chat,
    nodes.nodes,
    providers.providers,
):
    app.add_command(group)


def main() -> None:  # pragma: no cover - the console script's entry point
    app(prog_name="trainhub")
