"""The GPU node's own HTTP clients against the real endpoints, over real HTTP (live_server): the
node's NodeApi (claim, heartbeat with registration, running and goodbye) and the executor's
HttpSink behind a Reporter, with the tokens the control plane issued. The fake control plane in
tests/gpu_worker checks the node's side alone; this checks that both sides agree."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from gpu_worker.agent import node as node_settings
from gpu_worker.agent.model_cache import ModelCache
from gpu_worker.agent.node_api import NodeApi, events_url
from gpu_worker.report import Reporter
from gpu_worker.sinks import HttpSink
from jobs.broker_acl import broker_user_delete
from jobs.models import GpuNode, JobAttempt, JobEvent, TrainingJob
from jobs.services.core.jobs import job_cancel
from jobs.services.fleet import nodes
from jobs.services.scheduling import dispatch
from jobs.states import JobStatus
from tests.gpu_worker._hub_cache import SINGLE, hub_repo, local_model
from trainhub_contract.outcomes import Outcome, StopMode
from trainhub_contract.spec import parse_job_spec

# Real HTTP: the live server's thread reads what the test committed.
pytestmark = pytest.mark.django_db(transaction=True)
S = JobStatus
# Broker users are server-wide (jobs/broker_acl.py): names of this process's own.
NODE = f"client-{os.getpid()}"
OTHER = f"client-{os.getpid()}-b"


@pytest.fixture(autouse=True)
def _records_sends(sent) -> Iterator[None]:
    yield
    for name in (NODE, OTHER):
        broker_user_delete(name)


def _config(live_server, tmp_path: Path, name: str, token: str) -> node_settings.NodeConfig:
    return node_settings.config_from(
        {
            "TRAINHUB_NODE_NAME": name,
            "TRAINHUB_NODE_TOKEN": token,
            "TRAINHUB_CONTROL_URL": live_server.url + "/",
            "CELERY_BROKER_URL": "redis://127.0.0.1:6379/0",  # never used here
            "TRAINHUB_NODE_WORKDIR": str(tmp_path),
            "TRAINHUB_NODE_GPUS": "NVIDIA H100 80GB HBM3:81559",
        }
    )


@pytest.fixture
def node_api(live_server, tmp_path: Path) -> Iterator[NodeApi]:
    """NODE, created and registered over HTTP by its own client."""
    _, token = nodes.node_create(name=NODE, actor="ops")
    api = NodeApi(_config(live_server, tmp_path, NODE, token))
    registration = node_settings.registration(api.node, f"node@{NODE}", "host:1:1")
    assert api.heartbeat(registration=registration) == {}
    yield api
    api.close()


def test_the_registration_report_is_stored_as_the_node_sent_it(node_api) -> None:
    node = GpuNode.objects.get(name=NODE)
    assert node.status == GpuNode.Status.IDLE
    assert node.capabilities["gpus"] == [{"name": "NVIDIA H100 80GB HBM3", "vram_mb": 81559}]
    assert node.celery_hostname == f"node@{NODE}"

    assert node_api.heartbeat(stopping=True) == {}
    assert GpuNode.objects.get(name=NODE).status == GpuNode.Status.OFFLINE


def test_the_nodes_model_scan_is_sent_and_stored_over_real_http(
    live_server, tmp_path: Path, node_api
) -> None:
    """What the node's scan finds (a fake hub cache, a local model folder) is what the control
    plane stores: both sides agree on the list's shape and bounds."""
    hub_repo(tmp_path / "hub", "acme/tiny-llama", SINGLE)
    hub_repo(tmp_path / "hub", "acme/partial", SINGLE, incomplete=True)
    local = local_model(tmp_path / "models" / "llama")
    cache = ModelCache(tmp_path / "hub", (tmp_path / "models",))

    models = cache.to_send(registering=True)
    assert node_api.heartbeat(models=models) == {}
    cache.delivered(models)

    node = GpuNode.objects.get(name=NODE)
    assert node.cached_models == [str(local), "acme/tiny-llama"]
    assert node.models_reported_at is not None
    assert cache.to_send(registering=False) is None  # unchanged: not sent again


def test_a_node_with_a_wrong_token_is_refused(live_server, tmp_path: Path, node_api) -> None:
    impostor = NodeApi(_config(live_server, tmp_path, NODE, "thn-guess"))
    with pytest.raises(requests.HTTPError, match="401"):
        impostor.heartbeat(stopping=True)
    assert GpuNode.objects.get(name=NODE).status == GpuNode.Status.IDLE


def test_claim_report_cancel_and_stop_over_real_http(node_api, make_job) -> None:
    job = make_job()
    assert dispatch.dispatch_queued() == 1

    claim = node_api.claim(job.public_id, 1, sleep=lambda _: None)

    assert claim is not None
    spec = parse_job_spec(claim.spec)
    assert (spec.job_id, spec.attempt) == (job.public_id, 1)
    assert node_api.claim(job.public_id, 1, sleep=lambda _: None) is None, "once only"
    assert node_api.heartbeat(running=(job.public_id, 1)) == {}

    # The executor: a Reporter sending to the events URL with the report token.
    url = events_url(node_api.node.control_url, NODE, job.public_id, 1)
    reporter = Reporter(
        job_id=job.public_id, attempt=1, sinks=[HttpSink(url, claim.report_token)],
        metrics_interval=0, close_timeout=10,
    )  # fmt: skip
    with reporter:
        reporter.status(Outcome.RUNNING, "Training started.")
        reporter.metrics(step=1, total_steps=4, loss=2.25)
        reporter.log("step 1/4")
    job.refresh_from_db()
    assert job.status == S.RUNNING
    assert job.latest_metrics == {"step": 1, "total_steps": 4, "loss": 2.25}
    stored = list(JobEvent.objects.filter(job=job, attempt=1).values_list("seq", flat=True))
    assert sorted(stored) == [0, 1, 2]

    # A batch sent again (its answer was lost) is stored once.
    again = [{"seq": 1, "type": "metrics", "data": {"step": 1}}, {"seq": 3, "type": "log"}]
    HttpSink(url, claim.report_token).send(job.public_id, 1, again)
    assert JobEvent.objects.filter(job=job, attempt=1).count() == 4

    job_cancel(job=job)
    assert node_api.heartbeat(running=(job.public_id, 1)) == {(job.public_id, 1): StopMode.CANCEL}
    cancelled = {"seq": 4, "type": "status", "data": {"status": "cancelled"}}
    HttpSink(url, claim.report_token).send(job.public_id, 1, [cancelled])
    assert TrainingJob.objects.get(pk=job.pk).status == S.CANCELLED
    assert node_api.heartbeat() == {}
    assert node_api.heartbeat(running=(job.public_id, 1)) == {
        (job.public_id, 1): StopMode.CANCEL
    }, "an attempt that ended is not to run on"


def test_a_report_token_does_not_reach_another_attempt(
    live_server, tmp_path: Path, node_api, make_job
) -> None:
    _, other_token = nodes.node_create(name=OTHER)
    other_api = NodeApi(_config(live_server, tmp_path, OTHER, other_token))
    other_api.heartbeat(registration=node_settings.registration(other_api.node, "b", "b:1:1"))
    mine, theirs = make_job(), make_job()
    assert dispatch.dispatch_queued() == 2
    by_node = dict(JobAttempt.objects.values_list("node_name", "job__public_id"))
    claim = node_api.claim(by_node[NODE], 1)
    assert claim is not None and other_api.claim(by_node[OTHER], 1) is not None
    assert {mine.public_id, theirs.public_id} == set(by_node.values())
    before = JobEvent.objects.count()

    for url in (
        events_url(node_api.node.control_url, OTHER, by_node[OTHER], 1),  # another node's
        events_url(node_api.node.control_url, NODE, by_node[OTHER], 1),  # named as this one's
        events_url(node_api.node.control_url, NODE, by_node[NODE], 7),  # an outdated number
    ):
        sink = HttpSink(url, claim.report_token)
        with pytest.raises(requests.HTTPError, match="403"):
            sink.send("ignored", 1, [{"seq": 0, "type": "status", "data": {"status": "failed"}}])

    assert JobEvent.objects.count() == before
    assert set(TrainingJob.objects.values_list("status", flat=True)) == {S.PROVISIONING}
    other_api.close()
