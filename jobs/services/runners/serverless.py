"""A serverless provider queue (RunPod serverless): the provider runs the spec given at launch,
and its polls show how the run goes; its handler cannot be signalled, so a pause stops it like
a cancel (the next attempt resumes from the latest periodic checkpoint)."""

from __future__ import annotations

from jobs.models import JobAttempt
from jobs.services.cloud.rental import ExecutorStart
from jobs.services.core.attempts import attempt_report
from jobs.services.core.runner import Report
from jobs.services.core.specs import attempt_spec
from jobs.services.runners.rented import RentedRunner
from providers.base import RemoteState, RemoteStatus
from trainhub_contract.outcomes import Outcome


class ServerlessRunner(RentedRunner):
    """Attempts run by a provider's serverless workers."""

    def executor_start(self, attempt: JobAttempt) -> ExecutorStart:
        return ExecutorStart(spec=attempt_spec(attempt, sinks=[], public=True))

    def relaunches_unanswered(self) -> bool:
        return False  # the provider cannot be asked for a run by name

    def alive(self, attempt: JobAttempt, state: RemoteState, *, pause: bool) -> None:
        if state.status == RemoteStatus.RUNNING:  # a worker took the run: training starts
            attempt_report(attempt=attempt, report=Report(Outcome.RUNNING, message=state.message))
