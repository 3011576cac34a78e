"""The GPU node's Celery app: ``celery -A gpu_worker.celery_app worker -c 1
--prefetch-multiplier 1 -n <name>@%h`` (Procfile ``gpu``); it consumes ``gpu.node.<name>``
(its default queue). No Django: a node holds the broker URL and its own token, nothing else
(settings: gpu_worker.node).

- ``run_attempt`` (queue ``gpu.node.<name>``) is the thin supervisor (gpu_worker.supervisor).
  ``acks_late`` + ``reject_on_worker_lost``: a message whose worker died is not lost, and its
  redelivery is harmless because the attempt can be claimed once only.
- On start the worker registers (capabilities, labels) and then heartbeats from a thread of
  the main process; on a clean stop it says so, so it goes offline at once.
- The remote-control command ``trainhub_cancel_attempt`` (handled by the main process while
  the task runs in the pool's child) writes the attempt's cancel file.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from typing import Any

from celery import Celery
from celery.signals import worker_ready, worker_shutting_down
from celery.worker.control import control_command

from gpu_worker import celery_conf as cc
from gpu_worker import node as node_settings
from gpu_worker import supervisor

log = logging.getLogger(__name__)

NODE = node_settings.config()
app = Celery("trainhub-gpu-node")
app.conf.update(cc.base_config(NODE.broker_url))
app.conf.update(
    task_default_queue=NODE.queue,
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_concurrency=1,
)
_stop = threading.Event()


@app.task(name=cc.RUN_ATTEMPT, bind=True, ignore_result=True)
def run_attempt(self: Any, message: dict[str, Any]) -> str:
    outcome = supervisor.run(message, NODE)
    if NODE.ephemeral and outcome != "refused":
        log.info("ephemeral node: shutting down after one job")
        self.app.control.shutdown(destination=[self.request.hostname])
    return outcome


@control_command(
    name=cc.CANCEL_ATTEMPT_COMMAND,
    args=[("job_id", str), ("attempt", int)],
    signature="<job_id> <attempt>",
)
def cancel_attempt(state: Any, job_id: str, attempt: int) -> dict[str, str]:
    path = NODE.cancel_file(job_id, int(attempt))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()
    log.warning("cancel requested for %s attempt %s", job_id, attempt)
    return {"ok": "cancel requested"}


def _send(name: str, *args: object) -> None:
    try:
        app.send_task(name, args=list(args), queue=cc.DEFAULT_QUEUE, retry=False)
    except Exception as exc:  # the broker may be restarting: the next beat tries again
        log.warning("could not send %s: %s", name, exc)


# Registration is repeated now and then: a registration lost to a broker restart must not
# leave the control plane without the node's capabilities.
REREGISTER_EVERY = 10


def _heartbeats(hostname: str) -> None:
    process = f"{socket.gethostname()}:{os.getpid()}:{time.time():.0f}"
    beats = 0
    while True:
        if beats % REREGISTER_EVERY == 0:
            report = node_settings.registration(NODE, hostname, process)
            _send(cc.NODE_REGISTER, NODE.name, NODE.token, report)
        else:
            _send(cc.NODE_HEARTBEAT, NODE.name, NODE.token)
        beats += 1
        if _stop.wait(NODE.heartbeat_seconds):
            return


@worker_ready.connect
def _start_heartbeats(sender: Any = None, **_: object) -> None:
    hostname = getattr(sender, "hostname", "") or ""
    threading.Thread(
        target=_heartbeats, args=(hostname,), name="node-heartbeat", daemon=True
    ).start()
    log.info("node %s ready on queue %s", NODE.name, NODE.queue)


@worker_shutting_down.connect
def _say_goodbye(**_: object) -> None:
    _stop.set()
    _send(cc.NODE_STOPPING, NODE.name, NODE.token)
