"""The GPU node's Celery app: ``celery -A gpu_worker.celery_app worker -c 1
--prefetch-multiplier 1 --without-heartbeat --without-gossip --without-mingle -n <name>@%h``
(Procfile ``gpu``); it consumes ``gpu.node.<name>`` (its default queue). No Django.

The broker is only a doorbell: the node connects as its own Redis user, which can read its own
queue and nothing else (jobs/broker_acl.py), and never publishes. So everything a node sends
goes over HTTPS with its token (gpu_worker.agent.node_api), and the worker runs without remote
control, events, gossip or mingle (all of which publish to shared channels).

- ``run_attempt`` (queue ``gpu.node.<name>``, message ``{"job_id", "attempt"}``) is the thin
  supervisor (gpu_worker.agent.supervisor). ``acks_late`` + ``reject_on_worker_lost``; a message lost
  with its worker is sent again by the control plane until the attempt is claimed, so kombu's
  ack emulation (a hash shared by every queue) is off.
- On start the worker registers (capabilities, labels) and then heartbeats from a thread of
  the main process; on a clean stop it says so, so it goes offline at once. The base models
  cached on the node (gpu_worker.agent.model_cache) go with each registration and with the first
  heartbeat after they changed (an attempt that downloaded its model, say). An ephemeral node
  stops itself (SIGTERM to the worker: a warm shutdown) after its one job.
- The pool process starts the first attempt's executor ahead, its imports done
  (gpu_worker.warm); the supervisor starts the next one after each attempt.
- With the serving role (``TRAINHUB_NODE_SERVE_MODEL``), the main process also runs an
  inference server and its adapter loader (gpu_worker.agent.serving); the server goes with the
  next heartbeat once it is up, and again whenever it restarts.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from typing import Any

from celery import Celery
from celery.signals import worker_process_init, worker_ready, worker_shutting_down

from gpu_worker.agent import node as node_settings
from gpu_worker.agent import supervisor
from gpu_worker.agent.model_cache import ModelCache
from gpu_worker.agent.node_api import NodeApi
from gpu_worker.agent.serving import ServingRole
from trainhub_contract import celery_conf as cc

log = logging.getLogger(__name__)

NODE = node_settings.config()
app = Celery("trainhub-gpu-node")
_config = cc.base_config(NODE.broker_url)
app.conf.update(_config)
app.conf.update(
    # CELERY_BROKER_URL in the environment would override broker_url (without the node's
    # credentials): the read and write URLs take precedence over both.
    broker_read_url=NODE.broker_url,
    broker_write_url=NODE.broker_url,
    task_default_queue=NODE.queue,
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_concurrency=1,
    worker_enable_remote_control=False,
    worker_send_task_events=False,
    broker_transport_options={
        **_config["broker_transport_options"],  # type: ignore[dict-item]
        "ack_emulation": False,
    },
)
_stop = threading.Event()
_wake = threading.Event()  # a heartbeat now: the serving role has news
SERVING = ServingRole(NODE.serve, on_change=_wake.set) if NODE.serve is not None else None


@app.task(name=cc.RUN_ATTEMPT, bind=True, ignore_result=True)
def run_attempt(self: Any, message: dict[str, Any]) -> str:
    outcome = supervisor.run(message, NODE)
    if NODE.ephemeral and outcome != "refused":
        log.info("ephemeral node: shutting down after one job")
        os.kill(os.getppid(), signal.SIGTERM)  # the worker's main process: a warm shutdown
    return outcome


# Registration is repeated now and then: a registration lost to a broker restart must not
# leave the control plane without the node's capabilities.
REREGISTER_EVERY = 10


def _model_cache() -> ModelCache | None:
    if NODE.hub_cache is None:
        return None
    return ModelCache(NODE.hub_cache, NODE.model_dirs, NODE.model_scan_seconds)


def _heartbeats(hostname: str) -> None:
    process = f"{socket.gethostname()}:{os.getpid()}:{time.time():.0f}"
    api = NodeApi(NODE)
    cache = _model_cache()
    beats = 0
    while True:
        report = None
        if beats % REREGISTER_EVERY == 0:
            report = node_settings.registration(NODE, hostname, process)
        models = cache.to_send(registering=report is not None) if cache is not None else None
        server = SERVING.to_send(registering=report is not None) if SERVING is not None else None
        try:
            api.heartbeat(registration=report, models=models, server=server)
            beats += 1
            if cache is not None:
                cache.delivered(models)
            if SERVING is not None:
                SERVING.delivered(server)
        except Exception as exc:  # the control plane may be restarting: the next beat tries
            log.warning("heartbeat failed: %s", exc)
            beats = 0  # register again once it answers
        _wake.wait(NODE.heartbeat_seconds)
        _wake.clear()
        if _stop.is_set():
            return


@worker_ready.connect
def _start_heartbeats(sender: Any = None, **_: object) -> None:
    hostname = getattr(sender, "hostname", "") or ""
    threading.Thread(
        target=_heartbeats, args=(hostname,), name="node-heartbeat", daemon=True
    ).start()
    if SERVING is not None:
        SERVING.start()
    log.info("node %s ready on queue %s", NODE.name, NODE.queue)


@worker_process_init.connect
def _warm_up(**_: object) -> None:
    """In the pool process that will run attempts: start the first attempt's executor ahead."""
    supervisor.prepare_warm(NODE)


@worker_shutting_down.connect
def _say_goodbye(**_: object) -> None:
    _stop.set()
    _wake.set()
    if SERVING is not None:
        SERVING.stop()  # the engine stops with the agent; the goodbye takes its server along
    try:
        NodeApi(NODE).heartbeat(stopping=True)
    except Exception as exc:
        log.warning("could not say goodbye (the heartbeat timeout will): %s", exc)
