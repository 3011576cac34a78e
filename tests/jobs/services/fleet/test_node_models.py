"""Model cache awareness on the control plane: a node's ``models`` report (validated as the
untrusted input it is, stored with when it came), placement that prefers an idle fitting node
with the job's model cached (ties, and everything else, as before: a job never waits for a
cached node while another fitting node is idle), the waiting reason and the dispatch event that
say so (node names for operators only), and what operators see (nodes API, admin, CLI)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from hypothesis import given, settings
from hypothesis import strategies as st
from rest_framework.test import APIClient

from api.presenters import tenant_waiting_reason
from gpu_worker.agent.model_cache import MAX_MODELS, MAX_NAME, reportable
from jobs.errors import InvalidRequest
from jobs.models import GpuNode, JobEvent, NodeEvent, TrainingJob
from jobs.services.fleet import nodes
from jobs.services.scheduling import placement
from jobs.states import JobStatus
from tests.support.api import assert_error
from tests.support.db import fresh
from tests.support.fleet import H100, T4, attempt_of, online_node

pytestmark = pytest.mark.django_db
S = JobStatus
N = GpuNode.Status
MODEL = "acme/tiny-llama"  # make_job's model
NODES = "/api/v1/nodes/"


def cached(node: GpuNode, *models: str) -> GpuNode:
    """The node reports ``models`` cached (as its heartbeat would)."""
    nodes.node_heartbeat(node=node, models=nodes.parse_cached_models(list(models)))
    node.refresh_from_db()
    return node


def _beat(name: str, token: str, body: Any) -> Any:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client.post(f"{NODES}{name}/heartbeat/", body, format="json")


def _stored(name: str) -> tuple:
    return GpuNode.objects.values_list(
        "cached_models", "models_reported_at", "last_heartbeat_at", "registered_at"
    ).get(name=name)


def _cache_events(job: TrainingJob) -> list[JobEvent]:
    return list(JobEvent.objects.filter(job=job, data__has_key="model_cached"))


# --- the report: validation and storage ------------------------------------------------------


def test_a_valid_list_is_kept_sorted_without_repeats() -> None:
    assert nodes.parse_cached_models(None) is None
    assert nodes.parse_cached_models([]) == []
    assert nodes.parse_cached_models(["b/m", "/models/x", "b/m", "a/m"]) == [
        "/models/x",
        "a/m",
        "b/m",
    ]


@pytest.mark.parametrize(
    ("value", "param"),
    [
        ("acme/x", "models"),
        ({"acme/x": True}, "models"),
        (["acme/x"] * (MAX_MODELS + 1), "models"),
        (["acme/x", 7], "models[1]"),
        (["acme/x", None], "models[1]"),
        ([["acme/x"]], "models[0]"),
        (["acme/x", {"name": "a/b"}], "models[1]"),
        ([""], "models[0]"),
        (["a/b/c"], "models[0]"),
        (["../etc/passwd"], "models[0]"),
        (["/models/../etc"], "models[0]"),
        ([" acme/x"], "models[0]"),
        (["/models/with space"], "models[0]"),
        (["/m/" + "x" * MAX_NAME], "models[0]"),
        (["acme/x\n"], "models[0]"),
    ],
)
def test_garbage_is_refused_naming_the_item(value: Any, param: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        nodes.parse_cached_models(value)
    assert refused.value.param == param


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(max_size=40) | st.from_regex(r"\A/[a-z/._-]{0,40}\Z"), max_size=20))
def test_whatever_a_node_reports_is_accepted(names: list[str]) -> None:
    """The node filters with the control plane's own rules: its report is never refused (a
    refused heartbeat would take the node offline)."""
    report = reportable(names)
    assert nodes.parse_cached_models(report) == report


def test_a_heartbeat_stores_the_list_and_when_it_came() -> None:
    _, token = online_node("gpu-a")
    assert _stored("gpu-a")[:2] == ([], None)

    answer = _beat("gpu-a", token, {"models": ["acme/b", "/models/llama", "acme/b"]})

    assert answer.status_code == 200, answer.content
    models, at, beat, _ = _stored("gpu-a")
    assert models == ["/models/llama", "acme/b"]
    assert at is not None and abs(at - beat) < timedelta(seconds=1)
    # a heartbeat without models leaves the list as it was
    assert _beat("gpu-a", token, {}).status_code == 200
    assert _stored("gpu-a")[:2] == (models, at)
    # and a registration may carry it too
    registration = {"capabilities": {"gpus": [H100]}, "process": "p2"}
    assert _beat("gpu-a", token, {"registration": registration, "models": []}).status_code == 200
    assert _stored("gpu-a")[0] == []


def test_a_change_of_the_list_is_a_node_event_a_repeat_is_not() -> None:
    node, _ = online_node("gpu-a")
    cached(node, "acme/a", "acme/b")
    cached(node, "acme/a", "acme/b")
    cached(node, "acme/b", "acme/c")
    messages = list(
        NodeEvent.objects.filter(node=node, kind="models")
        .order_by("id")
        .values_list("message", flat=True)
    )
    assert messages == [
        "Models: 2 cached; new: acme/a, acme/b.",
        "Models: 2 cached; new: acme/c; gone: acme/a.",
    ]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"models": "acme/x"}, "models"),
        ({"models": [f"acme/m{i}" for i in range(MAX_MODELS + 1)]}, "models"),
        ({"models": ["acme/x", 12]}, "models[1]"),
        ({"models": ["acme/x", "x" * 10_000]}, "models[1]"),
        ({"models": ["acme/x", "../../etc"]}, "models[1]"),
        # with a registration: refused whole, the registration is not stored either
        ({"models": [{"$gt": ""}], "registration": {"capabilities": {}}}, "models[0]"),
    ],
)
def test_a_bad_list_is_a_400_naming_the_field_and_nothing_changes(body: dict, param: str) -> None:
    node, token = online_node("gpu-a")
    cached(node, "acme/before")
    GpuNode.objects.filter(pk=node.pk).update(
        last_heartbeat_at=timezone.now() - timedelta(seconds=30)
    )
    before = _stored("gpu-a")

    refused = _beat("gpu-a", token, body)

    assert_error(refused, 400, param=param, code="invalid_value")
    assert _stored("gpu-a") == before
    assert NodeEvent.objects.filter(node=node, kind="models").count() == 1


# --- placement --------------------------------------------------------------------------------


def test_an_idle_node_with_the_model_cached_is_preferred(make_job, dispatch_now) -> None:
    online_node("gpu-a", H100)
    cached(online_node("gpu-b", H100)[0], "other/model")
    cached(online_node("gpu-c", H100)[0], "other/model", MODEL)
    job = make_job()

    assert dispatch_now() == 1

    assert attempt_of(job).node_name == "gpu-c"
    [event] = _cache_events(job)
    assert event.message == f"Model {MODEL} is cached on the node: no download."
    assert event.data == {"attempt": 1, "model_cached": True}


def test_of_several_cached_nodes_the_first_by_name_takes_it(make_job, dispatch_now) -> None:
    cached(online_node("gpu-a", H100)[0])
    cached(online_node("gpu-c", H100)[0], MODEL)
    cached(online_node("gpu-b", H100)[0], MODEL)
    first, second, third = make_job(), make_job(), make_job()

    assert dispatch_now() == 3

    assert [attempt_of(j).node_name for j in (first, second, third)] == ["gpu-b", "gpu-c", "gpu-a"]
    assert [e.data["model_cached"] for j in (first, second, third) for e in _cache_events(j)] == [
        True,
        True,
        False,
    ]


def test_without_a_cached_node_the_order_is_as_before(make_job, dispatch_now) -> None:
    cached(online_node("gpu-b", H100)[0], "other/model")
    online_node("gpu-a", H100)
    job = make_job()
    assert dispatch_now() == 1
    assert attempt_of(job).node_name == "gpu-a"


def test_a_busy_cached_node_never_holds_a_job_back(make_job, dispatch_now) -> None:
    """gpu-a has the model but is busy: the job goes to idle gpu-b at once, and says so."""
    busy, _ = online_node("gpu-a", H100)
    cached(busy, MODEL)
    make_job(model="other/model")
    assert dispatch_now() == 1 and fresh(busy).status == N.BUSY
    cached(online_node("gpu-b", H100)[0], "other/model")
    job = make_job()

    assert dispatch_now() == 1

    job.refresh_from_db()
    assert (job.status, job.waiting_reason) == (S.PROVISIONING, "")
    assert attempt_of(job).node_name == "gpu-b"
    [event] = _cache_events(job)
    assert event.message == f"Model {MODEL} is not cached on the node: it is downloaded first."
    assert event.data["model_cached"] is False


def test_a_cached_node_that_does_not_fit_is_not_chosen(make_job, dispatch_now) -> None:
    cached(online_node("gpu-a", T4)[0], MODEL)
    online_node("gpu-b", H100)
    job = make_job(gpu={"min_vram_gb": 40})
    assert dispatch_now() == 1
    assert attempt_of(job).node_name == "gpu-b"


def test_a_local_model_matches_its_reported_path(make_job, dispatch_now, settings) -> None:
    settings.TRAINHUB_ALLOWED_MODELS = ["*/*", "/models/*"]
    cached(online_node("gpu-a", H100)[0], MODEL)
    cached(online_node("gpu-b", H100)[0], "/models/llama")
    job = make_job(model="/models/llama/")
    elsewhere = make_job(model="/models/qwen")

    assert dispatch_now() == 2

    assert attempt_of(job).node_name == "gpu-b"
    assert attempt_of(elsewhere).node_name == "gpu-a"
    assert [e.message for e in _cache_events(elsewhere)] == [
        "Model /models/qwen is not among the node's cached models."
    ]


def test_a_node_that_never_reported_its_cache_says_nothing_about_it(make_job, dispatch_now) -> None:
    online_node("gpu-a", H100)
    job = make_job()
    assert dispatch_now() == 1
    assert _cache_events(job) == []


def test_an_auto_job_prefers_the_cached_idle_node_too(make_job, sent) -> None:
    online_node("gpu-a", H100)
    cached(online_node("gpu-b", H100)[0], MODEL)
    job = make_job(target="auto")
    TrainingJob.objects.filter(pk=job.pk).update(status=S.QUEUED)

    placement.job_place(job_pk=job.pk)

    assert attempt_of(job).node_name == "gpu-b"


# --- the waiting reason -----------------------------------------------------------------------


def test_the_waiting_reason_names_the_cached_nodes_and_why_they_cant_take_it(
    make_job, dispatch_now
) -> None:
    busy, _ = online_node("gpu-a", H100)
    draining, _ = online_node("gpu-b", H100)
    offline, _ = online_node("gpu-c", H100)
    online_node("gpu-d", H100)
    for node in (busy, draining, offline):
        cached(node, MODEL)
    nodes.node_stopping(node=offline)
    for _ in range(3):
        make_job(model="other/model")
    assert dispatch_now() == 3  # on gpu-a, gpu-b and gpu-d
    nodes.node_set_draining(node=draining, draining=True)
    job = make_job()

    assert dispatch_now() == 0

    job.refresh_from_db()
    assert job.waiting_reason == (
        "Waiting for a node: every node that fits is busy: gpu-a (busy), gpu-b (draining), "
        "gpu-d (busy). Model cached on: gpu-a (busy), gpu-b (draining), gpu-c (offline)."
    )
    note = JobEvent.objects.get(job=job, data__waiting="nodes_busy")
    assert note.message == job.waiting_reason


def test_no_cache_sentence_when_no_fitting_node_has_the_model(make_job, dispatch_now) -> None:
    online_node("gpu-a", H100)
    cached(online_node("gpu-b", T4)[0], MODEL)  # cached, but it fits no job needing 40 GB
    make_job(gpu={"min_vram_gb": 40})
    job = make_job(gpu={"min_vram_gb": 40})
    dispatch_now()
    job.refresh_from_db()
    assert job.waiting_reason == "Waiting for a node: every node that fits is busy: gpu-a (busy)."


def test_a_job_no_online_node_fits_names_the_offline_node_with_its_model(
    make_job, dispatch_now
) -> None:
    online_node("a-cpu")
    stopped, _ = online_node("b-h100", H100)
    cached(stopped, MODEL)
    nodes.node_stopping(node=stopped)
    job = make_job(gpu={"count": 1})

    assert dispatch_now() == 0

    assert fresh(job).waiting_reason == (
        "No online node fits this job: a-cpu has 0 GPU(s), the job needs 1. "
        "Fitting but offline: b-h100. Model cached on: b-h100 (offline)."
    )


def test_the_project_reads_no_node_name_or_cache_from_the_reason(
    make_job, dispatch_now, make_client, user
) -> None:
    busy, _ = online_node("gpu-secret", H100)
    cached(busy, MODEL)
    make_job(model="other/model")
    job = make_job()
    dispatch_now()
    assert "gpu-secret (busy)" in fresh(job).waiting_reason

    shown = make_client(user).get(f"/api/v1/jobs/{job.public_id}/").json()["waiting_reason"]
    assert shown == tenant_waiting_reason(fresh(job).waiting_reason)
    assert "gpu-secret" not in shown and "cached" not in shown
    events = make_client(user).get(f"/v1/fine_tuning/jobs/{job.public_id}/events").json()
    assert not any("gpu-secret" in e["message"] for e in events["data"])


# --- what operators see -----------------------------------------------------------------------


def test_the_nodes_api_shows_the_cached_models(make_client, make_user) -> None:
    node, _ = online_node("gpu-a", H100)
    admin = make_client(make_user("root", is_staff=True, is_superuser=True))
    assert admin.get(f"{NODES}gpu-a/").json()["cached_models"] == []
    assert admin.get(f"{NODES}gpu-a/").json()["models_reported_at"] is None

    cached(node, MODEL, "/models/llama")

    body = admin.get(f"{NODES}gpu-a/").json()
    assert body["cached_models"] == ["/models/llama", MODEL]
    reported_at = fresh(node).models_reported_at
    assert reported_at is not None
    assert body["models_reported_at"] == int(reported_at.timestamp())
    assert admin.get(NODES).json()["data"][0]["cached_models"] == body["cached_models"]


def test_the_admin_fleet_pages_show_the_cached_models(admin_client) -> None:
    silent, _ = online_node("gpu-old", H100)
    node, _ = online_node("gpu-a", H100)
    cached(node, *(f"acme/m{i}" for i in range(4)), "/models/a&b<i>")

    listing = admin_client.get("/admin/jobs/gpunode/").content.decode()
    names = "\n".join(["/models/a&amp;b&lt;i&gt;", *(f"acme/m{i}" for i in range(4))])
    assert f'<span title="{names}">5 models</span>' in listing, "every name on hover, escaped"
    assert "not reported" in listing and "b<i>" not in listing

    page = admin_client.get(f"/admin/jobs/gpunode/{node.pk}/change/").content.decode()
    assert all(f"<div>acme/m{i}</div>" in page for i in range(4))
    assert "<div>/models/a&amp;b&lt;i&gt;</div>" in page and "b<i>" not in page
    assert "Models reported at" in page or "models reported at" in page.lower()
    old = admin_client.get(f"/admin/jobs/gpunode/{silent.pk}/change/").content.decode()
    assert "Not reported" in old
    # the list is the node's to set: no form field for it
    assert 'name="cached_models"' not in page
