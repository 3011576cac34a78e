"""Output: the API's objects as JSON (``--json``) or as Rich tables and lines for people.

Results go to stdout; progress, live views and errors to stderr, so ``--json`` output stays
parseable whatever else is shown.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterable, Sequence
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn
from rich.table import Table
from rich.text import Text

from trainhub_cli.errors import CliError

SPARKS = "▁▂▃▄▅▆▇█"
STATUS_STYLE = {
    "succeeded": "green",
    "processed": "green",
    "running": "cyan",
    "finalizing": "cyan",
    "provisioning": "blue",
    "queued": "blue",
    "validating_files": "blue",
    "uploaded": "blue",
    "processing": "blue",
    "paused": "yellow",
    "cancelling": "yellow",
    "cancelled": "yellow",
    "failed": "red",
    "error": "red",
    "idle": "green",
    "busy": "cyan",
    "offline": "red",
}


def _console(stderr: bool) -> Console:
    console = Console(stderr=stderr, highlight=False)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console.width = 160  # piped: keep ids and rows on one line each
    return console


class Output:
    def __init__(self, json_mode: bool = False) -> None:
        self.json_mode = json_mode
        self.out = _console(stderr=False)
        self.err = _console(stderr=True)

    @property
    def interactive(self) -> bool:
        """Live views and progress bars: only for a person at a terminal."""
        return not self.json_mode and self.err.is_terminal

    def json(self, obj: Any) -> None:
        click.echo(json.dumps(obj, indent=2, ensure_ascii=False))

    def say(self, text: str | Text) -> None:
        """A line for people (stderr), silent under --json."""
        if not self.json_mode:
            self.err.print(text, soft_wrap=True)

    def print(self, renderable: Any) -> None:
        self.out.print(renderable)

    def error(self, exc: CliError) -> None:
        if self.json_mode:
            click.echo(json.dumps(exc.as_json(), ensure_ascii=False))
            return
        where = []
        if exc.param:
            where.append(f"param: {exc.param}")
        if exc.code:
            where.append(f"code: {exc.code}")
        if exc.status:
            where.append(f"HTTP {exc.status}")
        text = Text("error: ", style="bold red")
        text.append(exc.message)
        if where:
            text.append(f" ({', '.join(where)})", style="dim")
        self.err.print(text, soft_wrap=True)  # one line: grep-able, never cut mid-word


def transfer_progress(out: Output) -> Progress:
    """A bytes progress bar on stderr for an upload or download (hidden when not a terminal)."""
    return Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        console=out.err,
        disable=not out.interactive,
        transient=True,
    )


def status_text(status: str | None) -> Text:
    value = status or "-"
    return Text(value, style=STATUS_STYLE.get(value, ""))


def when(ts: object) -> str:
    if not isinstance(ts, int | float):
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def duration(seconds: float | None) -> str:
    if seconds is None or seconds < 0:
        return "?"
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def size(n: object) -> str:
    if not isinstance(n, int):
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


def sparkline(values: Sequence[float], width: int = 40) -> str:
    """The last ``width`` values as block characters, scaled between their min and max."""
    tail = [v for v in values[-width:] if v == v]  # NaN != NaN
    if not tail:
        return ""
    low, high = min(tail), max(tail)
    span = high - low
    top = len(SPARKS) - 1
    return "".join(SPARKS[int((v - low) / span * top) if span else top // 2] for v in tail)


def cell(value: object) -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def table(
    columns: Iterable[str], rows: Iterable[Iterable[object]], title: str | None = None
) -> Table:
    out = Table(title=title, show_edge=False, header_style="bold", pad_edge=False)
    for name in columns:
        out.add_column(name, overflow="fold", no_wrap=name in ("id", "ID"))
    for row in rows:
        out.add_row(*(v if isinstance(v, Text) else cell(v) for v in row))
    return out


def details(obj: dict[str, Any], fields: Sequence[str], title: str | None = None) -> Table:
    """One object as a two-column table of the named fields (status coloured)."""
    out = Table(title=title, show_header=False, show_edge=False, pad_edge=False, box=None)
    out.add_column(style="bold")
    out.add_column(overflow="fold")
    for name in fields:
        value = obj.get(name)
        if name == "status":
            out.add_row(name, status_text(value))
        elif name.endswith("_at") or name == "estimated_finish":
            out.add_row(name, when(value))
        else:
            out.add_row(name, cell(value))
    return out


def stdout_is_terminal() -> bool:
    return sys.stdout.isatty()
