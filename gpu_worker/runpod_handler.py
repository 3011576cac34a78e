"""RunPod serverless handler: one training attempt per RunPod job, over the same ``run()``.

The job's ``input`` is the job spec. Progress goes out through ``progress_update`` (a RunPod
sink is always added to whatever the spec's ``report`` block asks for); the result is::

    {"status": "succeeded", "sha256", "size", "manifest", "metrics", "events": [...]}

or ``{"error": "<reason>: <message>"}`` — a *string*: a dict error can leave the RunPod job
COMPLETED (runpod-python issue #299). ``<reason>`` is an EndReason value (``oom``,
``invalid_dataset``, ...). Every run sets ``refresh_worker`` so the next job gets a fresh worker
rather than a GPU whose memory the last run left behind.

The handler is ``async`` so the SDK's event loop keeps running while training runs in a
thread: that loop long-polls RunPod's stop channel, and a cancel or timeout arrives as
``CancelledError``, which asks ``run()`` to stop (within one optimizer step) before re-raising.

Entry point on the worker image: ``python -m gpu_worker.runpod_handler``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpu_worker.errors import CANCELLED, INTERNAL_ERROR
from gpu_worker.logcapture import LogCapture
from gpu_worker.redaction import Redactor, secret_values
from gpu_worker.report import Reporter, RunpodSink
from trainhub_contract.outcomes import Outcome
from trainhub_contract.spec import JobSpec, SpecError, parse_job_spec

log = logging.getLogger(__name__)

# How long a cancelled job may take to stop and clean up before the handler gives up waiting.
STOP_GRACE_SECONDS = 60.0
# The SDK's own log lines ("DEBUG  | ..." locally, JSON on an endpoint): they quote our progress
# updates, events and all, so as log events they would feed themselves.
RUNPOD_SDK_LINE = re.compile(r'^(?:\{"requestId"|(?:TRACE|DEBUG|INFO|WARN|ERROR|TIP)\s*\| )')


async def handler(job: dict[str, Any]) -> dict[str, Any]:
    """Run the attempt described by ``job["input"]``; see the module docstring for the result."""
    try:
        spec = parse_job_spec(job.get("input"))
    except SpecError as err:
        return {"error": f"{INTERNAL_ERROR}: invalid job spec: {err.message}"}
    try:
        reporter = Reporter.from_spec(spec, runpod_job=job)
    except ValueError as err:
        return {"error": f"{INTERNAL_ERROR}: invalid report settings: {err}"}

    stop = threading.Event()
    work = asyncio.ensure_future(asyncio.to_thread(run_attempt, spec, reporter, stop.is_set))
    try:
        return await asyncio.shield(work)
    except asyncio.CancelledError:
        stop.set()
        try:
            await asyncio.wait_for(asyncio.shield(work), timeout=STOP_GRACE_SECONDS)
        except (asyncio.CancelledError, Exception):  # TimeoutError included
            log.warning("job %s did not finish stopping cleanly", job.get("id"))
        raise


def run_attempt(
    spec: JobSpec, reporter: Reporter, should_stop: Callable[[], bool]
) -> dict[str, Any]:
    """The blocking part: train in a scratch directory and turn the RunResult into the output."""
    workdir = Path(
        tempfile.mkdtemp(prefix=f"{spec.job_id}-", dir=os.environ.get("TRAINHUB_WORKDIR"))
    )
    capture = LogCapture(reporter, redactor=Redactor(secret_values(spec)), ignore=RUNPOD_SDK_LINE)
    try:
        with reporter, capture:
            try:
                from gpu_worker import train  # lazy: imports torch and the training backend

                result = train.run(
                    spec, reporter=reporter, workdir=workdir, should_stop=should_stop
                )
            except Exception as err:
                # run() turns known failures into a RunResult; anything reaching here is a bug,
                # still reported as a string error so the job does not look COMPLETED.
                log.exception("training crashed")
                message = f"{type(err).__name__}: {err}"
                reporter.error(INTERNAL_ERROR, message)
                return {"error": f"{INTERNAL_ERROR}: {message}", "refresh_worker": True}
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if result.status is Outcome.SUCCEEDED:
        return {
            "status": Outcome.SUCCEEDED.value,
            "sha256": result.bundle_sha256,
            "size": result.bundle_size,
            "manifest": result.manifest,
            "metrics": result.metrics,
            "events": _events_window(reporter),
            "refresh_worker": True,
        }
    reason = result.reason or (CANCELLED if result.status is Outcome.CANCELLED else INTERNAL_ERROR)
    return {"error": f"{reason}: {result.message}", "refresh_worker": True}


def _events_window(reporter: Reporter) -> list[dict[str, Any]]:
    for sink in reporter.sinks:
        if isinstance(sink, RunpodSink):
            return sink.window()
    return []


if __name__ == "__main__":
    import runpod

    runpod.serverless.start({"handler": handler})
