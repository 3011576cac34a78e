"""Deployments and OpenAI's models routes, without a server process (the whole path, with the
embedded server, is tests/e2e/test_inference.py): what cannot be deployed is refused, another
project's names are 404s, and placement tells a server that is down from one that refuses."""

from __future__ import annotations

import json
import socket

import pytest
import responses

from jobs.models import AuditEntry, Deployment, InferenceServer
from jobs.services.serving.deployments import deployment_place
from jobs.services.serving.servers import server_register
from tests.support.api import assert_error
from trainhub_contract import celery_conf as cc

pytestmark = pytest.mark.usefixtures("sent")


def _closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def _register(url: str, **extra: object) -> InferenceServer:
    fields = {"base_model": "acme/tiny-llama", "served_name": "tiny", "api_key": "server-secret"}
    return server_register(name=f"s-{url.rsplit(':', 1)[-1]}", url=url, **{**fields, **extra})


def test_only_a_succeeded_job_of_your_project_is_deployed(
    api, other_client, make_job, ingested
) -> None:
    queued = make_job()
    assert_error(api.post(f"/v1/fine_tuning/jobs/{queued.public_id}/deploy"), 409,
                 code="job_not_deployable")  # fmt: skip
    job = ingested.job
    assert_error(other_client.post(f"/v1/fine_tuning/jobs/{job.public_id}/deploy"), 404)

    made = api.post(f"/v1/fine_tuning/jobs/{job.public_id}/deploy")
    again = api.post(f"/v1/fine_tuning/jobs/{job.public_id}/deploy")

    assert (made.status_code, again.status_code) == (201, 200)
    assert made.json() == again.json()
    assert made.json()["id"] == job.fine_tuned_model_name and made.json()["state"] == "pending"
    assert Deployment.objects.count() == 1


def test_models_are_the_project_s_deployments_and_404_for_anyone_else(
    api, other_client, ingested, sent, django_capture_on_commit_callbacks
) -> None:
    name = ingested.job.fine_tuned_model_name
    with django_capture_on_commit_callbacks(execute=True):
        api.post(f"/v1/fine_tuning/jobs/{ingested.job.public_id}/deploy")
    assert [d.pk for d in Deployment.objects.all()] == [sent.named(cc.PLACE_DEPLOYMENT)[0][0]]

    assert [m["id"] for m in api.get("/v1/models").json()["data"]] == [name]
    assert api.get(f"/v1/models/{name}").json()["fine_tuning_job"] == ingested.job.public_id
    assert other_client.get("/v1/models").json()["data"] == []
    assert_error(other_client.get(f"/v1/models/{name}"), 404, code="model_not_found")
    assert_error(other_client.delete(f"/v1/models/{name}"), 404, code="model_not_found")
    assert_error(api.get("/v1/models/ft:acme/nothing:here"), 404, code="model_not_found")

    deleted = api.delete(f"/v1/models/{name}")
    assert deleted.json() == {"id": name, "object": "model", "deleted": True}
    assert_error(api.get(f"/v1/models/{name}"), 404)
    assert api.get("/v1/models").json()["data"] == []
    assert api.post(f"/v1/fine_tuning/jobs/{ingested.job.public_id}/deploy").status_code == 201


def test_a_server_that_does_not_answer_is_taken_offline_and_the_deployment_waits(
    api, ingested
) -> None:
    down = _register(_closed_port_url())
    api.post(f"/v1/fine_tuning/jobs/{ingested.job.public_id}/deploy")
    deployment = Deployment.objects.get()

    placed = deployment_place(deployment_pk=deployment.pk)

    assert placed is not None and placed.state == "pending" and placed.server is None
    assert "waiting for a server of acme/tiny-llama" in placed.detail
    down.refresh_from_db()
    assert down.status == "offline" and "did not answer" in down.status_detail
    listed = [m["id"] for m in api.get("/v1/models").json()["data"]]
    assert "acme/tiny-llama" not in listed, "an offline server's base model is not offered"


@responses.activate
def test_a_server_that_refuses_the_adapter_fails_the_deployment_and_gets_the_signed_url(
    api, ingested
) -> None:
    url = "http://10.9.8.7:8100"
    responses.post(f"{url}/v1/load_lora_adapter", status=400, json={"error": {
        "message": "the adapter bundle was not loaded: sha256 mismatch", "type": "x",
        "param": "lora_path", "code": None}})  # fmt: skip
    _register(url)
    api.post(f"/v1/fine_tuning/jobs/{ingested.job.public_id}/deploy")

    placed = deployment_place(deployment_pk=Deployment.objects.get().pk)

    assert placed is not None and placed.state == "failed" and "sha256 mismatch" in placed.detail
    (call,) = responses.calls
    body = json.loads(call.request.body)
    assert body["sha256"] == ingested.artifact.sha256 and "/transfer/" in body["lora_path"]
    assert call.request.headers["Authorization"] == "Bearer server-secret"
    assert InferenceServer.objects.get().status == "online", "it answered: not taken offline"


def test_a_server_s_key_is_stored_encrypted_and_never_audited(api) -> None:
    server = _register("http://10.1.1.1:8000/")
    assert server.url == "http://10.1.1.1:8000" and "server-secret" not in server.api_key_ciphertext
    entry = AuditEntry.objects.get(action="server.register")
    assert "server-secret" not in json.dumps(entry.changes)
    assert "10.1.1.1" in json.dumps(entry.changes)
