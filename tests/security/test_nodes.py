"""GPU nodes reach only their own attempts: their broker user reads their own queue and nothing
else, their HTTPS calls speak for themselves only, and a message can't make them touch a file
outside their work dir (docs/SECURITY.md, "GPU nodes")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from django.conf import settings

from gpu_worker.agent import node as node_settings
from gpu_worker.agent import supervisor
from jobs.broker_acl import broker_acl_supported, broker_user_delete
from jobs.models import GpuNode, JobEvent
from jobs.services.core import jobs
from jobs.services.scheduling import dispatch
from tests.support.db import fresh
from tests.support.fleet import H100, online_node
from trainhub_contract import celery_conf as cc

NODE_API = "/api/v1/nodes"


def _redis_as(name: str, token: str) -> redis.Redis:
    url = node_settings.with_node_credentials(settings.CELERY_BROKER_URL, name, token)
    return redis.Redis.from_url(url, socket_timeout=5)


@pytest.fixture
def two_nodes(db, django_capture_on_commit_callbacks) -> Any:
    """Nodes gpu-a and gpu-b with their broker users (created on commit, as in production)."""
    if not broker_acl_supported():
        pytest.skip("this Redis has no ACLs")
    with django_capture_on_commit_callbacks(execute=True):
        a, token_a = online_node("gpu-a", H100)
        b, token_b = online_node("gpu-b", H100)
    yield (a, token_a), (b, token_b)
    broker_user_delete("gpu-a")
    broker_user_delete("gpu-b")


def test_a_node_reads_its_own_queue_and_no_other_key(two_nodes) -> None:
    (_, token_a), _ = two_nodes
    control = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    control.lpush(cc.node_queue("gpu-b"), b"another node's message")
    control.hset("unacked", "tag", b"someone's message")
    as_a = _redis_as("gpu-a", token_a)
    try:
        assert as_a.llen(cc.node_queue("gpu-a")) == 0  # its own: allowed
        for attack in (
            lambda: as_a.lrange(cc.node_queue("gpu-b"), 0, -1),
            lambda: as_a.brpop([cc.node_queue("gpu-b")], timeout=1),
            lambda: as_a.hgetall("unacked"),
            lambda: as_a.keys("*"),
            lambda: as_a.scan(0),
            lambda: as_a.get("trainhub:lock:fleet-tick"),
            lambda: as_a.publish("/0.celery.pidbox", b"x"),
            lambda: as_a.execute_command(
                "ACL", "SETUSER", cc.node_broker_username("gpu-a"), "+@all"
            ),
            lambda: as_a.flushdb(),
        ):
            with pytest.raises(redis.exceptions.NoPermissionError):
                attack()
        assert control.llen(cc.node_queue("gpu-b")) == 1  # untouched
    finally:
        control.delete(cc.node_queue("gpu-b"), "unacked")
        as_a.close()


def test_a_node_cannot_send_a_control_plane_task(two_nodes) -> None:
    (_, token_a), _ = two_nodes
    url = node_settings.with_node_credentials(settings.CELERY_BROKER_URL, "gpu-a", token_a)
    app = Celery("attacker", set_as_current=False)
    app.conf.update(cc.base_config(url), broker_write_url=url, broker_connection_retry=False)
    app.conf.broker_transport_options = {"max_retries": 0}
    before = redis.Redis.from_url(settings.CELERY_BROKER_URL).llen(cc.DEFAULT_QUEUE)
    try:
        with pytest.raises(Exception, match=r"(?i)permission"):
            app.send_task(cc.PURGE_STORAGE, args=[1], queue=cc.DEFAULT_QUEUE, retry=False)
    finally:
        app.close()
    assert redis.Redis.from_url(settings.CELERY_BROKER_URL).llen(cc.DEFAULT_QUEUE) == before


def test_a_wrong_or_old_token_cannot_log_in_to_the_broker(two_nodes) -> None:
    (_, token_a), (_, token_b) = two_nodes
    for name, token in (("gpu-a", token_b), ("gpu-a", "thn-guess"), ("gpu-zz", token_a)):
        with pytest.raises(redis.exceptions.AuthenticationError):
            _redis_as(name, token).ping()


def test_the_run_attempt_message_names_the_attempt_and_holds_no_secret(placed, sent) -> None:
    message = [args[0] for args in sent.named(cc.RUN_ATTEMPT)][-1]
    assert message == {"job_id": placed.job.public_id, "attempt": 1}


def test_a_claim_with_another_nodes_token_is_401_and_of_another_nodes_attempt_409(
    placed, client, django_capture_on_commit_callbacks
) -> None:
    _, other_token = online_node("gpu-b", H100)
    body = {"job_id": placed.job.public_id, "attempt": 1}
    stolen = client.post(
        f"{NODE_API}/gpu-a/claim/", body, "application/json",
        HTTP_AUTHORIZATION=f"Bearer {other_token}",
    )  # fmt: skip
    assert stolen.status_code == 401
    mine = client.post(
        f"{NODE_API}/gpu-b/claim/", body, "application/json",
        HTTP_AUTHORIZATION=f"Bearer {other_token}",
    )  # fmt: skip
    assert mine.status_code == 409 and "spec" not in mine.json()
    assert fresh(placed.attempt).claimed_at is None  # still gpu-a's to claim


def _post_events(client: Any, node: str, job_id: str, attempt: int, token: str) -> Any:
    failed = {"seq": 0, "type": "status", "level": "error", "message": "forged",
              "data": {"status": "failed", "code": "forged"}}  # fmt: skip
    return client.post(
        f"{NODE_API}/{node}/attempts/{job_id}/{attempt}/events/",
        {"events": [failed]},
        "application/json",
        HTTP_AUTHORIZATION=f"Bearer {token}",
    )


def test_a_report_for_an_attempt_the_node_did_not_claim_is_403(
    claimed, client, make_job, fake_cloud, django_capture_on_commit_callbacks
) -> None:
    _, other_token = online_node("gpu-b", H100)
    job_id = claimed.job.public_id
    # The node token is not a report token; a made-up one, another attempt's, neither.
    cloud_job = make_job(target="fake-cloud")
    forged = [
        ("gpu-a", job_id, 1, claimed.token),
        ("gpu-a", job_id, 1, "eyJhdHRlbXB0IjoxfQ:forged:sig"),
        ("gpu-b", job_id, 1, other_token),
        ("gpu-a", job_id, 2, dispatch.report_token(claimed.attempt)),
        ("gpu-b", job_id, 1, dispatch.report_token(claimed.attempt)),
        ("gpu-a", cloud_job.public_id, 1, dispatch.report_token(claimed.attempt)),
    ]
    for node, job, attempt, token in forged:
        answer = _post_events(client, node, job, attempt, token)
        assert answer.status_code == 403, (node, job, attempt, answer.content)
    assert not JobEvent.objects.filter(message="forged").exists()
    assert fresh(claimed.job).status == claimed.job.status
    # The real report token does speak for the attempt (so the refusals above are not a
    # broken endpoint).
    genuine = _post_events(client, "gpu-a", job_id, 1, dispatch.report_token(claimed.attempt))
    assert genuine.status_code == 200 and genuine.json() == {"stored": 1}


def test_a_heartbeat_lists_only_the_nodes_own_cancelled_attempts(
    claimed, client, django_capture_on_commit_callbacks
) -> None:
    _, other_token = online_node("gpu-b", H100)
    with django_capture_on_commit_callbacks(execute=True):
        jobs.job_cancel(job=fresh(claimed.job))

    def beat(node: str, token: str) -> Any:
        return client.post(
            f"{NODE_API}/{node}/heartbeat/", {}, "application/json",
            HTTP_AUTHORIZATION=f"Bearer {token}",
        )  # fmt: skip

    assert beat("gpu-a", claimed.token).json()["cancel"] == [
        {"job_id": claimed.job.public_id, "attempt": 1, "mode": "cancel"}
    ]
    assert beat("gpu-b", other_token).json()["cancel"] == []
    assert beat("gpu-a", other_token).status_code == 401


def test_a_node_cannot_set_another_nodes_cached_models(db, client) -> None:
    """The cached-model list steers placement: only the node's own token sets it."""
    online_node("gpu-a", H100)
    _, token_b = online_node("gpu-b", H100)
    forged = {"models": ["acme/popular-model"]}
    for token in (token_b, "thn-guess", ""):
        refused = client.post(
            f"{NODE_API}/gpu-a/heartbeat/", forged, "application/json",
            HTTP_AUTHORIZATION=f"Bearer {token}",
        )  # fmt: skip
        assert refused.status_code == 401
    a = GpuNode.objects.get(name="gpu-a")
    assert (a.cached_models, a.models_reported_at) == ([], None)
    own = client.post(
        f"{NODE_API}/gpu-b/heartbeat/", forged, "application/json",
        HTTP_AUTHORIZATION=f"Bearer {token_b}",
    )  # fmt: skip
    assert own.status_code == 200
    assert GpuNode.objects.get(name="gpu-b").cached_models == ["acme/popular-model"]


def test_an_oversized_cached_model_report_is_refused_not_stored(db, client) -> None:
    _, token = online_node("gpu-a", H100)
    flood = {"models": [f"acme/m{i}" for i in range(100_000)]}
    refused = client.post(
        f"{NODE_API}/gpu-a/heartbeat/", flood, "application/json",
        HTTP_AUTHORIZATION=f"Bearer {token}",
    )  # fmt: skip
    assert refused.status_code in (400, 413)
    assert GpuNode.objects.get(name="gpu-a").cached_models == []


@pytest.mark.parametrize(
    "message",
    [
        {"job_id": "../../etc", "attempt": 1},
        {"job_id": "ftjob-ok", "attempt": "../1"},
        {"job_id": "ftjob-a/../../b", "attempt": 1},
        {"job_id": "ftjob-ok", "attempt": -1},
        {"spec": {"job_id": "ftjob-ok", "attempt": 1}, "claim_url": "http://evil.test/"},
    ],
)
def test_a_message_naming_no_attempt_is_refused_before_any_file_or_call(
    tmp_path: Path, message: dict
) -> None:
    class NoCalls:
        def claim(self, *args: object) -> None:
            raise AssertionError("a malformed message must not reach the control plane")

    node = node_settings.config_from(
        {"TRAINHUB_NODE_TOKEN": "thn-x", "CELERY_BROKER_URL": "redis://127.0.0.1:6379/1",
         "TRAINHUB_CONTROL_URL": "http://control.test", "TRAINHUB_NODE_WORKDIR":
         str(tmp_path / "work")}
    )  # fmt: skip
    victim = tmp_path / "etc"
    victim.mkdir()
    (victim / "keep").write_text("x")
    assert supervisor.run(message, node, api=NoCalls()) == "refused"  # type: ignore[arg-type]
    assert (victim / "keep").exists() and not (tmp_path / "work").exists()


def test_node_apis_need_the_django_permission_not_only_staff(make_user, make_client) -> None:
    from django.contrib.auth.models import Permission

    staff = make_user("ops", is_staff=True)
    api = make_client(staff)
    assert api.get("/api/v1/nodes/").status_code == 403
    assert api.post("/api/v1/nodes/", {"name": "n1"}, format="json").status_code == 403
    staff.user_permissions.add(Permission.objects.get(codename="view_gpunode"))
    api = make_client(type(staff).objects.get(pk=staff.pk))  # permissions are cached per user
    assert api.get("/api/v1/nodes/").status_code == 200
    assert api.post("/api/v1/nodes/", {"name": "n1"}, format="json").status_code == 403
    assert not GpuNode.objects.filter(name="n1").exists()
