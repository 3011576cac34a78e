"""``trainhub jobs ...``: the group (create: job_create; watch and download: following; export),
list, get, and the actions cancel, retry, pause, resume."""

from __future__ import annotations

from typing import Any

import click

from trainhub_cli.commands.export import export
from trainhub_cli.commands.following import download, watch
from trainhub_cli.commands.job_create import create, key_values, show_job
from trainhub_cli.render import status_text, table, when
from trainhub_cli.state import get_state, json_option

STATUSES = ("validating_files", "queued", "provisioning", "running", "finalizing", "succeeded",
            "failed", "cancelling", "cancelled", "paused")  # fmt: skip


def _job_table(rows: list[dict[str, Any]]) -> Any:
    def progress(j: dict[str, Any]) -> str:
        m = j.get("metrics") or {}
        return (
            f"{m['step']}/{m.get('total_steps') or '?'}" if isinstance(m.get("step"), int) else "-"
        )

    return table(
        ("id", "status", "model", "target", "step", "created", "fine-tuned model"),
        [(j["id"], status_text(j.get("status")), j.get("model"), j.get("target"), progress(j),
          when(j.get("created_at")), j.get("fine_tuned_model")) for j in rows],
    )  # fmt: skip


@click.group()
def jobs() -> None:
    """Create, follow and manage fine-tuning jobs."""


@jobs.command("list")
@click.option("--status", type=click.Choice(STATUSES))
@click.option("--target")
@click.option(
    "--metadata",
    multiple=True,
    metavar="KEY=VALUE",
    help="Jobs with this metadata pair (repeatable).",
)
@click.option("--limit", type=click.IntRange(1, 100), default=20, show_default=True)
@click.option("--after", metavar="JOB_ID", help="The last id of the previous page.")
@json_option
def list_jobs(
    status: str | None, target: str | None, metadata: tuple[str, ...], limit: int, after: str | None
) -> None:
    """List the project's jobs, newest first."""
    state = get_state()
    params: list[tuple[str, Any]] = [("limit", limit)]
    params += [(k, v) for k, v in (("status", status), ("target", target), ("after", after)) if v]
    params += [(f"metadata[{k}]", v) for k, v in key_values(metadata, "--metadata").items()]
    page = state.api.request("GET", "/fine_tuning/jobs", params=params)
    out = state.output
    if out.json_mode:
        out.json(page)
        return
    out.print(_job_table(page["data"]))
    if page.get("has_more") and page["data"]:
        out.say(f"more: --after {page['data'][-1]['id']}")


@jobs.command("get")
@click.argument("job_id")
@json_option
def get_job(job_id: str) -> None:
    """Show one job."""
    state = get_state()
    show_job(state.output, state.api.get(f"/fine_tuning/jobs/{job_id}"))
    if not state.output.json_mode:
        page = state.api.get(f"/fine_tuning/jobs/{job_id}/checkpoints", limit=100)
        if page["data"]:
            state.output.print(_checkpoint_table(page["data"]))


def _checkpoint_table(rows: list[dict[str, Any]]) -> Any:
    """A job's stored checkpoints (the newest of each attempt) with OpenAI's figures and the
    grader's score."""

    def figure(row: dict[str, Any], name: str) -> str:
        value = (row.get("metrics") or {}).get(name)
        return f"{value:.4f}" if isinstance(value, int | float) else "-"

    return table(
        ("step", "attempt", "train_loss", "valid_loss", "eval_score", "fine_tuned_model_checkpoint"),
        [(r.get("step_number"), r.get("attempt"), figure(r, "train_loss"),
          figure(r, "valid_loss"), figure(r, "eval_score"), r.get("fine_tuned_model_checkpoint"))
         for r in rows],
    )  # fmt: skip


def _action(name: str, doc: str) -> None:
    @jobs.command(name, help=doc)
    @click.argument("job_id")
    @json_option
    def command(job_id: str) -> None:
        state = get_state()
        job = state.api.post(f"/fine_tuning/jobs/{job_id}/{name}")
        out = state.output
        if out.json_mode:
            out.json(job)
        else:
            out.print(f"{job['id']}: {job.get('status')}")


_action("cancel", "Cancel a job (409 if it has already finished).")
_action("retry", "Retry a failed or cancelled job (a new attempt, from its last checkpoint).")
_action("pause", "Pause a running job: checkpoint, stop, hold (no machine is kept).")
_action("resume", "Resume a paused job from its checkpoint.")


for command in (create, watch, download, export):
    jobs.add_command(command)
