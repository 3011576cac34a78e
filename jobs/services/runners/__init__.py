"""One runner per kind of place an attempt runs in (the port: core.runner.Runner):

- ``node``: the operator's own GPU nodes (a Celery queue per node; the node reports over HTTPS).
- ``serverless``: a provider's serverless queue (the provider runs the spec; we poll).
- ``machine``: a rented machine driven over SSH (we launch, poll, start the executor over SSH
  and read its events).

``rented`` holds what the last two share. :func:`runners_install` registers them with the port
once the jobs app is ready (jobs.apps).
"""

from __future__ import annotations

from jobs.services.core.runner import runner_register
from jobs.services.runners.machine import MachineRunner
from jobs.services.runners.node import NODES
from jobs.services.runners.serverless import ServerlessRunner
from providers.registry import TargetKind


def runners_install() -> None:
    runner_register(kind=TargetKind.OWN_FLEET, runner=NODES)
    runner_register(kind=TargetKind.SERVERLESS, runner=ServerlessRunner())
    runner_register(kind=TargetKind.SSH_MACHINE, runner=MachineRunner())
