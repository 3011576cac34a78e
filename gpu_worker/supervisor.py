"""The GPU node's side of one attempt: claim it, run the executor in a child process, stop it
on cancel. Runs inside the node's Celery task (gpu_worker.celery_app); no Django.

The executor is a separate process (``python -m gpu_worker run``) so GPU memory is freed with
it and a cancel can signal it. It sends its own events (the celery sink, carrying this node's
identity); the supervisor only speaks when the executor could not: a final status for an
executor that died without one.

Stopping: a cancel request (the remote-control command writes the attempt's cancel file)
stops the executor within one optimizer step by itself; after ``cancel_grace_seconds`` it
gets SIGTERM, after as long again SIGKILL. The executor also dies with this process
(``PR_SET_PDEATHSIG``), so killing the node never leaves a training running unowned.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import requests

from gpu_worker.errors import INTERNAL_ERROR
from gpu_worker.node import NodeConfig
from gpu_worker.outcomes import ExitCode, Outcome
from gpu_worker.retrying import RetryPolicy
from gpu_worker.sinks import CelerySink

log = logging.getLogger(__name__)

# The supervisor's own final event uses a seq far above any the executor reaches, so the
# control plane's (attempt, seq) key never confuses the two.
SUPERVISOR_SEQ = 2_000_000_000
# Three tries, 2 s then 4 s apart: the control plane restarting is the usual cause.
CLAIM_RETRY = RetryPolicy(attempts=3, backoff_seconds=2.0, jitter=False)
_PR_SET_PDEATHSIG = 1


class _NoAnswer(Exception):
    """The control plane answered the claim with neither a yes nor a no (a 5xx, mostly)."""

    def __init__(self, response: requests.Response) -> None:
        super().__init__(f"claim answered HTTP {response.status_code}")
        self.response = response


def claim(
    message: dict[str, Any], node: NodeConfig, *, sleep: Callable[[float], None] = time.sleep
) -> bool:
    """Ask the control plane for the attempt; False if it is not ours to run (duplicate,
    outdated or cancelled). Network trouble raises after a few tries: the message is then
    dropped and the dispatcher sends the attempt again."""
    spec = message["spec"]
    body = {"node": node.name, "job_id": spec["job_id"], "attempt": spec["attempt"]}

    def ask() -> bool:
        resp = requests.post(
            message["claim_url"],
            json=body,
            headers={"Authorization": f"Bearer {node.token}"},
            timeout=(5, 30),
        )
        if resp.status_code == 200:
            return True
        if resp.status_code in (401, 404, 409):
            log.warning("claim of %s refused (%s): %s", body, resp.status_code, resp.text[:300])
            return False
        raise _NoAnswer(resp)

    try:
        return CLAIM_RETRY.call(
            ask,
            retry_if=lambda exc: isinstance(exc, requests.RequestException | _NoAnswer),
            sleep=sleep,
        )
    except _NoAnswer as exc:
        unanswered = exc.response
    unanswered.raise_for_status()  # a 5xx; any other status is not a claim either
    return False


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the supervisor goes away (Linux)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def run(message: dict[str, Any], node: NodeConfig) -> str:
    """Run one attempt to its end; returns a word for the log (refused, exit code...)."""
    spec = message["spec"]
    job_id, attempt = spec["job_id"], int(spec["attempt"])
    if not claim(message, node):
        return "refused"
    workdir = node.workdir / f"{job_id}-a{attempt}"
    cancel_file = node.cancel_file(job_id, attempt)
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    cancel_file.parent.mkdir(parents=True, exist_ok=True)
    spec_path = workdir / "spec.json"
    spec_path.write_text(json.dumps(spec))  # holds signed URLs: readable by this user only
    spec_path.chmod(0o600)
    command = [sys.executable, "-m", "gpu_worker", "run", str(spec_path),
               "--workdir", str(workdir / "run"), "--cancel-file", str(cancel_file)]  # fmt: skip
    if node.checkpoint_every_steps:
        command += ["--checkpoint-every-steps", str(node.checkpoint_every_steps)]
    if node.checkpoint_every_seconds is not None:
        command += ["--checkpoint-every-seconds", str(node.checkpoint_every_seconds)]
    env = {**os.environ, "TRAINHUB_NODE_NAME": node.name, "TRAINHUB_NODE_TOKEN": node.token,
           "CELERY_BROKER_URL": node.broker_url}  # fmt: skip
    log.info("starting attempt %s of %s", attempt, job_id)
    try:
        proc = subprocess.Popen(  # noqa: S603 - this interpreter running the executor
            command, env=env, start_new_session=True, preexec_fn=_die_with_parent
        )
        code, signalled = _wait(proc, cancel_file, node.cancel_grace_seconds)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        cancel_file.unlink(missing_ok=True)
    if code not in ExitCode.reported():
        _report_death(node, job_id, attempt, code, signalled)
    log.info("attempt %s of %s ended: exit %s", attempt, job_id, code)
    return f"exit {code}"


def _wait(proc: subprocess.Popen[bytes], cancel_file: Path, grace: float) -> tuple[int, bool]:
    """Wait for the executor, escalating after a cancel; returns (exit code, signalled by us).

    A signalled executor may die without its final status (SIGKILL, or SIGTERM before its
    handler is installed, during the imports): that end is still the cancel's."""
    asked = termed = None
    while True:
        try:
            return proc.wait(timeout=0.5), termed is not None
        except subprocess.TimeoutExpired:
            pass
        now = time.monotonic()
        if asked is None:
            if cancel_file.exists():
                asked = now
        elif termed is None and now - asked > grace:
            log.warning("executor still running %.0f s after the cancel: SIGTERM", grace)
            _signal_group(proc, signal.SIGTERM)
            termed = now
        elif termed is not None and now - termed > grace:
            log.warning("executor ignored SIGTERM for %.0f s: SIGKILL", grace)
            _signal_group(proc, signal.SIGKILL)


def _signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)


def _report_death(node: NodeConfig, job_id: str, attempt: int, code: int, signalled: bool) -> None:
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
        sink = CelerySink(node.broker_url, node=node.name, token=node.token)
        try:
            sink.send(job_id, attempt, [event])
        finally:
            sink.close()
    except Exception:  # the lease expiry covers a report that could not be sent
        log.exception("could not report the executor's death for %s attempt %s", job_id, attempt)
