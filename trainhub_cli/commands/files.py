"""``trainhub files upload|list|get``: datasets, validated by the server before any GPU runs."""

from __future__ import annotations

import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import click
from rich.text import Text

from trainhub_cli.client import Api
from trainhub_cli.errors import CliError, ExitCode
from trainhub_cli.render import Output, details, size, status_text, table, transfer_progress, when
from trainhub_cli.state import get_state, json_option

PENDING = ("uploaded", "processing")
FILE_FIELDS = ("id", "filename", "status", "bytes", "format", "example_count", "token_estimate",
               "error_count", "sha256", "created_at", "purpose")  # fmt: skip


def upload_file(api: Api, out: Output, path: Path, purpose: str = "fine-tune") -> dict[str, Any]:
    """Stream ``path`` to the API with a progress bar (at a terminal)."""
    total = path.stat().st_size
    with transfer_progress(out) as progress:
        task = progress.add_task(f"uploading {path.name}", total=total)
        record: dict[str, Any] = api.upload(path, purpose, lambda n: progress.advance(task, n))
    out.say(f"uploaded {path.name} as {record['id']} ({size(record.get('bytes'))})")
    return record


def wait_validated(
    api: Api, out: Output, record: dict[str, Any], timeout: float | None = None
) -> dict[str, Any]:
    """Poll the file until the worker has validated it (``processed`` or ``error``)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    delay = 0.2
    spinner = out.err.status(f"validating {record['id']}…") if out.interactive else nullcontext()
    with spinner:
        while record.get("status") in PENDING:
            if deadline is not None and time.monotonic() > deadline:
                raise CliError(
                    f"{record['id']} is still {record.get('status')} after {timeout:.0f} s; "
                    f"check later with `trainhub files get {record['id']}`.",
                    ExitCode.TIMEOUT,
                )
            time.sleep(delay)
            delay = min(delay * 1.5, 2.0)
            record = api.get(f"/files/{record['id']}")
    return dict(record)


def invalid_file_error(record: dict[str, Any]) -> CliError:
    """Exit 7; under --json the error object carries the file (with its ``errors``) as ``file``."""
    count = record.get("error_count") or len(record.get("errors") or [])
    message = (
        f"{record['id']} ({record.get('filename')}) failed validation with {count} error(s); "
        "fix the lines shown and upload it again."
    )
    error = {
        "message": message,
        "type": "invalid_dataset",
        "param": "file",
        "code": "invalid_dataset",
    }
    return CliError(
        message,
        ExitCode.DATASET_INVALID,
        param="file",
        code="invalid_dataset",
        body={"error": error, "file": record},
    )


def show_errors(out: Output, record: dict[str, Any]) -> None:
    """The API's line-numbered validation errors (line 0: the file as a whole)."""
    errors = record.get("errors") or []
    for error in errors:
        line = error.get("line") if isinstance(error, dict) else None
        message = error.get("message") if isinstance(error, dict) else str(error)
        where = "file" if not line else f"line {line}"
        text = Text(f"  {where}: ", style="bold red")
        text.append(str(message))
        out.err.print(text)
    total = record.get("error_count") or len(errors)
    if total > len(errors):
        out.err.print(f"  … and {total - len(errors)} more")


@click.group()
def files() -> None:
    """Upload and inspect training files (JSONL)."""


@files.command("upload")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--purpose", default="fine-tune", show_default=True)
@click.option("--no-wait", is_flag=True, help="Return once uploaded, before validation ends.")
@click.option("--timeout", type=float, metavar="SECONDS", help="Give up waiting for validation.")
@json_option
def upload(file: Path, purpose: str, no_wait: bool, timeout: float | None) -> None:
    """Upload FILE and wait for the server to validate it.

    An invalid file prints its line-numbered errors and exits 7.
    """
    state = get_state()
    api, out = state.api, state.output
    record = upload_file(api, out, file, purpose)
    if not no_wait:
        record = wait_validated(api, out, record, timeout)
    if record.get("status") == "error":
        if not out.json_mode:
            out.print(details(record, FILE_FIELDS))
            show_errors(out, record)
        raise invalid_file_error(record)
    if out.json_mode:
        out.json(record)
    else:
        out.print(details(record, FILE_FIELDS))


@files.command("list")
@click.option("--limit", type=click.IntRange(1, 100), default=20, show_default=True)
@click.option("--after", metavar="FILE_ID", help="The last id of the previous page.")
@click.option("--purpose")
@json_option
def list_files(limit: int, after: str | None, purpose: str | None) -> None:
    """List the project's files, newest first."""
    state = get_state()
    page = state.api.get("/files", limit=limit, after=after, purpose=purpose)
    out = state.output
    if out.json_mode:
        out.json(page)
        return
    rows = [
        (f["id"], f.get("filename"), status_text(f.get("status")), size(f.get("bytes")),
         f.get("example_count"), f.get("error_count"), when(f.get("created_at")))
        for f in page["data"]
    ]  # fmt: skip
    out.print(table(("id", "filename", "status", "size", "examples", "errors", "created"), rows))
    if page.get("has_more") and page["data"]:
        out.say(f"more: --after {page['data'][-1]['id']}")


@files.command("get")
@click.argument("file_id")
@json_option
def get_file(file_id: str) -> None:
    """Show one file, with its validation errors."""
    state = get_state()
    record = state.api.get(f"/files/{file_id}")
    out = state.output
    if out.json_mode:
        out.json(record)
        return
    out.print(details(record, FILE_FIELDS))
    if record.get("errors"):
        show_errors(out, record)
