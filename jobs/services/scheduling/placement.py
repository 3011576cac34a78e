"""Placing queued cloud jobs: where a job runs, before any machine is rented.

- ``auto``: an idle own GPU node that fits first (the dispatcher places it, free of charge),
  else the cheapest offer of every cloud with a price list that the project can use.
- A priced target (``lambda``, ``vastai``, ``runpod-pod``): the cheapest offer of that target.
- A target without a price list (``runpod-serverless``): launched as it is.

An offer is priced the way the job's ``capacity`` rents it (costs.rental_terms): ``on_demand``
at its on-demand price, ``spot`` at its spot price (offers without one are skipped), ``any`` at
the cheaper of the two. The own fleet ignores ``capacity``.

An offer is skipped, with its reason, when it does not fit the job's ``gpu`` needs, has no
capacity now, cannot be rented as the job asks (no spot price), costs more (at the price the
job would pay) than the job's ``max_price_per_hour`` or than the project's spend ceiling
leaves, ran an earlier attempt of this job that failed, or was refused lately. The rest are
tried cheapest first within one attempt (services.launch). A job nothing can take stays
queued with the reason (``waiting_reason``, and an event when it changes); the beat tries it
again every ``PLACE_INTERVAL_SECONDS``.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from decimal import Decimal

from jobs import gpu_needs
from jobs.models import GpuNode, JobAttempt, TrainingJob
from jobs.services.accounts.targets import MissingCredentials, target_problem
from jobs.services.cloud import launch, offers
from jobs.services.core import costs
from jobs.services.core.events import event_append
from jobs.services.core.runner import runner_for
from jobs.services.runners.node import NODES
from jobs.services.scheduling import dispatch
from jobs.states import EndReason, JobCapacity, JobStatus, WaitCode
from providers import registry
from providers.base import CapacityType, Offer, offer_misfit
from providers.errors import ProviderError

log = logging.getLogger(__name__)
S = JobStatus
# Offers tried per attempt: each refusal costs provider calls (a Lambda launch, 12 s of budget).
MAX_CANDIDATES = 5
# Queued jobs looked at per beat pass, by priority then age.
PLACE_BATCH = 50
# Skip reasons listed in an event (the rest are counted).
MAX_LISTED = 12
# An attempt that ended so says nothing against its machine (the job or the user ended it; a
# spot machine taken back is no fault of the host, and avoiding it could strand the job).
_NOT_THE_MACHINE = (
    EndReason.SUCCEEDED,
    EndReason.CANCELLED,
    EndReason.PRICE_CAP_EXCEEDED,
    EndReason.PREEMPTED,
)


@dataclass(frozen=True)
class Skip:
    """Why an offer was left out. ``group`` is what the waiting reason counts offers by (alike
    for every offer skipped for the same cause); ``detail`` adds this offer's particulars."""

    group: str
    detail: str = ""

    def __str__(self) -> str:
        return self.group + self.detail


@dataclass
class Plan:
    """Offers to try, cheapest first, and why everything else was left out."""

    candidates: list[Offer] = field(default_factory=list)
    skipped: list[tuple[Offer, Skip]] = field(default_factory=list)
    unusable: list[str] = field(default_factory=list)  # targets that could not be asked
    capacity: str = JobCapacity.ON_DEMAND  # the job's: how candidates are priced and labelled

    def label(self, offer: Offer) -> str:
        return launch.offer_label(offer, costs.rental_terms(offer, self.capacity))

    def summary(self) -> str:
        lines = [f"{self.label(o)}: {why}" for o, why in self.skipped[:MAX_LISTED]]
        more = len(self.skipped) - MAX_LISTED
        if more > 0:
            lines.append(f"{more} more")
        return "; ".join(self.unusable + lines)


def job_place(*, job_pk: int) -> JobAttempt | None:
    """Place one queued job (see the module docstring); the attempt started, if any."""
    job = TrainingJob.objects.select_related("project").filter(pk=job_pk, status=S.QUEUED).first()
    if job is None:
        return None
    if job.target == registry.AUTO_TARGET:
        if _place_on_idle_node(job):
            return None
    else:
        target, runner = registry.get(job.target), runner_for(job.target)
        if target is None or runner is None:
            return None
        if not target.has_offers:  # launched as it is: the target chooses the machine
            return runner.start(job=job)
    plan = job_plan(job)
    if not plan.candidates:
        dispatch.note_waiting(job, WaitCode.NO_OFFER, _waiting_reason(job, plan))
        return None
    first = plan.candidates[0]
    event_append(
        job=job,
        type="log",
        message=f"Placement: {len(plan.candidates)} offer(s) to try, cheapest first: "
        f"{plan.label(first)}."
        + (f" Skipped: {plan.summary()}." if plan.skipped or plan.unusable else ""),
        data={
            "capacity": job.capacity,
            "candidates": [plan.label(o) for o in plan.candidates],
            "skipped": [
                {"offer": plan.label(o), "reason": str(why)} for o, why in plan.skipped[:MAX_LISTED]
            ],
            "unusable": plan.unusable,
        },
    )
    runner = runner_for(first.target)
    return runner.start(job=job, on=plan.candidates) if runner is not None else None


def jobs_place_waiting() -> int:
    """Beat: try again every queued job that waits for a cloud offer; returns how many."""
    priced = [t.name for t in registry.priced_targets()]
    waiting = TrainingJob.objects.filter(
        status=S.QUEUED, target__in=[registry.AUTO_TARGET, *priced]
    ).order_by("-priority", "id")
    count = 0
    for pk in list(waiting.values_list("pk", flat=True)[:PLACE_BATCH]):
        try:
            job_place(job_pk=pk)
        except Exception:  # one job's surprise must not starve the others of placement
            log.exception("placement of job %s failed", pk)
        count += 1
    return count


def job_plan(job: TrainingJob) -> Plan:
    """The offers that could take ``job`` now, cheapest first at the price the job would pay
    for each (its ``capacity``), and why others cannot."""
    plan = Plan(capacity=job.capacity)
    found: list[Offer] = []
    for target in _targets_of(job):
        problem = target_problem(project=job.project, target=target)
        if problem is not None:
            if job.target != registry.AUTO_TARGET:  # for auto: a cloud this project skips
                plan.unusable.append(problem[1])
            continue
        try:
            found += offers.target_offers(project=job.project, target=target, gpu=job.gpu)
        except MissingCredentials as exc:
            plan.unusable.append(f"{target.name}: {exc}")
        except ProviderError as exc:
            plan.unusable.append(f"{target.name} could not list offers: {exc.message}")
    refused = offers.refused_reasons(found)
    failed = _failed_machines(job)
    spend = Decimal(0)
    if job.project.max_spend_per_hour is not None:  # else no need to add up the live machines
        spend = costs.project_spend_per_hour(project_id=job.project_id)

    def price(offer: Offer) -> float:
        terms = costs.rental_terms(offer, job.capacity)
        return terms[1] if terms is not None else offer.price_per_hour

    for offer in sorted(found, key=lambda o: (price(o), o.target, o.offer_id)):
        why = _skip_reason(job, offer, refused, failed, spend)
        if why is not None:
            plan.skipped.append((offer, why))
        elif len(plan.candidates) < MAX_CANDIDATES:
            plan.candidates.append(offer)
    return plan


def _targets_of(job: TrainingJob) -> list[registry.Target]:
    if job.target == registry.AUTO_TARGET:
        return registry.priced_targets()
    target = registry.get(job.target)
    return [target] if target is not None else []


def _skip_reason(
    job: TrainingJob,
    offer: Offer,
    refused: dict[tuple[str, str], str],
    failed: dict[tuple[str, str], int],
    spend: Decimal,
) -> Skip | None:
    misfit = offer_misfit(job.gpu, offer)
    if misfit:
        return Skip("does not fit", f": {misfit}")
    if not offer.available:
        return Skip("no capacity now")
    terms = costs.rental_terms(offer, job.capacity)
    if terms is None:
        return Skip("not offered as spot")
    capacity, price = terms
    cap = job.max_price_per_hour
    if cap is not None and costs.money(price) > cap:
        at = " at its spot price" if capacity == CapacityType.SPOT else ""
        return Skip(f"over the job's max_price_per_hour of ${cap:.2f}/h{at}")
    over = costs.over_ceiling(ceiling=job.project.max_spend_per_hour, spend=spend, price=price)
    if over:
        return Skip(over)
    for key in ((offer.target, f"m:{offer.machine_id}"), (offer.target, f"o:{offer.offer_id}")):
        if key in failed:
            return Skip(f"its machine failed attempt {failed[key]} of this job")
    why = refused.get((offer.target, offer.offer_id))
    return Skip("refused lately", f" ({why})") if why else None


def _failed_machines(job: TrainingJob) -> dict[tuple[str, str], int]:
    """(target, machine or offer) → the number of the earlier attempt that failed on it."""
    failed: dict[tuple[str, str], int] = {}
    ended = job.attempts.filter(ended_at__isnull=False).exclude(end_reason__in=_NOT_THE_MACHINE)
    for attempt in ended.exclude(offer={}):
        target = str(attempt.offer.get("target", attempt.target))
        if attempt.offer.get("machine_id"):
            failed[(target, f"m:{attempt.offer['machine_id']}")] = attempt.number
        else:  # without a host id, only the very same offer is avoided
            failed[(target, f"o:{attempt.offer.get('offer_id')}")] = attempt.number
    return failed


def _place_on_idle_node(job: TrainingJob) -> bool:
    idle = GpuNode.objects.filter(status=GpuNode.Status.IDLE).order_by("name")
    fitting = [n for n in idle if gpu_needs.misfit(job.gpu, job.node_selector, n) is None]
    # As the dispatcher: a node with the job's model cached first, then by name.
    return NODES.start(job=job, on=gpu_needs.cached_first(fitting, job.model)) is not None


def _waiting_reason(job: TrainingJob, plan: Plan) -> str:
    """Why nothing takes the job, grouped so it changes only when the situation does."""
    groups = Counter(why.group for _, why in plan.skipped)
    parts = [*plan.unusable, *(f"{n} offer(s) {why}" for why, n in groups.most_common())]
    if not parts:
        parts = ["no offer lists a machine for these GPU needs"]
    kind = "spot offer" if job.capacity == JobCapacity.SPOT else "offer"
    head = (
        f"No idle GPU node fits and no cloud {kind}"
        if job.target == registry.AUTO_TARGET
        else f"No {kind}"
    )
    return f"{head} can take this job now: {'; '.join(parts)}."
