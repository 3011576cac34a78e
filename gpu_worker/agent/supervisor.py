"""The GPU node's side of one attempt: claim it, run the executor in a child process, stop it
on cancel. Runs inside the node's Celery task (gpu_worker.celery_app); no Django.

The broker message names the attempt only; its ids are checked before they name a file, and
the spec comes from the claim (gpu_worker.agent.node_api). The executor is a separate process
(``python -m gpu_worker run``) so GPU memory is freed with it and a cancel can signal it. It
sends its own events over HTTPS with the attempt's report token (the http sink); it gets
neither the node's token nor the broker URL. The supervisor only speaks when the executor
could not: a final status for an executor that died without one.

Stopping: while the executor runs, the supervisor asks the control plane every
``control_poll_seconds`` whether the attempt is to stop (the heartbeat answer) and then
writes the attempt's cancel file, which stops the executor within one optimizer step by
itself; after ``cancel_grace_seconds`` it gets SIGTERM, after as long again SIGKILL. A pause
writes "pause" into the file: the executor uploads a checkpoint first, so its grace is
``pause_grace_seconds``, and the supervisor keeps asking meanwhile (a cancel of the pausing
job cuts the wait to the cancel's grace). The
executor also dies with this process (``PR_SET_PDEATHSIG``), so killing the node never leaves a
training running unowned.

Warm starts: the executor of the next attempt is started ahead, with its imports done
(gpu_worker.warm), when the worker starts and after each attempt; an attempt is handed to it,
and started cold when it is not there to take it. It runs that one attempt and exits, so GPU
memory is freed with each attempt as before.
"""

from __future__ import annotations

import json
import logging
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from gpu_worker.agent.children import child_env, die_with_parent, signal_group
from gpu_worker.agent.node import NodeConfig
from gpu_worker.agent.node_api import NodeApi, checked_ids, events_url
from gpu_worker.errors import INTERNAL_ERROR
from gpu_worker.sinks import HttpSink
from gpu_worker.warm import WarmExecutor
from trainhub_contract.outcomes import ExitCode, Outcome, StopMode

log = logging.getLogger(__name__)

# The supervisor's own final event uses a seq far above any the executor reaches, so the
# control plane's (attempt, seq) key never confuses the two.
SUPERVISOR_SEQ = 2_000_000_000


# The next attempt's executor, started ahead (gpu_worker.warm); None: the next start is cold.
_warm: WarmExecutor | None = None


def prepare_warm(node: NodeConfig) -> None:
    """Start the next attempt's warm executor, unless one is alive or the node starts cold.
    Called from the thread that runs attempts: PR_SET_PDEATHSIG follows the thread that spawned
    the child, so the warm process must not outlive it unowned."""
    global _warm
    if not node.warm_executor or (_warm is not None and _warm.proc.poll() is None):
        return
    try:
        _warm = WarmExecutor.spawn(child_env(), preexec_fn=die_with_parent)
    except OSError as exc:
        log.warning("could not start a warm executor (the next start is cold): %s", exc)
        _warm = None


def _start_executor(args: list[str], attempt_env: dict[str, str]) -> tuple[Any, str]:
    """The attempt's executor process, handed to the warm one when it can take it, else
    started cold; and which it was."""
    global _warm
    warm, _warm = _warm, None
    if warm is not None:
        proc = warm.hand(args, attempt_env)
        if proc is not None:
            return proc, "warm"
        log.warning("the warm executor could not take the attempt; starting it cold")
    proc = subprocess.Popen(  # noqa: S603 - this interpreter running the executor
        [sys.executable, "-m", "gpu_worker", *args],
        env={**child_env(), **attempt_env},
        start_new_session=True,
        preexec_fn=die_with_parent,
    )
    return proc, "cold"


def run(message: dict[str, Any], node: NodeConfig, api: NodeApi | None = None) -> str:
    """Run one attempt to its end; returns a word for the log (refused, exit code...)."""
    try:
        job_id, attempt = checked_ids(message.get("job_id"), message.get("attempt"))
    except ValueError as exc:
        log.error("dropping a run_attempt message that names no attempt: %s", exc)
        return "refused"
    api = api or NodeApi(node)
    claimed = api.claim(job_id, attempt)
    if claimed is None:
        return "refused"
    workdir = node.workdir / f"{job_id}-a{attempt}"
    cancel_file = node.cancel_file(job_id, attempt)
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    cancel_file.parent.mkdir(parents=True, exist_ok=True)
    spec_path = workdir / "spec.json"
    spec_path.touch(mode=0o600)  # holds signed URLs: readable by this user only
    spec_path.write_text(json.dumps(claimed.spec))
    args = ["run", str(spec_path), "--workdir", str(workdir / "run"),
            "--cancel-file", str(cancel_file)]  # fmt: skip
    if node.checkpoint_every_steps:
        args += ["--checkpoint-every-steps", str(node.checkpoint_every_steps)]
    if node.checkpoint_every_seconds is not None:
        args += ["--checkpoint-every-seconds", str(node.checkpoint_every_seconds)]
    report_url = events_url(node.control_url, node.name, job_id, attempt)
    attempt_env = {"TRAINHUB_REPORT_URL": report_url, "TRAINHUB_REPORT_TOKEN": claimed.report_token}
    try:
        proc, start = _start_executor(args, attempt_env)
        log.info("starting attempt %s of %s (%s start, pid %s)", attempt, job_id, start, proc.pid)
        watch = _CancelWatch(api, (job_id, attempt), cancel_file, node.control_poll_seconds)
        code, signalled = _wait(
            proc, watch, node.cancel_grace_seconds, pause_grace=node.pause_grace_seconds
        )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        cancel_file.unlink(missing_ok=True)
        prepare_warm(node)  # the next attempt's, now that this one's process is gone
    if code not in ExitCode.reported():
        _report_death(HttpSink(report_url, claimed.report_token), job_id, attempt, code, signalled)
    log.info("attempt %s of %s ended: exit %s", attempt, job_id, code)
    return f"exit {code}"


class _CancelWatch:
    """Asks the control plane, at most every ``period`` seconds, whether the attempt is to
    stop, and how; a new answer writes the cancel file (which the executor watches). A cancel
    overrides a pause, never the reverse, and ends the asking. A failed ask is retried on the
    next tick: the lease, not this, covers a control plane that stays away."""

    def __init__(
        self, api: NodeApi, attempt: tuple[str, int], cancel_file: Path, period: float
    ) -> None:
        self.api, self.attempt, self.cancel_file, self.period = api, attempt, cancel_file, period
        self._next = 0.0
        self.mode: StopMode | None = None

    def requested(self) -> StopMode | None:
        """The stop asked for so far; None while the executor is to go on."""
        if self.mode is not StopMode.CANCEL:
            self.mode = StopMode.of_file(self.cancel_file) or self.mode
        if self.mode is not StopMode.CANCEL:
            self._ask()
        return self.mode

    def _ask(self) -> None:
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + self.period
        try:
            stops = self.api.heartbeat(running=self.attempt)
        except Exception as exc:  # network trouble: ask again next tick
            log.warning("could not ask the control plane for cancels: %s", exc)
            return
        mode = stops.get(self.attempt)
        if mode is not None and mode is not self.mode:
            log.warning("%s requested for %s attempt %s", mode, *self.attempt)
            mode.write_file(self.cancel_file)
            self.mode = mode


def _wait(
    proc: subprocess.Popen[bytes],
    watch: _CancelWatch,
    grace: float,
    *,
    pause_grace: float | None = None,
) -> tuple[int, bool]:
    """Wait for the executor, escalating after a stop request; returns (exit code, signalled
    by us). The grace runs from the request (a pause's from the pause, a cancel's from the
    cancel, even of a pausing executor).

    A signalled executor may die without its final status (SIGKILL, or SIGTERM before its
    handler is installed, during the imports): that end is still the cancel's."""
    asked: float | None = None
    termed: float | None = None
    mode: StopMode | None = None
    while True:
        try:
            return proc.wait(timeout=0.5), termed is not None
        except subprocess.TimeoutExpired:
            pass
        now = time.monotonic()
        if termed is None:
            seen = watch.requested()
            if seen is not None and seen is not mode:
                mode, asked = seen, now
            limit = pause_grace if mode is StopMode.PAUSE and pause_grace is not None else grace
            if asked is not None and now - asked > limit:
                log.warning("executor still running %.0f s after the %s: SIGTERM", limit, mode)
                signal_group(proc, signal.SIGTERM)
                termed = now
        elif now - termed > grace:
            log.warning("executor ignored SIGTERM for %.0f s: SIGKILL", grace)
            signal_group(proc, signal.SIGKILL)


def _report_death(sink: HttpSink, job_id: str, attempt: int, code: int, signalled: bool) -> None:
    """The executor ended without its final status (stopped by us, crashed, unusable spec)."""
    if signalled:
        data = {"status": Outcome.CANCELLED.value}
        message = f"The executor was stopped by a signal after the cancel (exit {code})."
    elif code == ExitCode.USAGE:  # the control plane built a spec the executor refused: a bug
        data = {"status": Outcome.FAILED.value, "code": INTERNAL_ERROR}
        message = "The executor refused the job spec (exit 2); see the node's log."
    else:
        data = {"status": Outcome.FAILED.value, "code": "worker_lost"}
        message = f"The executor died without reporting (exit {code}); the job will be retried."
    event = {"seq": SUPERVISOR_SEQ, "type": "status", "level": "error", "message": message,
             "data": data, "ts": time.time()}  # fmt: skip
    try:
        try:
            sink.send(job_id, attempt, [event])
        finally:
            sink.close()
    except Exception:  # the lease expiry covers a report that could not be sent
        log.exception("could not report the executor's death for %s attempt %s", job_id, attempt)
