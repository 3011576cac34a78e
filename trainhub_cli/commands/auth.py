"""``trainhub login``, ``logout`` and ``config``: the server and key this machine uses."""

from __future__ import annotations

import os
import sys

import click

from trainhub_cli import config
from trainhub_cli.client import Api
from trainhub_cli.errors import CliError, ExitCode
from trainhub_cli.state import get_state, json_option


def _verify(url: str, key: str) -> None:
    """One authenticated read: a wrong key is a 401 (exit 4), a wrong URL a network error."""
    api = Api(url, key)
    try:
        api.get("/fine_tuning/jobs", limit=1)
    finally:
        api.close()


@click.command()
@click.option("--url", "url_opt", metavar="URL", help="The server, e.g. http://127.0.0.1:8000.")
@click.option(
    "--api-key-stdin",
    is_flag=True,
    help="Read the key from standard input (for scripts; a key is never taken as an argument, "
    "where other users could see it in the process list).",
)
@click.option(
    "--stream-url",
    metavar="URL",
    help="Where the stream process serves live events (default: what the server says).",
)
@click.option("--no-verify", is_flag=True, help="Save without checking the key against the API.")
@json_option
def login(
    url_opt: str | None, api_key_stdin: bool, stream_url: str | None, no_verify: bool
) -> None:
    """Save the server URL and an API key (verified against the API) to the config file.

    The key is asked for without echo (or read with --api-key-stdin, or taken from
    TRAINHUB_API_KEY) and stored with mode 0600; it is never printed.
    """
    state = get_state()
    out = state.output
    stored = config.read_file()
    default_url = (
        state.url or os.environ.get(config.ENV_URL) or stored.get("url") or config.DEFAULT_URL
    )
    raw_url = url_opt or state.url
    if raw_url is None:
        raw_url = (
            click.prompt("trainhub URL", default=default_url) if sys.stdin.isatty() else default_url
        )
    url = config.normalize_url(raw_url)
    if api_key_stdin:
        key = sys.stdin.readline().strip()
    elif os.environ.get(config.ENV_KEY):
        key = os.environ[config.ENV_KEY].strip()
        out.say(f"using the key in {config.ENV_KEY}")
    elif sys.stdin.isatty():
        key = click.prompt("API key", hide_input=True).strip()
    else:
        raise CliError(
            "No API key given: run `trainhub login` at a terminal, pipe it with --api-key-stdin, "
            "or set TRAINHUB_API_KEY.",
            ExitCode.USAGE,
            param="api_key",
        )
    if not key:
        raise CliError("The API key is empty.", ExitCode.USAGE, param="api_key")
    if not no_verify:
        _verify(url, key)
    values = {"url": url, "api_key": key}
    if stream_url:
        values["stream_url"] = config.normalize_url(stream_url, "--stream-url")
    path = config.write_file(values)
    if out.json_mode:
        out.json({"url": url, "config": str(path), "verified": not no_verify})
    else:
        out.print(
            f"Logged in to {url} ({'key verified' if not no_verify else 'not verified'}); "
            f"saved to {path} (mode 0600)."
        )


@click.command()
@json_option
def logout() -> None:
    """Delete the saved config file (the key stays valid on the server: revoke it there)."""
    out = get_state().output
    path = config.config_path()
    removed = config.remove_file(path)
    if out.json_mode:
        out.json({"config": str(path), "removed": removed})
    else:
        out.print(f"Removed {path}." if removed else f"No config file at {path}.")


@click.command("config")
@json_option
def show_config() -> None:
    """Show which server and stream URL are used and where the key comes from (not the key)."""
    state = get_state()
    s = state.settings
    shown = {
        "url": s.url,
        "stream_url": s.stream_url,
        "api_key": {
            "env": f"set (from {config.ENV_KEY})",
            "file": "set (from the config file)",
        }.get(s.key_source, "not set"),
        "config": str(config.config_path()),
    }
    out = state.output
    if out.json_mode:
        out.json(shown)
    else:
        for name, value in shown.items():
            out.print(f"{name:<10} {value or '-'}")
