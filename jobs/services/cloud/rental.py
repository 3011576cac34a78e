"""What launch and polling ask of the place a machine is rented for. The runners of the two
rented places (jobs.services.runners: a serverless queue, an SSH-driven machine) implement
:class:`Rental`; launch and polling find it through the runner port (core.runner), so they
never ask which kind of place a target is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from jobs.models import JobAttempt
from jobs.services.core.runner import runner_for
from providers import registry
from providers.base import RemoteState


@dataclass(frozen=True)
class ExecutorStart:
    """How the executor gets its spec, as the launch request carries it: the spec itself (a
    provider that runs it as given), or the attempt's SSH key (the spec goes over SSH once
    the machine is up)."""

    spec: dict[str, Any]
    ssh_public_key: str = ""


@runtime_checkable
class Rental(Protocol):
    """A rented place, as launch and polling see it."""

    def executor_start(self, attempt: JobAttempt) -> ExecutorStart:
        """What the attempt's launch request carries for its executor."""

    def relaunches_unanswered(self) -> bool:
        """Whether a launch the provider may have applied without answering can simply be sent
        again: its machine is found by name. Otherwise the attempt's output is looked for
        first, rather than pay for two runs."""

    def alive(self, attempt: JobAttempt, state: RemoteState, *, pause: bool) -> None:
        """A poll shows the attempt's machine alive; ``pause``: the job is paused and the
        executor saves its checkpoint in place (core.stopping.pauses_in_place)."""


def rental_for(name: str) -> tuple[registry.Target, Rental] | None:
    """The cloud target called ``name`` and its place's rental; None for any other name."""
    target = registry.cloud(name)
    runner = runner_for(name)
    if target is None or not isinstance(runner, Rental):
        return None
    return target, runner
