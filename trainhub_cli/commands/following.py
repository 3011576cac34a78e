"""``trainhub jobs watch`` and ``jobs download``: following a job to its end, and fetching
what it made (the logic lives in trainhub_cli.watch and trainhub_cli.download)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from trainhub_cli.download import download_job
from trainhub_cli.errors import ExitCode
from trainhub_cli.render import duration
from trainhub_cli.state import State, get_state, json_option
from trainhub_cli.watch import Watcher, outcome


def watch_job(
    state: State,
    job_id: str,
    *,
    stream: bool,
    interval: float,
    timeout: float | None,
    logs: bool,
) -> None:
    out = state.output
    watcher = Watcher(
        state.api,
        out,
        job_id,
        stream_url=state.settings.stream_url,
        use_stream=stream,
        interval=interval,
        timeout=timeout,
        show_logs=logs,
    )
    job = watcher.run()
    code = outcome(job)
    if out.json_mode:
        out.json(job)
    else:
        took = None
        if job.get("started_at") and job.get("finished_at"):
            took = job["finished_at"] - job["started_at"]
        summary = f"{job_id} {job.get('status')}"
        if took is not None:
            summary += f" after {duration(took)}"
        if job.get("fine_tuned_model"):
            summary += f": {job['fine_tuned_model']}"
        error = job.get("error") or {}
        if error:
            summary += f": {error.get('code')}: {error.get('message')}"
        out.print(summary)
        if code == ExitCode.OK:
            out.say(f"download it: trainhub jobs download {job_id} DIR")
        elif code == ExitCode.JOB_PAUSED:
            out.say(f"resume it: trainhub jobs resume {job_id}")
    if code != ExitCode.OK:
        click.get_current_context().exit(int(code))


def watch_options(f: Any) -> Any:
    f = click.option(
        "--logs",
        is_flag=True,
        help="Also print the executor's log lines (not at a terminal, where the last ones are shown).",
    )(f)
    f = click.option(
        "--timeout",
        type=float,
        metavar="SECONDS",
        help="Stop watching after this long (exit 8; the job goes on).",
    )(f)
    f = click.option(
        "--interval",
        type=click.FloatRange(0.2),
        default=2.0,
        show_default=True,
        help="Seconds between polls when there is no live stream.",
    )(f)
    f = click.option(
        "--stream/--poll",
        default=True,
        show_default=True,
        help="Follow the live SSE stream, or poll the events list.",
    )(f)
    return f


@click.command("watch")
@click.argument("job_id")
@watch_options
@json_option
def watch(job_id: str, stream: bool, interval: float, timeout: float | None, logs: bool) -> None:
    """Follow a job to its end: status, step/total, ETA, useful tokens/s and padding, loss
    sparkline, last log lines.

    \b
    Exit code: 0 succeeded, 10 failed, 11 cancelled, 12 paused, 8 --timeout ran out.
    """
    watch_job(get_state(), job_id, stream=stream, interval=interval, timeout=timeout, logs=logs)


@click.command("download")
@click.argument("job_id")
@click.argument("directory", metavar="DIR", type=click.Path(file_okay=False, path_type=Path))
@click.option("--no-extract", is_flag=True, help="Keep the verified .tar only.")
@json_option
def download(job_id: str, directory: Path, no_extract: bool) -> None:
    """Download a succeeded job's adapter into DIR, verify it and unpack it safely.

    The bundle's SHA-256 is checked against the API's, every file against its manifest;
    path traversal, links and unlisted files are refused (exit 6). Prints the path.
    """
    state = get_state()
    result = download_job(state.api, state.output, job_id, directory, extract=not no_extract)
    out = state.output
    if out.json_mode:
        out.json(result)
        return
    for record in result["artifacts"]:
        out.print(record.get("extracted_to") or record["path"])
