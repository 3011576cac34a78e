"""Read-only queries behind the operator's job page and jobs list: what a job costs so far,
how far it got, where it runs, its metric series, its events and log lines.

Each decision is made once, where the rest of trainhub makes it: the rate an attempt is billed
at (``services.costs.attempt_rate``), when a running job should finish
(``api.presenters.estimated_finish``), which statuses allow which action (``jobs.states`` and
the services' own guards). This module only reads and combines them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from django.db.models import Prefetch, QuerySet
from django.db.models.fields.json import KeyTextTransform

from api.presenters import estimated_finish
from jobs.models import JobAttempt, JobEvent, TrainingJob
from jobs.services.core import costs as costs  # training_jobs reads queries.costs
from jobs.services.core.events import EVENT_TYPES
from jobs.services.core.jobs import PAUSABLE
from jobs.services.outbound.notifications import NOTIFICATION
from jobs.states import ALLOWED_FROM, TERMINAL, JobStatus

S = JobStatus
# The attempt fields the list and the job page read (never the SSH key or host key).
ATTEMPT_FIELDS = (
    "id",
    "job_id",
    "number",
    "target",
    "node_name",
    "provider_instance_id",
    "provider_job_id",
    "ssh_host",
    "ssh_port",
    "launched_at",
    "started_at",
    "ended_at",
    "end_reason",
    "estimated_cost",
    "cost",
    *costs.RATE_FIELDS,  # what services.costs needs to price it (no query per attempt)
)
HIDDEN_BY_DEFAULT = ("metrics", "heartbeat")  # per-second noise: shown when asked for by type
ADMIN_EVENT_TYPES = tuple(sorted(EVENT_TYPES | {NOTIFICATION}))
LEVELS = tuple(JobEvent.Level.values)


# --- attempts, cost, progress -------------------------------------------------------------------


def with_attempts(jobs: QuerySet[TrainingJob]) -> QuerySet[TrainingJob]:
    """``jobs`` with their attempts (newest first) in ``admin_attempts``: one query per page,
    however many jobs it shows."""
    attempts = JobAttempt.objects.only(*ATTEMPT_FIELDS).order_by("-number")
    return jobs.prefetch_related(Prefetch("attempts", queryset=attempts, to_attr="admin_attempts"))


def attempts_of(job: TrainingJob) -> list[JobAttempt]:
    """The job's attempts, newest first (prefetched by ``with_attempts`` where it was used)."""
    prefetched = getattr(job, "admin_attempts", None)
    if prefetched is not None:
        return list(prefetched)
    return list(job.attempts.only(*ATTEMPT_FIELDS).order_by("-number"))


def live_attempt(attempts: Sequence[JobAttempt]) -> JobAttempt | None:
    return next((a for a in attempts if a.ended_at is None), None)


def attempt_cost_so_far(attempt: JobAttempt, now: datetime) -> Decimal | None:
    """An ended attempt's settled cost; a live rented one's cost up to ``now``."""
    if attempt.ended_at is not None or attempt.cost is not None:
        return attempt.cost
    return costs.rented_cost(attempt, until=now)


def job_cost_so_far(
    job: TrainingJob, attempts: Sequence[JobAttempt], now: datetime
) -> Decimal | None:
    """What the job's rented machines have cost: its settled sum (``job.cost``) plus the live
    attempt's cost so far. None when nothing was rented (the own fleet costs nothing here)."""
    live = live_attempt(attempts)
    running = attempt_cost_so_far(live, now) if live is not None else None
    if job.cost is None and running is None:
        return None
    return (job.cost or Decimal(0)) + (running or Decimal(0))


def price_per_hour(attempts: Sequence[JobAttempt]) -> Decimal | None:
    """The rate of the live attempt's machine, else of the latest attempt's."""
    chosen = live_attempt(attempts) or (attempts[0] if attempts else None)
    return costs.attempt_rate(chosen) if chosen is not None else None


@dataclass(frozen=True)
class Progress:
    step: int
    total: int

    @property
    def percent(self) -> int:
        return min(100, int(100 * self.step / self.total))

    def __str__(self) -> str:
        return f"{self.step}/{self.total} ({self.percent}%)"

    def compact(self) -> str:
        """As ``str``, with step counts from 10,000 on in thousands (120k/400k (30%))."""
        return f"{_thousands(self.step)}/{_thousands(self.total)} ({self.percent}%)"


def _thousands(n: int) -> str:
    return f"{n / 1000:.4g}k" if n >= 10_000 else str(n)


def progress(job: TrainingJob) -> Progress | None:
    """Steps done of the total, from the job's latest metrics (what the API shows)."""
    m = job.latest_metrics or {}
    step, total = m.get("step"), m.get("total_steps")
    if not isinstance(step, int) or not isinstance(total, int) or total <= 0 or step < 0:
        return None
    return Progress(step, total)


@dataclass(frozen=True)
class Throughput:
    """The latest rates the executor reported (gpu_worker.token_counts): tokens that carry
    loss, all tokens that are not padding, and the padding's share of the positions."""

    useful: float | None
    tokens: float | None
    padding: float | None

    def __str__(self) -> str:
        parts = []
        if self.useful is not None:
            parts.append(f"{self.useful:,.0f} useful tokens/s")
        if self.tokens is not None:
            parts.append(f"{'of ' if parts else ''}{self.tokens:,.0f} tokens/s")
        text = " ".join(parts)
        if self.padding is not None:
            text += f"{' · ' if text else ''}{self.padding:.1%} padding"
        return text


def throughput(job: TrainingJob) -> Throughput | None:
    m = job.latest_metrics or {}

    def number(key: str) -> float | None:
        value = m.get(key)
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            return None
        return float(value)

    found = Throughput(
        number("useful_tokens_per_second"), number("tokens_per_second"), number("padding_share")
    )
    return found if str(found) else None


def eta(job: TrainingJob) -> datetime | None:
    finish = estimated_finish(job)
    return datetime.fromtimestamp(finish, tz=UTC) if finish is not None else None


def attempts_used(job: TrainingJob, attempts: Sequence[JobAttempt]) -> int:
    """Attempts counted against ``max_attempts`` (attempts newest first)."""
    return job.attempts_counted(attempts[0].number if attempts else 0)


def waiting_reason(job: TrainingJob) -> str:
    """Why a queued job waits (the operator's wording, node names included); '' otherwise."""
    return job.waiting_reason if job.status == S.QUEUED else ""


@dataclass(frozen=True)
class Place:
    """Where an attempt runs: a node of the own fleet, or a provider's machine."""

    own_fleet: bool
    node: str = ""
    target: str = ""
    machine: str = ""  # instance id, else the provider's job id
    detail: str = ""  # GPU and region of the offer, the SSH address

    def short(self) -> str:
        if self.own_fleet:
            return self.node or "own fleet"
        return f"{self.target} {self.machine}".strip()


def place(attempt: JobAttempt | None) -> Place | None:
    if attempt is None:
        return None
    if attempt.on_own_fleet:
        return Place(own_fleet=True, node=attempt.node_name)
    offer = attempt.offer or {}
    gpu = offer.get("gpu_name")
    parts = [
        f"{offer.get('gpu_count') or 1}x {gpu}" if gpu else "",
        str(offer.get("region") or ""),
        f"ssh {attempt.ssh_host}:{attempt.ssh_port}" if attempt.ssh_host else "",
    ]
    return Place(
        own_fleet=False,
        target=attempt.target,
        machine=attempt.provider_instance_id or attempt.provider_job_id,
        detail=", ".join(p for p in parts if p),
    )


# --- which buttons ------------------------------------------------------------------------------


def valid_actions(status: str) -> list[str]:
    """The job actions its status allows, in the order the buttons show. The services decide
    again when a button is pressed (a status may have moved meanwhile)."""
    s = S(status)
    allowed = []
    if s in PAUSABLE:
        allowed.append("pause")
    if s == S.PAUSED:
        allowed.append("resume")
    if s in ALLOWED_FROM[S.QUEUED] & TERMINAL:  # back to the queue from an end: a retry
        allowed.append("retry")
    if s in ALLOWED_FROM[S.CANCELLING]:
        allowed.append("cancel")
    return allowed


# --- metric series ------------------------------------------------------------------------------


def _number(raw: Any) -> float | None:
    """A finite float from a JSON value as the database hands it back (text on PostgreSQL's
    ``->>``, a number on SQLite); None for anything else (a hostile executor may send text)."""
    if raw is None or isinstance(raw, bool):
        return None
    try:
        value = float(raw)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


@dataclass
class MetricSeries:
    """(step, value) pairs in step order; a step reported again (a resumed attempt repeats the
    steps after its checkpoint) keeps the latest value."""

    loss: list[tuple[float, float]] = field(default_factory=list)
    eval_loss: list[tuple[float, float]] = field(default_factory=list)
    eval_score: list[tuple[float, float]] = field(default_factory=list)  # the job's grader
    lr: list[tuple[float, float]] = field(default_factory=list)
    total_steps: int | None = None
    events: int = 0  # metrics events read


def _by_step(pairs: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    latest = dict(pairs)  # later events win
    return sorted(latest.items())


def metric_series(job: TrainingJob) -> MetricSeries:
    """The job's train loss and learning rate (its ``metrics`` events) and validation loss (the
    ``log`` events carrying ``eval_loss``). Only the few keys are read from the database, so a
    100k-step job costs one lean scan; the chart downsamples what it draws."""
    events = JobEvent.objects.filter(job_id=job.pk).order_by("number")
    rows = (
        events.filter(type="metrics")
        .annotate(
            m_step=KeyTextTransform("step", "data"),
            m_loss=KeyTextTransform("loss", "data"),
            m_lr=KeyTextTransform("lr", "data"),
            m_total=KeyTextTransform("total_steps", "data"),
        )
        .values_list("m_step", "m_loss", "m_lr", "m_total")
    )
    out = MetricSeries()
    loss, lr = [], []
    for raw_step, raw_loss, raw_lr, raw_total in rows.iterator(chunk_size=5000):
        out.events += 1
        step = _number(raw_step)
        if step is None:
            continue
        if (value := _number(raw_loss)) is not None:
            loss.append((step, value))
        if (value := _number(raw_lr)) is not None:
            lr.append((step, value))
        if (total := _number(raw_total)) is not None and total > 0:
            out.total_steps = int(total)
    out.eval_loss = _logged(events, "eval_loss")
    out.eval_score = _logged(events, "eval_score")
    out.loss, out.lr = _by_step(loss), _by_step(lr)
    return out


def _logged(events: QuerySet[JobEvent], key: str) -> list[tuple[float, float]]:
    """A figure the executor logs at a step (validation loss, a grader's score), by step."""
    rows = (
        events.filter(type="log", data__has_key=key)
        .annotate(m_step=KeyTextTransform("step", "data"), m_value=KeyTextTransform(key, "data"))
        .values_list("m_step", "m_value")
    )
    pairs = ((_number(s), _number(v)) for s, v in rows.iterator(chunk_size=5000))
    return _by_step((s, v) for s, v in pairs if s is not None and v is not None)


# --- events and log lines -----------------------------------------------------------------------

EVENTS_PAGE = 50


@dataclass(frozen=True)
class EventFilter:
    type: str = ""  # one of ADMIN_EVENT_TYPES; '' = every type but the hidden ones
    level: str = ""  # one of LEVELS; '' = every level
    attempt: int | None = None
    before: int | None = None  # keyset: events numbered below (older page)
    after: int | None = None  # keyset: events numbered above (newer page)

    @classmethod
    def from_query(cls, query: Any) -> EventFilter:
        """From the page's query string (``ev_type``, ``ev_level``, ``ev_attempt``,
        ``ev_before``, ``ev_after``); anything not understood is ignored."""

        def number(name: str) -> int | None:
            raw = query.get(name, "")
            return int(raw) if raw.isascii() and raw.isdigit() and len(raw) < 10 else None

        kind = query.get("ev_type", "")
        level = query.get("ev_level", "")
        return cls(
            type=kind if kind in ADMIN_EVENT_TYPES else "",
            level=level if level in LEVELS else "",
            attempt=number("ev_attempt"),
            before=number("ev_before"),
            after=number("ev_after"),
        )

    def query(self, **changes: Any) -> dict[str, str]:
        """The query-string pairs of this filter with ``changes`` (None drops a key)."""
        values = {
            "ev_type": self.type,
            "ev_level": self.level,
            "ev_attempt": self.attempt,
            "ev_before": self.before,
            "ev_after": self.after,
            **changes,
        }
        return {k: str(v) for k, v in values.items() if v not in (None, "")}


@dataclass(frozen=True)
class EventPage:
    events: list[JobEvent]
    older: int | None  # ev_before for the next older page, None at the oldest
    newer: int | None  # ev_after for the next newer page, None at the newest


def events_page(job: TrainingJob, f: EventFilter, size: int = EVENTS_PAGE) -> EventPage:
    """One page of the job's events, newest first, by keyset on the event number (a deep page
    costs what the first does)."""
    rows = JobEvent.objects.filter(job_id=job.pk).defer("data")
    rows = rows.filter(type=f.type) if f.type else rows.exclude(type__in=HIDDEN_BY_DEFAULT)
    if f.level:
        rows = rows.filter(level=f.level)
    if f.attempt is not None:
        rows = rows.filter(attempt=f.attempt)
    if f.after is not None and f.before is None:
        ascending = list(rows.filter(number__gt=f.after).order_by("number")[: size + 1])
        has_newer = len(ascending) > size
        page = list(reversed(ascending[:size]))
        has_older = bool(page) and rows.filter(number__lt=page[-1].number).exists()
    else:
        rows_page = rows.filter(number__lt=f.before) if f.before is not None else rows
        descending = list(rows_page.order_by("-number")[: size + 1])
        has_older = len(descending) > size
        page = descending[:size]
        has_newer = f.before is not None and bool(page)
        if has_newer:
            has_newer = rows.filter(number__gt=page[0].number).exists()
    return EventPage(
        events=page,
        older=page[-1].number if page and has_older else None,
        newer=page[0].number if page and has_newer else None,
    )


LOG_TAIL = 30  # lines on the job page
LOG_LINES = (200, 1000, 5000)  # what the log view offers; 5,000 is an attempt's whole log


def log_attempts(job: TrainingJob) -> list[int]:
    """Attempt numbers whose executors sent log lines (0: the control plane's own)."""
    return sorted(
        JobEvent.objects.filter(job_id=job.pk, type="log")
        .values_list("attempt", flat=True)
        .distinct()
    )


def log_lines(job: TrainingJob, *, attempt: int | None, limit: int) -> list[JobEvent]:
    """The latest ``limit`` log events of ``attempt`` (every attempt when None), oldest first."""
    rows = JobEvent.objects.filter(job_id=job.pk, type="log").only(
        "number", "attempt", "level", "message", "created_at"
    )
    if attempt is not None:
        rows = rows.filter(attempt=attempt)
    return list(reversed(rows.order_by("-number")[:limit]))
