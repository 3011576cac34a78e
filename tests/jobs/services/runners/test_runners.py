"""One way an attempt runs: the runner chosen by the target's kind of place (core.runner), the
one table that says what a report does (jobs.states.REPORT_ACTIONS), and the reports a
provider's states and an executor's events make."""

from __future__ import annotations

import pytest

from jobs.services.cloud.polling import provider_reports
from jobs.services.cloud.rental import Rental
from jobs.services.core.runner import Report, Runner, runner_for
from jobs.services.runners.machine import MachineRunner
from jobs.services.runners.node import NodeRunner
from jobs.services.runners.serverless import ServerlessRunner
from jobs.states import REPORT_ACTIONS, EndReason, JobStatus, ReportAction
from providers.base import RemoteState, RemoteStatus
from trainhub_contract.outcomes import Outcome

S, A = JobStatus, ReportAction


@pytest.mark.parametrize(
    ("target", "kind"),
    [
        ("local", NodeRunner),
        ("runpod-serverless", ServerlessRunner),
        ("runpod-pod", MachineRunner),
        ("lambda", MachineRunner),
        ("vastai", MachineRunner),
        ("aws", MachineRunner),
    ],
)
def test_each_target_has_the_runner_of_its_kind_of_place(target: str, kind: type) -> None:
    assert isinstance(runner_for(target), kind)


def test_auto_and_unknown_targets_have_no_runner() -> None:
    assert runner_for("auto") is None, "placement picks the place first"
    assert runner_for("nowhere") is None


def test_every_runner_has_the_port_verbs_and_only_rented_ones_the_rental() -> None:
    runners: list[Runner] = [NodeRunner(), ServerlessRunner(), MachineRunner()]
    for runner in runners:
        for verb in ("queued", "start", "observe", "stop", "release"):
            assert callable(getattr(runner, verb))
    assert [isinstance(r, Rental) for r in runners] == [False, True, True]


def test_the_report_table_covers_every_outcome_in_every_status() -> None:
    assert set(REPORT_ACTIONS) == {(o, s) for o in Outcome for s in S}


@pytest.mark.parametrize(
    ("outcome", "status", "action"),
    [
        (Outcome.RUNNING, S.PROVISIONING, A.START),
        (Outcome.RUNNING, S.RUNNING, A.IGNORE),  # a repeat
        (Outcome.RUNNING, S.CANCELLING, A.IGNORE),  # a late report does not undo the cancel
        (Outcome.SUCCEEDED, S.RUNNING, A.FINALIZE),
        (Outcome.SUCCEEDED, S.PAUSED, A.FINALIZE),  # finished before the pause reached it
        (Outcome.SUCCEEDED, S.PROVISIONING, A.IGNORE),  # a provider's finish starts it first
        (Outcome.SUCCEEDED, S.FINALIZING, A.IGNORE),
        (Outcome.FAILED, S.RUNNING, A.END),
        (Outcome.FAILED, S.PAUSED, A.END),
        (Outcome.CANCELLED, S.CANCELLING, A.END),
    ],
)
def test_what_a_report_does(outcome: Outcome, status: JobStatus, action: ReportAction) -> None:
    assert REPORT_ACTIONS[outcome, status] is action


@pytest.mark.parametrize(
    ("state", "reports"),
    [
        (
            RemoteState(RemoteStatus.SUCCEEDED, message="done"),
            (Report(Outcome.RUNNING), Report(Outcome.SUCCEEDED, message="done")),
        ),
        (
            RemoteState(RemoteStatus.FAILED, message="oom", error_code="oom"),
            (Report(Outcome.FAILED, code="oom", message="oom"),),
        ),
        (
            RemoteState(RemoteStatus.CANCELLED, message="stopped"),
            (Report(Outcome.CANCELLED, message="stopped"),),
        ),
        (
            RemoteState(RemoteStatus.LOST, message="gone"),
            (Report(Outcome.FAILED, code="worker_lost", message="gone"),),
        ),
    ],
)
def test_a_providers_final_state_as_reports(state: RemoteState, reports: tuple) -> None:
    assert provider_reports(state) == reports


def test_an_executor_event_as_a_report() -> None:
    failed = Report.of_event("status", {"status": "failed", "code": "oom"}, "out of memory")
    assert failed == Report(Outcome.FAILED, code="oom", message="out of memory")
    assert failed.end_reason is EndReason.OOM
    assert Report.of_event("error", {}, "boom") == Report(
        Outcome.FAILED, code="internal_error", message="boom"
    )
    done = Report.of_event("status", {"status": "succeeded", "sha256": "ab"}, "")
    assert done is not None and done.sha256 == "ab"
    assert Report.of_event("status", {"status": "exploded"}, "") is None, "remote input"
    assert Report.of_event("metrics", {"status": "failed"}, "") is None
    odd = Report.of_event("status", {"status": "failed", "code": 7}, "")
    assert odd is not None and odd.end_reason is EndReason.INTERNAL_ERROR
    assert Report(Outcome.CANCELLED).end_reason is EndReason.CANCELLED
