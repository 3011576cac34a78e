"""Where an attempt runs, as one port: :class:`Runner`, with one implementation per kind of
place (jobs.services.runners: the operator's GPU nodes, a serverless provider queue, a rented
machine driven over SSH), registered here when the jobs app is ready.

"Where does it run?" is asked here alone (:func:`runner_for`); the rest of the control plane
calls the runner's verbs. Whatever a runner sees of a run (a node's reports, events read over
SSH, a provider's states) it hands on as :class:`Report`s to one function,
``core.attempts.attempt_report``, which acts on them by ``jobs.states.REPORT_ACTIONS``.

The port lives in core, below the runners, so that core (an attempt's end, a stop) can call a
runner without importing one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from jobs.models import GpuNode, JobAttempt, TrainingJob
from jobs.states import EndReason
from providers import registry
from providers.base import Offer
from trainhub_contract.outcomes import Outcome

_OUTCOMES = frozenset(o.value for o in Outcome)


@dataclass(frozen=True)
class Report:
    """What the control plane learned about a live attempt's run."""

    outcome: Outcome
    code: str = ""  # a failed run's reason (an EndReason value; anything else: internal_error)
    message: str = ""
    sha256: str = ""  # a finished run's bundle, as the executor hashed it

    @classmethod
    def of_event(cls, event_type: str, data: dict[str, Any], message: str) -> Report | None:
        """The report a stored executor event makes: a ``status`` event with an outcome, or an
        ``error``; None for any other (remote input: unknown values are no report)."""
        if event_type == "error":
            status: object = Outcome.FAILED.value
        elif event_type == "status":
            status = data.get("status")
        else:
            return None
        if not isinstance(status, str) or status not in _OUTCOMES:
            return None
        code = data.get("code", EndReason.INTERNAL_ERROR.value)
        return cls(
            Outcome(status), code=str(code), message=message, sha256=str(data.get("sha256", ""))
        )

    @property
    def end_reason(self) -> EndReason:
        """Why the attempt ends on this report (a failure's code, else the stop)."""
        if self.outcome is Outcome.CANCELLED:
            return EndReason.CANCELLED
        try:
            return EndReason(self.code or EndReason.INTERNAL_ERROR)
        except ValueError:
            return EndReason.INTERNAL_ERROR


def finished(message: str = "") -> tuple[Report, Report]:
    """A run seen only once it had finished (it ran between two looks): started, then done."""
    return Report(Outcome.RUNNING), Report(Outcome.SUCCEEDED, message=message)


class Runner(Protocol):
    """One kind of place an attempt runs in, with the same verbs for every kind."""

    def queued(self, *, job_pk: int) -> None:
        """A job bound for this place was queued: wake what starts attempts here (on commit)."""

    def start(
        self, *, job: TrainingJob, on: Sequence[GpuNode] | Sequence[Offer] = ()
    ) -> JobAttempt | None:
        """Begin the queued job's next attempt here, on the first of ``on`` that takes it (idle
        nodes, or priced offers; none: wherever the target chooses). The attempt started, or
        None when nothing took it (the job stays queued) or the job moved on meanwhile."""

    def observe(self, *, target: str) -> int:
        """Look at this place's live attempts on ``target`` (the beat's: a provider's poll, the
        resend of attempts no node claimed) and report what changed; returns how many."""

    def stop(self, *, attempt: JobAttempt, pause: bool) -> None:
        """Ask what runs the live attempt to stop (after commit); ``pause``: save a checkpoint
        first where the place can. The attempt ends once the stop is confirmed."""

    def release(self, *, attempt: JobAttempt) -> None:
        """The attempt just ended (inside its end's transaction): free what it held here (its
        node; or settle its cost and stop its machine)."""


_RUNNERS: dict[registry.TargetKind, Runner] = {}


def runner_register(*, kind: registry.TargetKind, runner: Runner) -> None:
    """Make ``runner`` the one for every target of ``kind`` (jobs.apps, once ready)."""
    _RUNNERS[kind] = runner


def runner_for(target: str) -> Runner | None:
    """The runner of the place ``target`` names; None for ``auto`` (placement picks a place)
    and for an unknown name."""
    entry = registry.get(target)
    return _RUNNERS.get(entry.kind) if entry is not None else None


def target_observe(*, target: str) -> int:
    """Look at the live attempts on ``target`` (its place's runner); returns how many."""
    runner = runner_for(target)
    return runner.observe(target=target) if runner is not None else 0
