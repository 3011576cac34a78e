"""``trainhub jobs export``: a succeeded job's adapter merged into its base model (an export the
control plane's exports worker makes), waited for and downloaded, verified, if asked."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click

from trainhub_cli.archive import extract_bundle
from trainhub_cli.download import fetch
from trainhub_cli.errors import CliError, ExitCode
from trainhub_cli.state import get_state, json_option

FORMATS = ("merged_safetensors",)
POLL_SECONDS = 2.0


@click.command("export")
@click.argument("job_id")
@click.option("--format", "format_", type=click.Choice(FORMATS), default=FORMATS[0],
              show_default=True, help="merged_safetensors: the adapter merged into its base.")  # fmt: skip
@click.option("--wait", is_flag=True, help="Wait until the export is made (or fails).")
@click.option("--download", "directory", metavar="DIR", default=None,
              type=click.Path(file_okay=False, path_type=Path),
              help="Wait, then download it into DIR, verified and unpacked.")  # fmt: skip
@click.option("--timeout", type=click.FloatRange(min=1), default=None, metavar="SECONDS",
              help="Stop waiting after this long (exit 8; the export goes on).")  # fmt: skip
@json_option
def export(
    job_id: str, format_: str, wait: bool, directory: Path | None, timeout: float | None
) -> None:
    """Export a succeeded job's adapter merged into its base model: plain safetensors weights,
    config and tokenizer, which vLLM, TGI, transformers or Ollama load without PEFT.

    \b
    Asking again returns the same export. Exit code: 0 made (or queued, without --wait),
    10 the export failed (its reason shown), 8 --timeout ran out.
    """
    state = get_state()
    out = state.output
    made = state.api.post(f"/fine_tuning/jobs/{job_id}/exports", {"format": format_})
    out.say(f"{made['id']}: {made['status']}")
    if wait or directory is not None:
        made = _wait(job_id, made, timeout)
    record: dict[str, Any] = dict(made)
    if directory is not None:
        artifact = made["artifact"]
        directory.mkdir(parents=True, exist_ok=True)
        target = directory / f"{job_id}-merged.tar"
        if target.exists():
            raise CliError(f"{target} already exists: remove it or choose another DIR.",
                           ExitCode.USAGE, param="DIR")  # fmt: skip
        fetch(state.api, out, artifact, target)
        folder = directory / target.stem
        try:
            extract_bundle(target, folder)
        except CliError:
            target.unlink(missing_ok=True)  # a refused bundle is not left to be used
            raise
        record["path"], record["extracted_to"] = str(target), str(folder)
    if out.json_mode:
        out.json(record)
    else:
        out.print(record.get("extracted_to") or f"{made['id']}: {made['status']}")


def _wait(job_id: str, export: dict[str, Any], timeout: float | None) -> dict[str, Any]:
    state = get_state()
    deadline = None if timeout is None else time.monotonic() + timeout
    shown = export["status"]
    while export["status"] in ("queued", "running"):
        if deadline is not None and time.monotonic() > deadline:
            raise CliError(f"{export['id']} is still {export['status']} after {timeout:g} s "
                           "(it goes on; run the command again to wait more).", ExitCode.TIMEOUT)  # fmt: skip
        time.sleep(POLL_SECONDS)
        page = state.api.get(f"/fine_tuning/jobs/{job_id}/exports")
        export = next(e for e in page["data"] if e["id"] == export["id"])
        if export["status"] != shown:
            shown = export["status"]
            state.output.say(f"{export['id']}: {shown}")
    if export["status"] == "failed":
        raise CliError(f"{export['id']} failed: {export.get('error')}", ExitCode.JOB_FAILED)
    return export
