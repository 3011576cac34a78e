"""One sink of a Reporter and the events it has not confirmed yet: sent in chunks, kept on a
failure, and retried by immediate events only after a backoff (flush, heartbeat and close
always try)."""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable
from typing import Any

from gpu_worker.sinks import Sink

log = logging.getLogger(__name__)

MAX_SEND_EVENTS = 200  # events per sink.send call (a long outage's backlog goes out in chunks)
# Immediate events sent while a sink is failing would stall training on every call; a failed sink
# is retried by those only after this backoff (doubling), while flush()/heartbeat/close always try.
BACKOFF_START = 1.0
BACKOFF_MAX = 30.0


class Channel:
    """One sink and its backlog (only touched under the reporter's flush lock)."""

    def __init__(self, sink: Sink) -> None:
        self.sink = sink
        self.backlog: collections.deque[dict[str, Any]] = collections.deque()
        self.failures = 0
        self.retry_at = 0.0  # on the reporter's clock

    def send_backlog(self, job_id: str, attempt: int, clock: Callable[[], float]) -> None:
        """Send the whole backlog; on a failure keep what was not confirmed and back off."""
        try:
            while self.backlog:
                chunk = [self.backlog[i] for i in range(min(MAX_SEND_EVENTS, len(self.backlog)))]
                self.sink.send(job_id, attempt, chunk)
                for _ in chunk:
                    self.backlog.popleft()
        except Exception as err:
            self.failures += 1
            self.retry_at = clock() + min(BACKOFF_MAX, BACKOFF_START * 2 ** (self.failures - 1))
            # First failure loud, repeats quiet: a broker outage must not flood the log.
            log.log(
                logging.WARNING if self.failures == 1 else logging.DEBUG,
                "sending %d event(s) to %r failed (%s: %s); kept for retry",
                len(self.backlog),
                self.sink,
                type(err).__name__,
                err,
            )
        else:
            if self.failures:
                log.info("%r delivers again after %d failure(s)", self.sink, self.failures)
            self.failures = 0
            self.retry_at = 0.0
