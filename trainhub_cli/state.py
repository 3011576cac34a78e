"""What every command gets: the output mode, the settings and (lazily) the API client."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from trainhub_cli import config
from trainhub_cli.client import Api
from trainhub_cli.render import Output

F = TypeVar("F", bound=Callable[..., Any])


class State:
    def __init__(self) -> None:
        self.json_mode = False
        self.url: str | None = None
        self._settings: config.Settings | None = None
        self._api: Api | None = None

    @property
    def output(self) -> Output:
        return Output(self.json_mode)

    @property
    def settings(self) -> config.Settings:
        if self._settings is None:
            self._settings = config.load(self.url)
        return self._settings

    @property
    def api(self) -> Api:
        if self._api is None:
            self._api = Api(self.settings.url, self.settings.api_key)
        return self._api

    def close(self) -> None:
        if self._api is not None:
            self._api.close()


def get_state() -> State:
    ctx = click.get_current_context()
    state = ctx.find_object(State)
    if state is None:  # invoked without main's obj (e.g. a sub-group alone)
        state = ctx.ensure_object(State)
    return state


def _set_json(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value:
        ctx.ensure_object(State).json_mode = True


def json_option(f: F) -> F:
    """``--json`` on a command (the same as ``trainhub --json ...``)."""
    return click.option(
        "--json",
        "json_mode",
        is_flag=True,
        expose_value=False,
        is_eager=True,
        callback=_set_json,
        help="Print the API's objects as JSON instead of tables.",
    )(f)
