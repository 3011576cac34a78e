"""One contract every provider adapter keeps, run against each of them through ``responses``
with answers shaped like that provider's documented ones: a bad key is InvalidCredentials on
every verb, 429 waits for ``Retry-After``, a 5xx is retried where the call is idempotent and
never where it may have rented a machine, cancelling what the provider no longer knows is
success, the status map is total, and no error ever repeats the API key.

A new adapter joins by adding a ``Case`` to ``CASES``."""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

import pytest
import responses

from providers import runpod_pod, runpod_serverless
from providers.base import ProviderAdapter, RemoteStatus
from providers.errors import (
    InvalidCredentials,
    ProviderError,
    RateLimited,
    TransientProviderError,
)
from providers.http import ProviderHTTP, RetryPolicy
from tests.providers import runpod_payloads
from tests.providers.contract import KEY, REQUEST, Case, Exchange, Sleep, Sleeps
from tests.providers.lambda_payloads import LAMBDA_CASE
from tests.providers.runpod_payloads import HTML_502
from tests.providers.vast_payloads import VAST_CASE

# --- RunPod serverless: api.runpod.ai/v2/{endpoint}/run|status|cancel -------------------------

SERVERLESS = "https://api.runpod.ai/v2"
ENDPOINT = "ep-abc123"
JOB = "60902e6c-08a1-426e-9cb9-9eaec90f5e2b-u1"


def _serverless(base_url: str, sleep: Sleep) -> ProviderAdapter:
    http = ProviderHTTP(provider="runpod-serverless", base_url=base_url, sleep=sleep)
    return runpod_serverless.RunpodServerless(api_key=KEY, endpoint_id=ENDPOINT, http=http)


def _job(job_id: str, status: str) -> dict[str, object]:
    """A ``/status`` job object as RunPod's operation reference shows it for ``status``."""
    job: dict[str, object] = {"id": job_id, "status": status}
    if status != "IN_QUEUE":
        job.update(delayTime=31618, workerId="uhbbfre73gqjwh")
    if status in ("IN_PROGRESS", "RUNNING"):
        job["output"] = {"attempt": 2, "events": [{"seq": 1, "type": "metrics", "data": {}}]}
    if status == "COMPLETED":
        job.update(executionTime=1437, output={"status": "succeeded", "events": []})
    if status == "FAILED":
        job["error"] = "worker exited unexpectedly"
    return job


SERVERLESS_CASE = Case(
    name="runpod-serverless",
    base_url=SERVERLESS,
    build=_serverless,
    instance_id=JOB,
    launch=Exchange("POST", f"{SERVERLESS}/{ENDPOINT}/run", json={"id": JOB, "status": "IN_QUEUE"}),
    cancel=lambda i: Exchange(
        "POST", f"{SERVERLESS}/{ENDPOINT}/cancel/{i}", json={"id": i, "status": "CANCELLED"}
    ),
    poll=lambda ids, status: [
        Exchange("GET", f"{SERVERLESS}/{ENDPOINT}/status/{i}", json=_job(i, status)) for i in ids
    ],
    status_map=runpod_serverless.STATUS_MAP,
    # The job-states page; RUNNING is listed there beside IN_PROGRESS.
    documented_statuses=frozenset(
        {"IN_QUEUE", "IN_PROGRESS", "RUNNING", "COMPLETED", "FAILED", "CANCELLED", "TIMED_OUT"}
    ),
    unauthorized={"error": "Unauthorized"},
    not_found={"error": "request does not exist"},
)


# --- RunPod pods: REST v2 at api.runpod.io/v2/pods --------------------------------------------

PODS = "https://api.runpod.io/v2"
POD = "7h9k2m4n6p"


def _pods(base_url: str, sleep: Sleep) -> ProviderAdapter:
    return runpod_pod.RunpodPods(
        api_key=KEY,
        http=ProviderHTTP(provider="runpod-pod", base_url=base_url, sleep=sleep),
        image=runpod_payloads.IMAGE,
        gpu_types=["NVIDIA H100 80GB HBM3=80", "NVIDIA A100 80GB PCIe=80"],
    )


def _pod(pod_id: str, status: str) -> dict[str, object]:
    return runpod_payloads.pod(pod_id, status, name=REQUEST.name, public_key=REQUEST.ssh_public_key)


POD_CASE = Case(
    name="runpod-pod",
    base_url=PODS,
    build=_pods,
    instance_id=POD,
    launch=Exchange("POST", f"{PODS}/pods", status=201, json=_pod(POD, "PROVISIONING")),
    # A launch first looks for a pod of the attempt (a lost answer to an earlier create).
    before_launch=(Exchange("GET", f"{PODS}/pods", json={"pods": []}),),
    cancel=lambda i: Exchange("DELETE", f"{PODS}/pods/{i}", status=204),
    poll=lambda ids, status: [
        Exchange("GET", f"{PODS}/pods", json={"pods": [_pod(i, status) for i in ids]})
    ],
    status_map=runpod_pod.STATUS_MAP,
    documented_statuses=frozenset(
        {"PROVISIONING", "STARTING", "RUNNING", "EXITED", "ERROR", "TERMINATED"}
    ),
    unauthorized={"title": "Unauthorized", "status": 401, "detail": "invalid bearer token"},
    not_found={"title": "Not Found", "status": 404, "detail": "resource not found"},
)

CASES = {c.name: c for c in (SERVERLESS_CASE, POD_CASE, LAMBDA_CASE, VAST_CASE)}
STATUS_CASES = [(name, raw) for name, c in CASES.items() for raw in c.status_map]


@pytest.fixture(params=list(CASES))
def case(request: pytest.FixtureRequest) -> Case:
    return CASES[request.param]


def raised(error: type[Exception], call: Callable[[], object]) -> Exception:
    """Run ``call``, expect ``error``, and check that what it says leaves the key out."""
    with pytest.raises(error) as info:
        call()
    text = f"{info.value} {info.value!r} {getattr(info.value, 'message', '')}"
    assert KEY not in text
    return info.value


def any_status(case: Case) -> str:
    """A raw status for calls whose answer is a failure anyway (only the URL matters)."""
    return next(iter(case.status_map))


def call_verb(case: Case, adapter: ProviderAdapter, verb: str) -> object:
    if verb == "launch":
        return adapter.launch(case.request)
    if verb == "poll":
        return adapter.poll([case.handle()])
    return adapter.cancel(case.handle())


def verb_exchanges(case: Case, verb: str) -> list[Exchange]:
    """The calls ``verb`` makes, after the answered look-ups a launch does first."""
    if verb == "launch":
        for lookup in case.before_launch:
            lookup.answer()
        return [case.launch]
    if verb == "poll":
        return case.poll([case.instance_id], any_status(case))
    return [case.cancel(case.instance_id)]


# --- credentials --------------------------------------------------------------------------------


@pytest.mark.parametrize("verb", ["launch", "poll", "cancel"])
@responses.activate
def test_a_bad_key_is_invalid_credentials_on_every_verb(case: Case, verb: str) -> None:
    (exchange,) = verb_exchanges(case, verb)
    exchange.fail(401, json=case.unauthorized)
    adapter = case.build(case.base_url, lambda s: None)
    error = raised(InvalidCredentials, lambda: call_verb(case, adapter, verb))
    assert isinstance(error, InvalidCredentials) and error.status == 401
    assert len(exchange.calls()) == 1, "a bad key is not retried"


@responses.activate
def test_a_bad_key_is_not_swallowed_when_many_attempts_are_polled(case: Case) -> None:
    # Several handles take the batched (pod: one list) or concurrent (serverless: a thread
    # pool) path; an auth failure there must surface too, not read as "unknown this cycle".
    ids = [case.instance_id, f"{case.instance_id}-2", f"{case.instance_id}-3"]
    for exchange in case.poll(ids, any_status(case)):
        exchange.fail(401, json=case.unauthorized)
    adapter = case.build(case.base_url, lambda s: None)
    raised(InvalidCredentials, lambda: adapter.poll([case.handle(i) for i in ids]))


# --- rate limits and server errors --------------------------------------------------------------


@responses.activate
def test_a_429_on_poll_is_waited_out_then_the_state_comes_back(case: Case, sleeps: Sleeps) -> None:
    raw = next(r for r, s in case.status_map.items() if s is RemoteStatus.RUNNING)
    (exchange,) = case.poll([case.instance_id], raw)
    exchange.fail(
        429,
        headers={"Retry-After": "3"},
        json={"title": "Too Many Requests", "status": 429, "detail": "rate limit exceeded"},
    )
    exchange.answer()
    states = case.build(case.base_url, sleeps).poll([case.handle()])
    assert states[case.instance_id].status is RemoteStatus.RUNNING
    assert len(exchange.calls()) == 2
    assert len(sleeps) == 1 and 3.0 <= sleeps[0] <= 3.4, "one wait of Retry-After (+ jitter)"


@responses.activate
def test_a_5xx_page_on_poll_is_retried_then_succeeds(case: Case, sleeps: Sleeps) -> None:
    raw = next(r for r, s in case.status_map.items() if s is RemoteStatus.PENDING)
    (exchange,) = case.poll([case.instance_id], raw)
    exchange.fail(502, body=HTML_502, content_type="text/html")
    exchange.fail(503, body=HTML_502, content_type="text/html")
    exchange.answer()
    states = case.build(case.base_url, sleeps).poll([case.handle()])
    assert states[case.instance_id].status is RemoteStatus.PENDING
    assert len(exchange.calls()) == 3 and len(sleeps) == 2


@responses.activate
def test_a_5xx_on_launch_is_maybe_applied_and_sent_once(case: Case, sleeps: Sleeps) -> None:
    for lookup in case.before_launch:
        lookup.answer()
    case.launch.fail(502, body=HTML_502, content_type="text/html")
    adapter = case.build(case.base_url, sleeps)
    error = raised(TransientProviderError, lambda: adapter.launch(case.request))
    assert isinstance(error, TransientProviderError) and error.maybe_applied
    assert len(case.launch.calls()) == 1, "a launch that may have rented a machine is not repeated"
    assert sleeps == []


@responses.activate
def test_a_long_retry_after_goes_back_to_the_caller_on_launch(case: Case, sleeps: Sleeps) -> None:
    for lookup in case.before_launch:
        lookup.answer()
    wait = int(RetryPolicy().retry_after_max_seconds) * 2
    case.launch.fail(429, headers={"Retry-After": str(wait)}, json={"title": "Too Many Requests"})
    adapter = case.build(case.base_url, sleeps)
    error = raised(RateLimited, lambda: adapter.launch(case.request))
    assert isinstance(error, RateLimited) and error.retry_after == wait
    assert len(case.launch.calls()) == 1 and sleeps == []


# --- cancel -------------------------------------------------------------------------------------


@responses.activate
def test_cancel_of_an_instance_the_provider_does_not_know_is_success(case: Case) -> None:
    exchange = case.cancel("unknown-instance-1")
    exchange.fail(404, json=case.not_found)
    adapter = case.build(case.base_url, lambda s: None)
    assert adapter.cancel(case.handle("unknown-instance-1")) is None
    assert len(exchange.calls()) == 1


@responses.activate
def test_cancel_succeeds(case: Case) -> None:
    exchange = case.cancel(case.instance_id)
    exchange.answer()
    assert case.build(case.base_url, lambda s: None).cancel(case.handle()) is None
    assert len(exchange.calls()) == 1


# --- the status map -----------------------------------------------------------------------------


def test_the_status_map_is_total(case: Case) -> None:
    assert set(case.status_map) == case.documented_statuses
    assert all(isinstance(s, RemoteStatus) for s in case.status_map.values())


@pytest.mark.parametrize(("case", "raw"), STATUS_CASES, indirect=["case"])
@responses.activate
def test_poll_maps_each_raw_status_through_the_real_parser(case: Case, raw: str) -> None:
    for exchange in case.poll([case.instance_id], raw):
        exchange.answer()
    state = case.build(case.base_url, lambda s: None).poll([case.handle()])[case.instance_id]
    assert state.status is case.status_map[raw]


# --- a 2xx the client cannot read ---------------------------------------------------------------


@responses.activate
def test_a_2xx_that_is_not_json_is_a_provider_error(case: Case) -> None:
    """An edge proxy's HTML page served with 200 is no state: a ProviderError, or (adapters
    that poll job by job) the handle left out as unknown this cycle; never a crash."""
    (exchange,) = case.poll([case.instance_id], any_status(case))
    exchange.fail(200, body="<html><body>Just a moment...</body></html>", content_type="text/html")
    adapter = case.build(case.base_url, lambda s: None)
    try:
        states = adapter.poll([case.handle()])
    except ProviderError:
        return
    assert case.instance_id not in states


# --- the key ------------------------------------------------------------------------------------

FAILURES: dict[str, dict[str, Any]] = {
    "400": {"status": 400, "json": {"title": "Bad Request", "status": 400, "detail": "no"}},
    "403": {"status": 403, "json": {"title": "Forbidden", "status": 403, "detail": "denied"}},
    "422": {"status": 422, "json": {"title": "Unprocessable Entity", "status": 422}},
    "429": {"status": 429, "headers": {"Retry-After": "3600"}, "body": "slow down"},
    "500": {"status": 500, "body": HTML_502, "content_type": "text/html"},
}


@pytest.mark.parametrize("failure", list(FAILURES))
@pytest.mark.parametrize("verb", ["launch", "poll", "cancel"])
@responses.activate
def test_no_error_repeats_the_key(case: Case, verb: str, failure: str) -> None:
    for exchange in verb_exchanges(case, verb):
        exchange.fail(**FAILURES[failure])
    adapter = case.build(case.base_url, lambda s: None)
    try:
        call_verb(case, adapter, verb)
    except ProviderError as exc:
        assert KEY not in f"{exc} {exc!r} {exc.message}"
    # A poll may instead leave the attempt out (unknown this cycle): nothing raised, nothing said.


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize("verb", ["launch", "poll", "cancel"])
def test_a_provider_that_cannot_be_reached_is_transient_and_keyless(case: Case, verb: str) -> None:
    base_url = f"http://127.0.0.1:{_closed_port()}/v2"
    adapter = case.build(base_url, lambda s: None)
    try:
        call_verb(case, adapter, verb)
    except TransientProviderError as exc:
        assert not exc.maybe_applied, "the connection never opened: nothing can have launched"
        assert KEY not in f"{exc} {exc!r} {exc.message}"
    else:
        assert verb == "poll", "only a poll may leave an attempt out instead of raising"
