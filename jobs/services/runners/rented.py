"""What the two rented places share: a machine rented from a provider for each attempt.

Placement hands the offers over; the launch, the polls and the stop are the cloud services'
(cloud.launch, cloud.polling, core.stopping), which ask the place's own runner only what
differs (cloud.rental: serverless.py, machine.py).
"""

from __future__ import annotations

from collections.abc import Sequence

from jobs.models import GpuNode, JobAttempt, TrainingJob
from jobs.services.cloud import launch, polling
from jobs.services.core import costs
from jobs.services.outbox import messages
from providers.base import Offer


class RentedRunner:
    """Attempts on rented machines (core.runner.Runner); subclasses add cloud.rental."""

    def queued(self, *, job_pk: int) -> None:
        messages.send_place_job(job_pk)  # placement picks the offer (or launches as it is)

    def start(
        self, *, job: TrainingJob, on: Sequence[GpuNode] | Sequence[Offer] = ()
    ) -> JobAttempt | None:
        offers = [o for o in on if isinstance(o, Offer)]
        return launch.attempt_launch(job=job, candidates=offers)

    def observe(self, *, target: str) -> int:
        return polling.attempts_poll_target(target=target)

    def stop(self, *, attempt: JobAttempt, pause: bool) -> None:
        # core.stopping asks the provider, unless the machine pauses in place.
        messages.send_stop_machines(attempt.job_id)

    def release(self, *, attempt: JobAttempt) -> None:
        costs.attempt_settle_cost(attempt_pk=attempt.pk)
        if attempt.provider_instance_id:  # however it ended, its machine must stop billing
            messages.send_stop_machines(attempt.job_id)
