"""A GPU node's HTTPS calls to the control plane (no Django).

The broker only tells a node *which* attempt to start ({"job_id", "attempt"}); everything
that matters travels here, to the control URL from the node's own configuration and
authenticated by its token (``Authorization: Bearer thn-…``):

- ``POST nodes/<name>/claim/``: start the attempt; the answer holds its spec (signed URLs and
  all) and the report token its executor sends events with. Answered once per attempt.
- ``POST nodes/<name>/heartbeat/``: alive (with the registration now and then, or "stopping";
  with ``models``, the base models cached on the node, when registering or when they changed);
  the answer lists the attempts to stop (``{"job_id", "attempt", "mode"}``, mode "cancel" or
  "pause"; absent from older control planes: cancel), so a stop reaches a node that cannot
  publish.
- ``POST nodes/<name>/attempts/<job_id>/<attempt>/events/``: the executor's event batches, with
  the attempt's report token (gpu_worker.sinks.HttpSink), not the node token.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import requests

from gpu_worker.agent.node import NodeConfig
from gpu_worker.retrying import RetryPolicy
from trainhub_contract.outcomes import StopMode

log = logging.getLogger(__name__)

# Ids from a broker message name files on the node: only these shapes are accepted.
JOB_ID = re.compile(r"ftjob-[A-Za-z0-9]{1,64}")
MAX_ATTEMPT = 10_000
# Three tries, 2 s then 4 s apart: the control plane restarting is the usual cause.
CLAIM_RETRY = RetryPolicy(attempts=3, backoff_seconds=2.0, jitter=False)
TIMEOUT = (5, 30)


def checked_ids(job_id: object, attempt: object) -> tuple[str, int]:
    """The attempt a message names; ValueError for anything that is not a job id and an
    attempt number (``../../etc`` included) before it can name a file."""
    if not isinstance(job_id, str) or not JOB_ID.fullmatch(job_id):
        raise ValueError(f"not a job id: {str(job_id)[:80]!r}")
    if isinstance(attempt, bool) or not isinstance(attempt, int) or not 0 < attempt <= MAX_ATTEMPT:
        raise ValueError(f"not an attempt number: {str(attempt)[:20]!r}")
    return job_id, attempt


def events_url(control_url: str, node: str, job_id: str, attempt: int) -> str:
    return f"{control_url}/api/v1/nodes/{node}/attempts/{job_id}/{attempt}/events/"


@dataclass(frozen=True)
class Claim:
    """A claimed attempt: its spec and the token its executor reports with."""

    spec: dict[str, Any] = field(repr=False)
    report_token: str = field(repr=False)


class _NoAnswer(Exception):
    """The control plane answered with neither a yes nor a no (a 5xx, mostly)."""

    def __init__(self, response: requests.Response) -> None:
        super().__init__(f"answered HTTP {response.status_code}")
        self.response = response


class NodeApi:
    def __init__(self, node: NodeConfig) -> None:
        self.node = node
        self._base = f"{node.control_url}/api/v1/nodes/{node.name}"
        self._session = requests.Session()
        self._session.headers["Authorization"] = f"Bearer {node.token}"

    def claim(
        self, job_id: str, attempt: int, *, sleep: Callable[[float], None] = time.sleep
    ) -> Claim | None:
        """The attempt's spec if it is ours to run; None if it is not (duplicate, outdated or
        cancelled). Network trouble raises after a few tries: the message is then dropped
        and the dispatcher sends the attempt again."""
        body = {"job_id": job_id, "attempt": attempt}

        def ask() -> Claim | None:
            resp = self._session.post(f"{self._base}/claim/", json=body, timeout=TIMEOUT)
            if resp.status_code == 200:
                answer = resp.json()
                spec = answer["spec"]
                if (spec.get("job_id"), spec.get("attempt")) != (job_id, attempt):
                    raise ValueError(f"the claim of {body} answered another attempt's spec")
                return Claim(spec=spec, report_token=str(answer["report_token"]))
            if resp.status_code in (401, 403, 404, 409):
                log.warning("claim of %s refused (%s): %s", body, resp.status_code, resp.text[:300])
                return None
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
        return None

    def heartbeat(
        self,
        *,
        registration: dict[str, Any] | None = None,
        running: tuple[str, int] | None = None,
        stopping: bool = False,
        models: list[str] | None = None,
        server: dict[str, Any] | None = None,
    ) -> dict[tuple[str, int], StopMode]:
        """Say the node is alive; returns the attempts the control plane wants stopped, and how
        (``running``, what this node runs, among them once it is cancelled, paused or ended)."""
        body: dict[str, Any] = {"stopping": stopping}
        if registration is not None:
            body["registration"] = registration
        if running is not None:
            body["running"] = list(running)
        if models is not None:
            body["models"] = models
        if server is not None:
            body["server"] = server
        resp = self._session.post(f"{self._base}/heartbeat/", json=body, timeout=TIMEOUT)
        resp.raise_for_status()
        stops: dict[tuple[str, int], StopMode] = {}
        for item in resp.json().get("cancel", []):
            try:
                ids = checked_ids(item.get("job_id"), item.get("attempt"))
            except (AttributeError, ValueError) as exc:
                log.warning("ignoring a malformed cancel %r: %s", item, exc)
                continue
            # Anything but an explicit pause stops at once: the safe reading of an odd mode.
            pause = item.get("mode") == StopMode.PAUSE
            stops[ids] = StopMode.PAUSE if pause else StopMode.CANCEL
        return stops

    def close(self) -> None:
        self._session.close()
