"""The admin index's dashboard: jobs and nodes by status, today's spend per target, the rented
machines live now, each linking to the admin list it counts. The app list stays below it.

The site's ``index_template`` (set in console/admin/__init__.py) is
``admin/jobs/dashboard_index.html``: the admin's own index with the ``operator_dashboard`` tag
(jobs/templatetags) above the app list.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any
from urllib.parse import urlencode

from django.db.models import Count, QuerySet, Sum
from django.urls import reverse
from django.utils import timezone

from console.admin.common import STATUS_COLORS
from jobs.models import GpuNode, JobAttempt, TrainingJob
from jobs.services.core import costs
from jobs.states import JobStatus

MACHINES_SHOWN = 20


@dataclass(frozen=True)
class Tally:
    label: str
    count: int
    url: str
    color: str


def _list_url(model: str, **filters: str) -> str:
    base = reverse(f"admin:jobs_{model}_changelist")
    return f"{base}?{urlencode(filters)}" if filters else base


def jobs_by_status() -> list[Tally]:
    """Every status (zeros too, in the lifecycle's order) with its jobs list link."""
    counts = dict(TrainingJob.objects.values_list("status").annotate(n=Count("id")).order_by())
    return [
        Tally(s.value, counts.get(s.value, 0),
               _list_url("trainingjob", status__exact=s.value), STATUS_COLORS.get(s.value, ""))
        for s in JobStatus
    ]  # fmt: skip


def nodes_by_status() -> list[Tally]:
    counts = dict(GpuNode.objects.values_list("status").annotate(n=Count("id")).order_by())
    return [
        Tally(s.value, counts.get(s.value, 0),
               _list_url("gpunode", status__exact=s.value), STATUS_COLORS.get(s.value, ""))
        for s in GpuNode.Status
    ]  # fmt: skip


def live_machines() -> QuerySet[JobAttempt]:
    """Attempts holding a rented machine now: a provider instance, not ended."""
    return JobAttempt.objects.filter(ended_at__isnull=True).exclude(provider_instance_id="")


def _start_of_today() -> datetime:
    today = timezone.localdate()
    return timezone.make_aware(datetime(today.year, today.month, today.day))


@dataclass(frozen=True)
class Spend:
    target: str
    ended: Decimal  # settled cost of the attempts that ended today
    running: Decimal  # what live machines have cost so far since midnight
    url: str

    @property
    def total(self) -> Decimal:
        return self.ended + self.running


def spend_today(now: datetime | None = None) -> list[Spend]:
    """Per target: the settled cost of attempts that ended today, plus what the live machines
    have cost since midnight (at the rate ``services.costs.attempt_rate`` gives)."""
    now = now or timezone.now()
    midnight = _start_of_today()
    ended = dict(
        JobAttempt.objects.filter(ended_at__gte=midnight, cost__isnull=False)
        .values_list("target")
        .annotate(total=Sum("cost"))
        .order_by()
    )
    running: dict[str, Decimal] = {}
    for attempt in (
        live_machines()
        .filter(launched_at__isnull=False)
        .only("target", "launched_at", *costs.RATE_FIELDS)
    ):
        cost = costs.rented_cost(attempt, since=midnight, until=now)
        if cost is not None:
            running[attempt.target] = running.get(attempt.target, Decimal(0)) + cost
    return [
        Spend(target, ended.get(target, Decimal(0)), running.get(target, Decimal(0)),
              _list_url("trainingjob", target__exact=target))
        for target in sorted(set(ended) | set(running))
    ]  # fmt: skip


@dataclass(frozen=True)
class Machine:
    job_id: str
    job_url: str
    attempt: int
    target: str
    instance: str
    rate: Decimal | None
    launched_at: datetime | None
    age: timedelta | None


def machines(now: datetime | None = None, limit: int = MACHINES_SHOWN) -> tuple[list[Machine], int]:
    """The newest ``limit`` live machines, and how many there are."""
    now = now or timezone.now()
    rows = live_machines().select_related("job").only(
        "number", "target", "provider_instance_id", "launched_at", "created_at",
        "job__public_id", *costs.RATE_FIELDS,
    )  # fmt: skip
    shown = [
        Machine(
            a.job.public_id, reverse("admin:jobs_trainingjob_change", args=[a.job_id]), a.number,
            a.target, a.provider_instance_id, costs.attempt_rate(a), a.launched_at,
            now - a.launched_at if a.launched_at else None,
        )
        for a in rows.order_by("-created_at")[:limit]
    ]  # fmt: skip
    return shown, live_machines().count()


def dashboard(now: datetime | None = None) -> dict[str, Any]:
    now = now or timezone.now()
    spend = spend_today(now)
    shown, total = machines(now)
    return {
        "jobs": jobs_by_status(),
        "nodes": nodes_by_status(),
        "spend": spend,
        "spend_total": sum((s.total for s in spend), Decimal(0)),
        "machines": shown,
        "machines_total": total,
        "machines_url": _list_url("trainingjob", machine="live"),
        "today": timezone.localdate(),
    }
