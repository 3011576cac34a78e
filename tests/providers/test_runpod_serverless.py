"""The RunPod serverless adapter against ``responses`` answers shaped like RunPod's documented
ones (operation reference: /run, /status, /cancel; job states; the worker SDK's error string)."""

from __future__ import annotations

import json

import pytest
import responses

from providers.base import Handle, LaunchRequest, RemoteStatus
from providers.errors import InvalidCredentials, TransientProviderError
from providers.http import ProviderHTTP
from providers.runpod_serverless import RunpodServerless

URL = "https://api.runpod.ai/v2/ep-abc123"
KEY = "rpa_SECRET"
SPEC = {"version": 1, "job_id": "ftjob-x", "attempt": 2, "report": {"sinks": [{"type": "runpod"}]}}
JOB_ID = "60902e6c-08a1-426e-9cb9-9eaec90f5e2b-u1"


def adapter() -> RunpodServerless:
    http = ProviderHTTP(
        provider="runpod", base_url="https://api.runpod.ai/v2", sleep=lambda s: None
    )
    return RunpodServerless(api_key=KEY, endpoint_id="ep-abc123", http=http)


def request(max_runtime: int = 3600, webhook: str = "") -> LaunchRequest:
    return LaunchRequest(
        job_id="ftjob-x",
        attempt=2,
        name="trainhub-ftjob-x-a2",
        max_runtime_seconds=max_runtime,
        spec=SPEC,
        webhook_url=webhook,
    )


@responses.activate
def test_launch_sends_the_spec_with_a_policy_that_covers_the_run() -> None:
    responses.post(f"{URL}/run", json={"id": JOB_ID, "status": "IN_QUEUE"})
    handle = adapter().launch(request(3600, webhook="https://trainhub.example.org/hooks/runpod"))
    assert handle == Handle(instance_id=JOB_ID, name="trainhub-ftjob-x-a2")
    sent = json.loads(responses.calls[0].request.body)
    assert sent["input"] == SPEC
    assert sent["policy"] == {
        "executionTimeout": (3600 + 900) * 1000,
        "ttl": (3600 + 900 + 6 * 3600) * 1000,
    }
    assert sent["webhook"] == "https://trainhub.example.org/hooks/runpod"
    assert responses.calls[0].request.headers["Authorization"] == f"Bearer {KEY}"


@responses.activate
def test_a_week_long_job_is_capped_at_runpods_seven_days_and_no_webhook_without_a_public_url() -> (
    None
):
    responses.post(f"{URL}/run", json={"id": JOB_ID, "status": "IN_QUEUE"})
    adapter().launch(request(7 * 24 * 3600))
    sent = json.loads(responses.calls[0].request.body)
    assert sent["policy"] == {"executionTimeout": 604_800_000, "ttl": 604_800_000}
    assert "webhook" not in sent


@responses.activate
def test_an_ambiguous_launch_failure_is_not_repeated() -> None:
    responses.post(f"{URL}/run", status=502, body="<html><body>502 Bad Gateway</body></html>")
    with pytest.raises(TransientProviderError) as info:
        adapter().launch(request())
    assert info.value.maybe_applied and len(responses.calls) == 1


FAILED_SDK_ERROR = json.dumps(
    {
        "error_type": "<class 'torch.OutOfMemoryError'>",
        "error_message": "CUDA out of memory. Tried to allocate 2.00 GiB",
        "error_traceback": "Traceback (most recent call last): …",
        "hostname": "uhbbfre73gqjwh",
        "worker_id": "uhbbfre73gqjwh",
        "runpod_version": "1.12.0",
    }
)
PROGRESS = {"attempt": 2, "events": [{"seq": 4, "type": "metrics", "data": {"step": 10}}]}
SUCCESS = {
    "status": "succeeded",
    "sha256": "a" * 64,
    "size": 1234,
    "events": [{"seq": 9, "type": "status", "data": {"status": "succeeded", "sha256": "a" * 64}}],
}


@pytest.mark.parametrize(
    ("job", "status", "code", "events", "words"),
    [
        (
            {"id": JOB_ID, "status": "IN_QUEUE", "delayTime": 1200},
            RemoteStatus.PENDING,
            "",
            0,
            "IN_QUEUE",
        ),
        (
            {
                "id": JOB_ID,
                "status": "IN_PROGRESS",
                "delayTime": 31618,
                "output": PROGRESS,
                "workerId": "uhbb",
            },
            RemoteStatus.RUNNING,
            "",
            1,
            "",
        ),
        ({"id": JOB_ID, "status": "RUNNING"}, RemoteStatus.RUNNING, "", 0, ""),
        (
            {
                "id": JOB_ID,
                "status": "COMPLETED",
                "delayTime": 31618,
                "executionTime": 1437,
                "output": SUCCESS,
            },
            RemoteStatus.SUCCEEDED,
            "",
            1,
            "",
        ),
        (
            {
                "id": JOB_ID,
                "status": "COMPLETED",
                "output": {"error": "oom: CUDA out of memory at step 3"},
            },
            RemoteStatus.FAILED,
            "oom",
            0,
            "CUDA out of memory",
        ),
        (
            {"id": JOB_ID, "status": "FAILED", "error": "invalid_dataset: line 3: not JSON"},
            RemoteStatus.FAILED,
            "invalid_dataset",
            0,
            "line 3",
        ),
        (
            {"id": JOB_ID, "status": "FAILED", "error": FAILED_SDK_ERROR},
            RemoteStatus.FAILED,
            "internal_error",
            0,
            "CUDA out of memory. Tried",
        ),
        (
            {"id": JOB_ID, "status": "FAILED", "error": "worker exited unexpectedly"},
            RemoteStatus.FAILED,
            "provider_error",
            0,
            "worker exited",
        ),
        (
            {"id": JOB_ID, "status": "TIMED_OUT"},
            RemoteStatus.FAILED,
            "timeout",
            0,
            "timed the job out",
        ),
        ({"id": JOB_ID, "status": "CANCELLED"}, RemoteStatus.CANCELLED, "", 0, ""),
        (
            {"id": JOB_ID, "status": "SOMETHING_NEW"},
            RemoteStatus.RUNNING,
            "",
            0,
            "unknown RunPod status",
        ),
    ],
)
@responses.activate
def test_status_map(job: dict, status: RemoteStatus, code: str, events: int, words: str) -> None:
    responses.get(f"{URL}/status/{JOB_ID}", json=job)
    state = adapter().poll([Handle(JOB_ID)])[JOB_ID]
    assert (state.status, state.error_code) == (status, code)
    assert len(state.events) == events
    assert words in state.message


@responses.activate
def test_an_expired_job_is_lost_and_each_job_is_polled() -> None:
    responses.get(f"{URL}/status/{JOB_ID}", status=404, json={"error": "request does not exist"})
    responses.get(f"{URL}/status/other-u1", json={"id": "other-u1", "status": "IN_QUEUE"})
    states = adapter().poll([Handle(JOB_ID), Handle("other-u1")])
    assert states[JOB_ID].status is RemoteStatus.LOST
    assert states["other-u1"].status is RemoteStatus.PENDING


@responses.activate
def test_cancel_is_idempotent_and_a_vanished_job_is_already_cancelled() -> None:
    responses.post(f"{URL}/cancel/{JOB_ID}", status=500, body="")
    responses.post(f"{URL}/cancel/{JOB_ID}", json={"id": JOB_ID, "status": "CANCELLED"})
    adapter().cancel(Handle(JOB_ID))
    assert len(responses.calls) == 2, "a cancel is safe to repeat, so a 5xx is retried"
    responses.post(f"{URL}/cancel/gone-u1", status=404, json={"error": "request does not exist"})
    adapter().cancel(Handle("gone-u1"))  # no error
    assert adapter().list_instances() == []


@responses.activate
def test_a_bad_key_is_invalid_credentials_for_every_verb() -> None:
    body = {"error": "Unauthorized"}
    responses.post(f"{URL}/run", status=401, json=body)
    responses.get(f"{URL}/status/{JOB_ID}", status=401, json=body)
    responses.post(f"{URL}/cancel/{JOB_ID}", status=401, json=body)
    for call in (
        lambda a: a.launch(request()),
        lambda a: a.poll([Handle(JOB_ID)]),
        lambda a: a.cancel(Handle(JOB_ID)),
    ):
        with pytest.raises(InvalidCredentials):
            call(adapter())
    assert len(responses.calls) == 3, "never retried"


def test_an_endpoint_id_is_required() -> None:
    with pytest.raises(ValueError, match="endpoint id"):
        RunpodServerless(
            api_key=KEY, endpoint_id="", http=ProviderHTTP(provider="runpod", base_url=URL)
        )
