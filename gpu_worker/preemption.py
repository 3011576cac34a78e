"""The provider's warning that it takes the machine back (a spot interruption), watched from
inside the executor.

Once a notice is up, the run stops like a pause: the Trainer saves the last finished step at
the next step boundary and it is uploaded to the attempt's checkpoint slot at once (the usual
checkpoint path, gpu_worker.checkpoints). The run then ends ``failed`` with reason
``preempted`` and exit code 5 (trainhub_contract.outcomes.ExitCode.PREEMPTED); the control plane
retries that reason, so the job goes back to ``queued`` and its next attempt resumes from the
newest sealed checkpoint. A machine that goes before its checkpoint is out needs nothing more:
its lease expires as for any lost machine.

Turned on by the spec's ``preemption_notice`` (``"aws"``; null or absent: off), or, for a
launcher that does not build the spec, by ``TRAINHUB_PREEMPTION_NOTICE=aws`` in the
executor's environment. ``TRAINHUB_IMDS_URL`` replaces the metadata service's address (tests,
or the IPv6 endpoint ``http://[fd00:ec2::254]``); ``TRAINHUB_PREEMPTION_POLL_SECONDS`` the
seconds between two checks (default 5, as AWS suggests).

AWS, EC2 instance metadata service version 2 (IMDSv2), as documented for spot instances:

* A session token first: ``PUT /latest/api/token`` carrying the header
  ``X-aws-ec2-metadata-token-ttl-seconds`` (1 to 21600 seconds). The response body is the
  token as plain text. Each read then carries it in ``X-aws-ec2-metadata-token``. A token that
  expired or that the service does not know is answered 401; the watcher then fetches a new one
  and reads once more. Where the PUT gets no answer but reads do (IMDSv1 still allowed, e.g. a
  container the token's response cannot reach), reads go without the header.
* ``GET /latest/meta-data/spot/instance-action``: 404 Not Found for as long as nothing is
  planned. When EC2 is about to interrupt the instance it answers 200 with a JSON object of
  two strings: ``action``, one of ``terminate``, ``stop`` or ``hibernate``, and ``time``, the
  approximate UTC moment it happens (ISO 8601, e.g. ``"2026-11-25T17:02:00Z"``), about two
  minutes ahead (a hibernation begins at once, without those two minutes).
* ``GET /latest/meta-data/events/recommendations/rebalance``: 404 until EC2 judges the spot
  instance at elevated risk of interruption; then 200 with ``{"noticeTime": "<UTC time>"}``.
  It may come long before the interruption notice, or together with it. The executor answers
  it with one extra checkpoint at the next step boundary and trains on.
* AWS suggests checking every 5 seconds (the default here) and sends both signals on a best
  effort basis only: a machine can be taken without either.

Quiet when there is nothing to watch: if the metadata service does not answer (not on EC2, or
its endpoint turned off) the watcher says so after a few checks with one ``info`` log event,
and training is not affected; it goes on checking, every 30 s by default, so a service that
was only slow (a machine busy loading its model) is still watched once it answers. Failures
after it once answered (a timeout, a 5xx, garbage) are skipped until the next check. Proxies in the environment are ignored (the service is
link-local). Only the standard library is used here.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any

from trainhub_contract.outcomes import StopMode
from trainhub_contract.spec_schema import PREEMPTION_NOTICES

if TYPE_CHECKING:
    from gpu_worker.report import Reporter
    from trainhub_contract.spec import JobSpec

log = logging.getLogger(__name__)

AWS = "aws"
ENV_NOTICE = "TRAINHUB_PREEMPTION_NOTICE"
ENV_IMDS_URL = "TRAINHUB_IMDS_URL"
ENV_POLL_SECONDS = "TRAINHUB_PREEMPTION_POLL_SECONDS"

# Names of the protocol, not secrets (S105).
IMDS_URL = "http://169.254.169.254"
TOKEN_PATH = "/latest/api/token"  # noqa: S105
INSTANCE_ACTION_PATH = "/latest/meta-data/spot/instance-action"
REBALANCE_PATH = "/latest/meta-data/events/recommendations/rebalance"
TOKEN_TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"  # noqa: S105
TOKEN_HEADER = "X-aws-ec2-metadata-token"  # noqa: S105
TOKEN_TTL_SECONDS = 21600  # the longest IMDSv2 allows; renewed a minute before it runs out

POLL_SECONDS = 5.0
TIMEOUT_SECONDS = 1.0  # a link-local service answers in milliseconds
GIVE_UP_AFTER = 3  # checks without any answer before the watcher says there is no service
# ... after which it still checks, this many intervals apart (30 s by default): a spot
# machine's service can be slow to answer while the machine is busiest (loading the model), and
# a notice gives two minutes.
QUIET_INTERVALS = 6
_MAX_BODY = 4096


class Unreachable(Exception):
    """Nothing answered (connection refused, timeout, reset): no metadata service here, or
    not right now."""


# --- what the service says ----------------------------------------------------------------


@dataclass(frozen=True)
class Notice:
    """An announced interruption: what the provider does to the machine, and when."""

    action: str  # terminate, stop or hibernate
    time: str  # as the provider wrote it; "" when it gave none
    at: datetime | None  # ``time`` parsed (UTC); None when unreadable

    def seconds_left(self, now: datetime | None = None) -> int | None:
        if self.at is None:
            return None
        return max(0, round((self.at - (now or datetime.now(UTC))).total_seconds()))

    def describe(self, *, countdown: bool = True) -> str:
        when = f" at {self.time}" if self.time else " shortly"
        left = self.seconds_left() if countdown else None
        return f"AWS will {self.action} this spot machine{when}" + (
            f", in about {left} s" if left is not None else ""
        )


def _parse_time(text: str) -> datetime | None:
    try:
        at = datetime.fromisoformat(text)  # Python 3.11 reads a trailing "Z"
    except ValueError:
        return None
    return at if at.tzinfo else at.replace(tzinfo=UTC)


def _json_object(body: bytes) -> dict[str, Any] | None:
    try:
        data = json.loads(body)
    except ValueError:  # UnicodeDecodeError included
        return None
    return data if isinstance(data, dict) else None


def parse_instance_action(body: bytes) -> Notice | None:
    """The notice in a 200 answer of ``spot/instance-action``; None for a body that is not
    one (not a JSON object, no action)."""
    data = _json_object(body)
    action = data.get("action") if data else None
    if not isinstance(action, str) or not action.strip():
        return None
    when = data.get("time") if data else None
    when = when.strip()[:64] if isinstance(when, str) else ""
    return Notice(action.strip()[:32], when, _parse_time(when) if when else None)


def parse_rebalance(body: bytes) -> str | None:
    """The ``noticeTime`` of a 200 answer of ``events/recommendations/rebalance`` ("" when it
    has none); None for a body that is not a JSON object."""
    data = _json_object(body)
    if data is None:
        return None
    when = data.get("noticeTime")
    return when.strip()[:64] if isinstance(when, str) else ""


# --- the client -----------------------------------------------------------------------------


class ImdsClient:
    """IMDSv2 reads with a cached session token, a short timeout on every call and no proxy."""

    def __init__(
        self,
        base_url: str = IMDS_URL,
        *,
        timeout: float = TIMEOUT_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"the instance metadata URL {base_url!r} must start with http://")
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self._clock = clock
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        self._token: str | None = None
        self._token_until = 0.0
        self._v1_only = False  # the token PUT got no answer while reads did

    def _request(self, method: str, path: str, headers: dict[str, str]) -> tuple[int, bytes]:
        url = self.base_url + path  # http(s) only: checked in __init__
        request = urllib.request.Request(url, method=method, headers=headers)  # noqa: S310
        try:
            with self._opener.open(request, timeout=self.timeout) as response:
                return int(response.status), bytes(response.read(_MAX_BODY))
        except urllib.error.HTTPError as exc:  # an answer all the same (404, 401, 5xx)
            with exc:
                return int(exc.code), b""
        except (OSError, http.client.HTTPException) as exc:  # URLError is an OSError
            raise Unreachable(f"{method} {path}: {exc}") from exc

    def token(self) -> str | None:
        """The session token (fetched when missing or about to expire); None when the service
        refuses to issue one (reads then go without). Raises Unreachable."""
        now = self._clock()
        if self._token is not None and now < self._token_until:
            return self._token
        self._token = None
        status, body = self._request("PUT", TOKEN_PATH, {TOKEN_TTL_HEADER: str(TOKEN_TTL_SECONDS)})
        text = body.decode("ascii", "replace").strip()
        if status == 200 and text:
            self._token, self._token_until = text, now + TOKEN_TTL_SECONDS - 60
        return self._token

    def get(self, path: str) -> tuple[int, bytes]:
        """GET ``path`` with the token; (status, body). Raises Unreachable."""
        token: str | None = None
        put_unanswered = False
        if not self._v1_only:
            try:
                token = self.token()
            except Unreachable:
                put_unanswered = True
        status, body = self._request("GET", path, {TOKEN_HEADER: token} if token else {})
        if status == 401 and token is not None:  # expired or unknown: once more, fresh
            self._token = None
            token = self.token()
            status, body = self._request("GET", path, {TOKEN_HEADER: token} if token else {})
        self._v1_only = self._v1_only or put_unanswered  # reads answer; the PUT does not
        return status, body

    def instance_action(self) -> Notice | None:
        status, body = self.get(INSTANCE_ACTION_PATH)
        return parse_instance_action(body) if status == 200 else None

    def rebalance(self) -> str | None:
        status, body = self.get(REBALANCE_PATH)
        return parse_rebalance(body) if status == 200 else None


# --- the watcher ----------------------------------------------------------------------------


class PreemptionWatcher:
    """Checks the metadata service every ``interval`` seconds on a daemon thread.

    Called, it is a stop probe (``train.run`` asks it beside the launcher's): ``StopMode.PREEMPT``
    once an interruption notice is up, else None. :meth:`checkpoint_asked` answers True once
    after a rebalance recommendation (the Checkpointer then saves at the next step). Events:
    a ``log`` warning for each signal (``data.notice`` is ``spot_interruption`` or
    ``rebalance_recommendation``), and one ``info`` line saying whether it watches at all.
    """

    def __init__(
        self,
        client: ImdsClient,
        reporter: Reporter,
        *,
        interval: float = POLL_SECONDS,
        quiet_interval: float | None = None,
    ) -> None:
        self.client = client
        self.reporter = reporter
        self.interval = interval
        self.quiet_interval = quiet_interval or QUIET_INTERVALS * interval
        self.notice: Notice | None = None
        self.rebalance: str | None = None
        self.available: bool | None = None  # None until it answered or was called silent
        self._noticed = threading.Event()
        self._asked = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __call__(self) -> StopMode | None:
        return StopMode.PREEMPT if self._noticed.is_set() else None

    def checkpoint_asked(self) -> bool:
        """True once per rebalance recommendation (the training thread is the one consumer)."""
        if self._asked.is_set():
            self._asked.clear()
            return True
        return False

    def check(self) -> bool:
        """One look at the service; False when nothing answered."""
        try:
            notice = self.client.instance_action()
            rebalance = None
            if notice is None and self.rebalance is None:  # the notice supersedes it
                rebalance = self.client.rebalance()
        except Unreachable as exc:
            log.debug("instance metadata service: %s", exc)
            return False
        if rebalance is not None:
            self._on_rebalance(rebalance)
        if notice is not None:
            self._on_notice(notice)
        return True

    def _on_rebalance(self, when: str) -> None:
        self.rebalance = when
        self.reporter.log(
            "Rebalance recommendation: AWS sees this spot machine at elevated risk of "
            "interruption" + (f" (since {when})" if when else "") + "; saving a checkpoint at "
            "the next step and training on.",
            "warning",
            notice="rebalance_recommendation",
            provider=AWS,
            notice_time=when,
        )
        self._asked.set()

    def _on_notice(self, notice: Notice) -> None:
        self.notice = notice
        self.reporter.log(
            f"Spot interruption notice: {notice.describe()}. Saving a checkpoint of the last "
            "finished step, then stopping; the job is retried from it.",
            "warning",
            notice="spot_interruption",
            provider=AWS,
            action=notice.action,
            time=notice.time,
            seconds_left=notice.seconds_left(),
        )
        self._noticed.set()  # after the warning, so it goes out before the checkpoint event
        self.reporter.flush()  # the machine may not wait for the next batch

    def _loop(self) -> None:
        misses = 0
        while not self.check():
            misses += 1
            if misses == GIVE_UP_AFTER:
                self.available = False
                self.reporter.log(
                    f"No instance metadata service answered at {self.client.base_url}; "
                    "spot interruption notices are not watched on this machine unless it "
                    f"answers later (checked every {self.quiet_interval:g} s).",
                    "info",
                )
            if self._stop.wait(self.interval if misses < GIVE_UP_AFTER else self.quiet_interval):
                return
        self.available = True
        if self.notice is None:
            self.reporter.log(
                f"Watching for AWS spot interruption notices every {self.interval:g} s.", "info"
            )
        while not self._noticed.is_set() and not self._stop.wait(self.interval):
            self.check()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="preemption-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop checking; waits at most for the check in flight."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=4 * self.client.timeout + 1)

    def __enter__(self) -> PreemptionWatcher:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def notice_source(spec: JobSpec) -> str | None:
    """Whose notices to watch: the spec's ``preemption_notice``, else the environment's
    ``TRAINHUB_PREEMPTION_NOTICE``; None when neither names a known provider."""
    if spec.preemption_notice is not None:
        return spec.preemption_notice
    value = os.environ.get(ENV_NOTICE, "").strip().lower()
    if value in PREEMPTION_NOTICES:
        return value
    if value not in ("", "none", "off", "0", "false"):
        log.warning(
            "%s=%r is not one of %s; preemption notices are not watched",
            ENV_NOTICE,
            value,
            ", ".join(PREEMPTION_NOTICES),
        )
    return None


def _poll_seconds_from_env() -> float:
    text = os.environ.get(ENV_POLL_SECONDS, "").strip()
    try:
        seconds = float(text) if text else POLL_SECONDS
    except ValueError:
        seconds = 0.0
    if not 0.05 <= seconds <= 60:
        log.warning(
            "%s=%r is not 0.05..60 seconds; checking every %g s",
            ENV_POLL_SECONDS,
            text,
            POLL_SECONDS,
        )
        return POLL_SECONDS
    return seconds


def watcher_for(
    spec: JobSpec,
    reporter: Reporter,
    *,
    base_url: str | None = None,
    interval: float | None = None,
) -> PreemptionWatcher | None:
    """The watcher this attempt needs (not started), or None when it watches nothing.
    ``interval``: seconds between checks (default: ``TRAINHUB_PREEMPTION_POLL_SECONDS``, else 5)."""
    if notice_source(spec) is None:
        return None
    if interval is None:
        interval = _poll_seconds_from_env()
    url = base_url or os.environ.get(ENV_IMDS_URL, "").strip() or IMDS_URL
    try:
        client = ImdsClient(url)
    except ValueError as exc:  # a launcher's typo must not cost the run
        reporter.log(f"{exc}; spot interruption notices are not watched.", "warning")
        return None
    return PreemptionWatcher(client, reporter, interval=interval)
