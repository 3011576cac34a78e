"""A rented machine driven over SSH (RunPod pods, Lambda, Vast.ai, AWS): launched with the
attempt's own SSH key; once it accepts SSH the control plane starts the executor there and
reads its events on every poll (cloud.remote), and a pause is written into its cancel file so
it saves a checkpoint before the machine is terminated."""

from __future__ import annotations

from jobs.models import JobAttempt
from jobs.services.cloud import remote
from jobs.services.cloud.rental import ExecutorStart
from jobs.services.runners.rented import RentedRunner
from providers.base import RemoteState


class MachineRunner(RentedRunner):
    """Attempts on rented machines whose executor the control plane starts over SSH."""

    def executor_start(self, attempt: JobAttempt) -> ExecutorStart:
        if not attempt.ssh_private_key_ciphertext:
            remote.attempt_new_ssh_key(attempt=attempt)
        # The spec goes over SSH once the machine is up (signed URLs issued then).
        return ExecutorStart(spec={}, ssh_public_key=remote.attempt_public_key(attempt))

    def relaunches_unanswered(self) -> bool:
        return True  # a launch sent again finds the machine by its name

    def alive(self, attempt: JobAttempt, state: RemoteState, *, pause: bool) -> None:
        remote.attempt_drive(attempt=attempt, state=state, pause=pause)
