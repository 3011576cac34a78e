"""RunPod serverless (``runpod-serverless``): one RunPod job per attempt on the operator's
endpoint, whose workers run ``gpu_worker.runpod_handler`` over the same executor.

- launch: ``POST /{endpoint}/run`` with the spec as ``input`` and a ``policy`` whose
  ``executionTimeout`` and ``ttl`` cover the attempt (RunPod's defaults, 10 min and 24 h, kill
  a fine-tune), plus a ``webhook`` when the control plane has a public address. It is not
  retried once it may have reached RunPod (TransientProviderError ``maybe_applied``).
- poll: ``GET /{endpoint}/status/{id}`` per job (the API cannot list). While a job runs, its
  ``output`` is the handler's progress (``{"attempt", "events"}``, a rolling window deduped by
  seq downstream); the final output repeats the window, whose last status event carries the
  bundle's sha256. A 404 means the job's result expired or RunPod never had it: LOST.
- cancel: ``POST /{endpoint}/cancel/{id}``, repeated safely; a job RunPod no longer knows is
  already gone.

Rate limits per bucket are 90% of RunPod's documented ones (run 1000, status 2000, cancel 100
per 10 s), booked in Redis so every worker process shares them. RunPod sets these per
endpoint, and every project runs on the operator's one endpoint, so the buckets stay per
provider (not per key, unlike the pod, Lambda and Vast adapters).

Duplicate runs: a ``/run`` whose answer was lost may still have queued a job, and the attempt is
then submitted again, so RunPod can run the attempt twice. The API cannot list an endpoint's
jobs (only ``/health`` counts them), and a status call names only the job asked for, so the
duplicate's id is first seen in its webhook (the body is the job's ``/status`` object):
``jobs.services.cloud.provider_webhooks`` notes a job id no attempt owns, and the reconciler cancels it through
``cancel`` here (idempotent: a finished or unknown job is fine) and counts it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from gpu_worker import errors as executor_errors
from providers.base import Handle, LaunchRequest, RemoteState, RemoteStatus
from providers.errors import InstanceNotFound, RateLimited, TransientProviderError
from providers.http import ProviderHTTP, shared_http

log = logging.getLogger(__name__)

DEFAULT_URL = "https://api.runpod.ai/v2"
# RunPod's documented limits per 10 s are run 1000, status 2000, cancel 100; trainhub books
# 90% of each, leaving room for clock skew and for calls made outside trainhub.
RATE_LIMITS: dict[str, tuple[int, float]] = {
    "run": (900, 10.0),
    "status": (1800, 10.0),
    "cancel": (90, 10.0),
}
MAX_POLICY_MS = 7 * 24 * 3600 * 1000  # RunPod's cap for executionTimeout and ttl
# Time a job may wait in the endpoint's queue before it runs (ttl counts from submission).
QUEUE_ALLOWANCE_SECONDS = 6 * 3600
# The executor stops itself at max_runtime; this leaves it time to upload and report.
STOP_ALLOWANCE_SECONDS = 15 * 60

STATUS_MAP: Mapping[str, RemoteStatus] = {
    "IN_QUEUE": RemoteStatus.PENDING,
    "IN_PROGRESS": RemoteStatus.RUNNING,
    "RUNNING": RemoteStatus.RUNNING,  # on RunPod's job-states page; treated as IN_PROGRESS
    "COMPLETED": RemoteStatus.SUCCEEDED,
    "FAILED": RemoteStatus.FAILED,
    "CANCELLED": RemoteStatus.CANCELLED,
    "TIMED_OUT": RemoteStatus.FAILED,
}


class RunpodServerless:
    """The adapter for one project's RunPod key and the operator's serverless endpoint."""

    def __init__(
        self, *, api_key: str, endpoint_id: str, http: ProviderHTTP, concurrency: int = 16
    ) -> None:
        if not endpoint_id:
            raise ValueError("runpod-serverless needs the endpoint id (RUNPOD_ENDPOINT_ID)")
        self._key = api_key
        self._endpoint = endpoint_id
        self._http = http
        # Status calls take tens of milliseconds each: thousands per cycle need them in flight
        # together (the shared rate limiter still paces them).
        self._concurrency = concurrency
        self._pool: ThreadPoolExecutor | None = None

    def launch(self, request: LaunchRequest) -> Handle:
        run_ms = min(MAX_POLICY_MS, (request.max_runtime_seconds + STOP_ALLOWANCE_SECONDS) * 1000)
        body: dict[str, Any] = {
            "input": request.spec,
            "policy": {
                "executionTimeout": run_ms,
                "ttl": min(MAX_POLICY_MS, run_ms + QUEUE_ALLOWANCE_SECONDS * 1000),
            },
        }
        if request.webhook_url:
            body["webhook"] = request.webhook_url
        job = self._http.call(
            "POST", f"/{self._endpoint}/run", key=self._key, json=body, bucket="run"
        )
        return Handle(instance_id=str(job["id"]), name=request.name)

    def poll(self, handles: Sequence[Handle]) -> dict[str, RemoteState]:
        """One status call per job, several in flight. A job whose call failed is left out
        (its state is unknown this cycle: the next poll asks again)."""
        if len(handles) <= 1:
            return dict(filter(None, map(self._status, handles)))
        if self._pool is None:  # kept across polls: its threads keep their connections open
            self._pool = ThreadPoolExecutor(self._concurrency, thread_name_prefix="runpod-status")
        return dict(filter(None, self._pool.map(self._status, handles)))

    def _status(self, handle: Handle) -> tuple[str, RemoteState] | None:
        try:
            job = self._http.call(
                "GET",
                f"/{self._endpoint}/status/{handle.instance_id}",
                key=self._key,
                bucket="status",
            )
        except InstanceNotFound:
            return handle.instance_id, RemoteState(
                RemoteStatus.LOST, "RunPod no longer knows this job (its result expired)"
            )
        except (TransientProviderError, RateLimited) as exc:
            log.info("status of %s unknown this cycle: %s", handle.instance_id, exc)
            return None
        return handle.instance_id, job_state(job)

    def cancel(self, handle: Handle) -> None:
        try:
            self._http.call(
                "POST",
                f"/{self._endpoint}/cancel/{handle.instance_id}",
                key=self._key,
                idempotent=True,  # cancelling twice is harmless
                bucket="cancel",
            )
        except InstanceNotFound:
            return  # gone already: nothing bills

    def list_instances(self) -> list[Handle]:
        return []  # serverless jobs cannot be listed; they end with their ttl


def from_settings(secrets: Mapping[str, str]) -> RunpodServerless:
    from django.conf import settings

    return RunpodServerless(
        api_key=secrets["api_key"],
        endpoint_id=settings.RUNPOD_ENDPOINT_ID,
        http=shared_http("runpod-serverless", settings.RUNPOD_SERVERLESS_URL, RATE_LIMITS),
    )


def job_state(job: Mapping[str, Any]) -> RemoteState:
    """A ``/status`` job object as a RemoteState."""
    raw = str(job.get("status", ""))
    status = STATUS_MAP.get(raw)
    output = job.get("output")
    events = _events(output)
    if status is None:
        return RemoteState(RemoteStatus.RUNNING, f"unknown RunPod status {raw!r}", events=events)
    error = job.get("error") or (output.get("error") if isinstance(output, dict) else None)
    if status is RemoteStatus.SUCCEEDED and error:
        status = RemoteStatus.FAILED  # a handler error left COMPLETED (runpod-python #299)
    if status is RemoteStatus.FAILED:
        code, message = _failure(raw, error)
        return RemoteState(status, message, error_code=code, events=events)
    return RemoteState(status, raw, events=events)


def _events(output: object) -> tuple[dict[str, Any], ...]:
    if not isinstance(output, dict) or not isinstance(output.get("events"), list):
        return ()
    return tuple(e for e in output["events"] if isinstance(e, dict))


def _failure(raw: str, error: object) -> tuple[str, str]:
    """(EndReason value, message) of a failed job."""
    if raw == "TIMED_OUT":
        return (
            executor_errors.TIMEOUT,
            "RunPod timed the job out (never picked up, or ran past its policy)",
        )
    text = error if isinstance(error, str) else json.dumps(error) if error else "no error given"
    try:  # the worker SDK's shape when the handler raised: a JSON string
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict) and "error_message" in parsed:
        return (
            executor_errors.INTERNAL_ERROR,
            f"{parsed.get('error_type', 'error')}: {parsed['error_message']}",
        )
    reason, _, rest = text.partition(": ")
    if reason in executor_errors.REASONS and rest:  # the handler's "<reason>: <message>"
        return reason, rest
    return "provider_error", text[:1000]
