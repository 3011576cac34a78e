"""The providers' HTTP client: retries only where they are safe, Retry-After honoured, every
failure mapped to the error family with a message that names what the provider said and never
the key. Provider answers are shaped like the documented ones (RunPod REST v2 RFC 9457,
Lambda's error envelope, Vast.ai's plain-text 429, an HTML 502 from a proxy)."""

from __future__ import annotations

import socket
import threading
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest
import responses

from providers.errors import (
    InstanceNotFound,
    InvalidCredentials,
    PermanentProviderError,
    RateLimited,
    TransientProviderError,
)
from providers.http import ProviderHTTP, RetryPolicy

BASE = "https://rest.runpod.example/v2"
KEY = "rpa_SECRETKEY0123456789"
HTML_502 = "<html><head><title>502 Bad Gateway</title></head><body><h1>502 Bad Gateway</h1><hr><center>cloudflare</center></body></html>"
PROBLEM_422 = {
    "title": "Unprocessable Entity",
    "status": 422,
    "detail": "The request body did not match the schema.",
    "errors": [{"detail": "gpu.count must be >= 1", "pointer": "/gpu/count"}],
}


class Sleeps(list):
    def __call__(self, seconds: float) -> None:
        self.append(seconds)


@pytest.fixture
def sleeps() -> Sleeps:
    return Sleeps()


@pytest.fixture
def client(sleeps: Sleeps) -> ProviderHTTP:
    return ProviderHTTP(provider="runpod", base_url=BASE + "/", sleep=sleeps)


@responses.activate
def test_429_then_5xx_then_success_retries_with_retry_after_and_backoff(client, sleeps) -> None:
    responses.get(
        f"{BASE}/pods",
        status=429,
        headers={"Retry-After": "2"},
        json={"title": "Too Many Requests", "status": 429},
    )
    responses.get(f"{BASE}/pods", status=502, body=HTML_502, content_type="text/html")
    responses.get(f"{BASE}/pods", status=200, json={"pods": []})

    assert client.call("GET", "/pods", key=KEY, params={"name": "trainhub-x"}) == {"pods": []}

    assert len(responses.calls) == 3
    assert all(c.request.headers["Authorization"] == f"Bearer {KEY}" for c in responses.calls)
    assert 2.0 <= sleeps[0] <= 2.3, "Retry-After honoured (plus a little jitter)"
    assert 0.5 <= sleeps[1] <= 1.0, "second attempt: backoff 1 s with jitter"


@responses.activate
def test_retry_after_as_an_http_date(client, sleeps) -> None:
    when = format_datetime(datetime.now(UTC) + timedelta(seconds=5), usegmt=True)
    responses.get(f"{BASE}/pods", status=429, headers={"Retry-After": when})
    responses.get(f"{BASE}/pods", status=200, json={"pods": []})
    client.call("GET", "/pods", key=KEY)
    assert 3.5 <= sleeps[0] <= 6.0


@responses.activate
def test_a_long_retry_after_goes_back_to_the_caller(client, sleeps) -> None:
    responses.get(f"{BASE}/pods", status=429, headers={"Retry-After": "600"})
    with pytest.raises(RateLimited) as info:
        client.call("GET", "/pods", key=KEY)
    assert info.value.retry_after == 600 and sleeps == [] and len(responses.calls) == 1


@responses.activate
def test_persistent_429_and_5xx_give_up_after_the_policy(sleeps) -> None:
    client = ProviderHTTP(
        provider="vastai", base_url=BASE, retry=RetryPolicy(attempts=3), sleep=sleeps
    )
    responses.get(
        f"{BASE}/instances", status=429, body="API requests too frequent: endpoint threshold=2.0"
    )
    with pytest.raises(RateLimited, match="too frequent") as info:
        client.call("GET", "/instances", key=KEY)
    assert info.value.retry_after is None  # Vast sends no Retry-After: our backoff applies
    assert len(responses.calls) == 3 and len(sleeps) == 2

    responses.get(f"{BASE}/pods", status=503, body=HTML_502)
    with pytest.raises(TransientProviderError, match="502 Bad Gateway") as info5:
        client.call("GET", "/pods", key=KEY)
    assert "<html>" not in info5.value.message and not info5.value.maybe_applied


@pytest.mark.parametrize(
    ("status", "body", "error", "words"),
    [
        (
            401,
            {"title": "Unauthorized", "status": 401, "detail": "invalid api key"},
            InvalidCredentials,
            "invalid api key",
        ),
        (
            403,
            {"title": "Forbidden", "status": 403, "detail": "key lacks pods:write"},
            InvalidCredentials,
            "pods:write",
        ),
        (
            404,
            {"title": "Not Found", "status": 404, "detail": "pod not found"},
            InstanceNotFound,
            "pod not found",
        ),
        (422, PROBLEM_422, PermanentProviderError, "gpu.count must be >= 1"),
        (
            400,
            {
                "error": {
                    "code": "global/invalid-parameters",
                    "message": "Invalid region",
                    "suggestion": "Use us-east-1",
                }
            },
            PermanentProviderError,
            "global/invalid-parameters; Invalid region",
        ),
        (
            400,
            {"success": False, "error": "invalid_args", "msg": "offer id is required"},
            PermanentProviderError,
            "invalid_args; offer id is required",
        ),
    ],
)
@responses.activate
def test_client_errors_are_not_retried_and_say_what_the_provider_said(
    client, sleeps, status: int, body: dict, error: type, words: str
) -> None:
    responses.post(f"{BASE}/pods", status=status, json=body)
    with pytest.raises(error) as info:
        client.call("POST", "/pods", key=KEY, json={"name": "trainhub-x"})
    assert type(info.value) is error
    assert words in info.value.message
    assert info.value.message.startswith(f"runpod POST /pods returned HTTP {status}")
    assert (info.value.status, info.value.provider) == (status, "runpod")
    assert len(responses.calls) == 1 and sleeps == []


@responses.activate
def test_a_launch_is_not_repeated_after_a_5xx_it_may_have_acted_on(client, sleeps) -> None:
    responses.post(f"{BASE}/pods", status=502, body=HTML_502)
    with pytest.raises(TransientProviderError) as info:
        client.call("POST", "/pods", key=KEY, json={"name": "trainhub-x"})
    assert info.value.maybe_applied and len(responses.calls) == 1


@responses.activate
def test_a_launch_is_repeated_after_a_429(client, sleeps) -> None:
    responses.post(f"{BASE}/pods", status=429, headers={"Retry-After": "1"})
    responses.post(f"{BASE}/pods", status=201, json={"id": "pod-1", "status": "PROVISIONING"})
    assert client.call("POST", "/pods", key=KEY, json={}) == {
        "id": "pod-1",
        "status": "PROVISIONING",
    }
    assert len(responses.calls) == 2


@responses.activate
def test_idempotent_override_and_empty_bodies(client) -> None:
    responses.delete(f"{BASE}/pods/pod-1", status=204)
    assert client.call("DELETE", "/pods/pod-1", key=KEY) is None
    responses.post(f"{BASE}/ep/cancel/job-1", status=500, body="")
    responses.post(
        f"{BASE}/ep/cancel/job-1", status=200, json={"id": "job-1", "status": "CANCELLED"}
    )
    # Cancelling twice is harmless, so the caller marks it idempotent and it is retried.
    assert (
        client.call("POST", "/ep/cancel/job-1", key=KEY, idempotent=True)["status"] == "CANCELLED"
    )


@responses.activate
def test_the_key_and_query_string_never_reach_a_message(client) -> None:
    responses.get(f"{BASE}/instances", status=400, json={"msg": "bad filter"})
    with pytest.raises(PermanentProviderError) as info:
        client.call("GET", "/instances", key=KEY, params={"api_key": KEY, "q": "x"})
    assert KEY not in str(info.value) and "api_key" not in str(info.value)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_refused_connection_is_retried_even_for_a_launch(sleeps) -> None:
    client = ProviderHTTP(
        provider="runpod",
        base_url=f"http://127.0.0.1:{_closed_port()}",
        retry=RetryPolicy(attempts=3),
        sleep=sleeps,
    )
    with pytest.raises(TransientProviderError, match="no connection") as info:
        client.call("POST", "/pods", key=KEY, json={})
    assert not info.value.maybe_applied, "the request never left: nothing can have launched"
    assert len(sleeps) == 2


@pytest.fixture
def silent_server():
    """Accepts connections and reads requests, but never answers: a read timeout."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    held: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
                held.append(conn)
            except OSError:
                continue

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    server.close()


def test_a_read_timeout_stops_a_launch_but_a_read_is_retried(silent_server, sleeps) -> None:
    client = ProviderHTTP(
        provider="runpod",
        base_url=silent_server,
        timeout=(1.0, 0.3),
        retry=RetryPolicy(attempts=2),
        sleep=sleeps,
    )
    with pytest.raises(TransientProviderError, match="no answer") as info:
        client.call("POST", "/pods", key=KEY, json={})
    assert info.value.maybe_applied and sleeps == []

    with pytest.raises(TransientProviderError, match="no answer"):
        client.call("GET", "/pods", key=KEY)
    assert len(sleeps) == 1


@responses.activate
def test_the_limiter_is_asked_before_every_attempt(sleeps) -> None:
    asked: list[str] = []

    class Recorder:
        def acquire(self, bucket: str) -> None:
            asked.append(bucket)

    client = ProviderHTTP(provider="runpod", base_url=BASE, limiter=Recorder(), sleep=sleeps)
    responses.get(f"{BASE}/ep/status/j", status=429, headers={"Retry-After": "0"})
    responses.get(f"{BASE}/ep/status/j", status=200, json={"status": "IN_QUEUE"})
    client.call("GET", "/ep/status/j", key=KEY, bucket="status")
    assert asked == ["status", "status"]
