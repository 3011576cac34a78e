"""The completions routes at their two doors: the web side answers with a 307 carrying a grant
for the caller's key (and refuses what is not a project key), and the stream process refuses
forged, expired or missing grants and keys, bad bodies and other projects' models before
anything reaches an inference server. The whole path, with a server, is
tests/e2e/test_inference.py."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from unittest import mock
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from django.core import signing

from api.inference_grant import GRANT_SALT, grant_for
from api.live.auth import RECHECK_SECONDS
from jobs.models import ApiKey, InferenceCall, InferenceServer
from jobs.services.accounts.projects import api_key_revoke
from jobs.services.serving.servers import server_register
from tests.support.api import assert_error
from tests.support.fakes.inference_server import WORDS, fake_inference_server

pytestmark = [pytest.mark.django_db(transaction=True)]
ASK = {"model": "ft:acme/tiny-llama:p::x", "messages": [{"role": "user", "content": "hi"}]}


def test_the_web_side_redirects_a_key_s_completion_with_a_grant_for_that_key(
    api, settings, user, client
) -> None:
    settings.TRAINHUB_STREAM_URL = "http://stream.example:8001/"
    answer = api.post("/v1/chat/completions", ASK, format="json")

    assert answer.status_code == 307
    location = urlsplit(answer["Location"])
    assert (location.netloc, location.path) == ("stream.example:8001", "/v1/chat/completions")
    grant = signing.loads(parse_qs(location.query)["grant"][0], salt=GRANT_SALT, max_age=60)
    pk = grant["key"]
    assert ApiKey.objects.get(pk=pk).user == user
    assert api.post("/v1/completions", ASK, format="json")["Location"].startswith(
        "http://stream.example:8001/v1/completions?grant="
    )

    client.force_login(user)  # a browser session is not a project key
    assert_error(client.post("/v1/chat/completions", ASK, content_type="application/json"), 403,
                 code="api_key_required")  # fmt: skip
    settings.TRAINHUB_STREAM_URL = ""
    assert_error(api.post("/v1/chat/completions", ASK, format="json"), 503, code="stream_url_unset")


def test_the_stream_process_refuses_before_any_server_is_called(
    stream_server, key_of, make_user
) -> None:
    alice = make_user("alice-relay")
    raw = key_of(alice)
    key = ApiKey.objects.get(user=alice)
    url = stream_server.url + "/v1/chat/completions"

    def post(**kwargs: object) -> httpx.Response:
        return httpx.post(url, timeout=30, **kwargs)  # type: ignore[arg-type]

    with mock.patch("django.core.signing.time.time", return_value=time.time() - 120):
        expired = grant_for(key)  # made two minutes ago: past its 60 s
    forged = signing.dumps({"key": key.pk}, salt="another.salt")
    for refused in (post(json=ASK), post(json=ASK, headers={"Authorization": "Bearer th-nope"}),
                    post(json=ASK, params={"grant": forged}),
                    post(json=ASK, params={"grant": expired})):  # fmt: skip
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
    bearer = {"Authorization": f"Bearer {raw}"}
    assert post(content=b"{oops", headers=bearer).status_code == 400
    assert post(json={"messages": []}, headers=bearer).json()["error"]["param"] == "model"
    grant = grant_for(key)
    unknown = post(json=ASK, params={"grant": grant})
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
    assert post(json=ASK, params={"grant": grant}).status_code == 401, "a grant is used once"
    assert httpx.get(url, headers=bearer).status_code == 405
    pending = grant_for(key)
    api_key_revoke(key=key)
    assert post(json=ASK, params={"grant": pending}).status_code == 401, "a revoked key's grant"


class _CutOff(BaseHTTPRequestHandler):
    """An inference server that streams two chunks of an answer and then drops the connection."""

    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for word in ("Owl ", "one "):
            chunk = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "cut",
                     "choices": [{"index": 0, "delta": {"content": word}, "finish_reason": None}]}  # fmt: skip
            data = f"data: {json.dumps(chunk)}\n\n".encode()
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()
        self.connection.shutdown(socket.SHUT_RDWR)  # no last chunk, no [DONE]: cut off


def test_a_stream_cut_off_by_its_server_ends_with_an_error_event_and_the_server_is_taken_out(
    stream_server, key_of, make_user
) -> None:
    upstream = ThreadingHTTPServer(("127.0.0.1", 0), _CutOff)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    try:
        server = server_register(name="cut", url=f"http://127.0.0.1:{upstream.server_port}",
                                 base_model="acme/cut-llama", served_name="cut", api_key=None)  # fmt: skip
        raw = key_of(make_user("carol-relay"))
        body = {"model": "acme/cut-llama", "stream": True,
                "messages": [{"role": "user", "content": "hi"}]}  # fmt: skip
        with httpx.stream("POST", stream_server.url + "/v1/chat/completions", json=body,
                          headers={"Authorization": f"Bearer {raw}"}, timeout=30) as answer:  # fmt: skip
            assert answer.status_code == 200
            events = [line.removeprefix("data: ") for line in answer.iter_lines()
                      if line.startswith("data: ")]  # fmt: skip
    finally:
        upstream.shutdown()
        upstream.server_close()
    said = [json.loads(e) for e in events]
    assert [c["choices"][0]["delta"]["content"] for c in said[:2]] == ["Owl ", "one "]
    assert said[0]["model"] == "acme/cut-llama", "the caller's name for the model"
    assert len(said) == 3 and said[2]["error"]["code"] == "server_unavailable"
    assert "[DONE]" not in events, "a cut answer never looks finished"
    server.refresh_from_db()
    assert server.status == "offline" and "broke off" in server.status_detail
    (call,) = InferenceCall.objects.all()
    assert (call.model, call.status_code, call.streamed) == ("acme/cut-llama", 0, True)
    assert call.server_id == server.pk and call.first_token_ms is not None
    assert call.project_id == ApiKey.objects.get(user__username="carol-relay").project_id


def test_a_revoked_key_stops_reaching_models_within_the_recheck_interval(
    stream_server, key_of, make_user
) -> None:
    """The stream process remembers a live key for RECHECK_SECONDS (api/live/auth.py): revoked,
    it is refused once that has passed, as its open streams are closed."""
    with fake_inference_server() as upstream:
        server_register(name="revoke", url=upstream.url, base_model="acme/revoke-llama",
                        served_name="revoke", api_key=None)  # fmt: skip
        raw = key_of(make_user("dave-relay"))
        ask = {"model": "acme/revoke-llama", "messages": [{"role": "user", "content": "hi"}]}
        url, bearer = stream_server.url + "/v1/chat/completions", {"Authorization": f"Bearer {raw}"}
        assert httpx.post(url, json=ask, headers=bearer, timeout=30).status_code == 200
        api_key_revoke(key=ApiKey.objects.get(user__username="dave-relay"))
        revoked_at = time.monotonic()
        while (answer := httpx.post(url, json=ask, headers=bearer, timeout=30)).status_code == 200:
            assert time.monotonic() - revoked_at < RECHECK_SECONDS + 5, "still answered"
            time.sleep(0.2)
    assert answer.status_code == 401 and answer.json()["error"]["code"] == "invalid_api_key"


def test_a_remembered_route_its_server_no_longer_answers_for_is_routed_again_in_the_call(
    stream_server, key_of, make_user
) -> None:
    """Where a model is served is remembered for ROUTE_SECONDS; a server that answers 404 for it
    (it unloaded the adapter, it serves something else now) sends the call back to the database,
    which names the server that has it, within the same call."""
    with fake_inference_server() as old, fake_inference_server() as new:
        first = server_register(name="old", url=old.url, base_model="acme/moving-llama",
                                served_name="moving", api_key=None)  # fmt: skip
        raw = key_of(make_user("erin-relay"))
        ask = {"model": "acme/moving-llama", "stream": True,
               "messages": [{"role": "user", "content": "hi"}]}  # fmt: skip
        url, bearer = stream_server.url + "/v1/chat/completions", {"Authorization": f"Bearer {raw}"}
        assert httpx.post(url, json=ask, headers=bearer, timeout=30).status_code == 200

        InferenceServer.objects.filter(pk=first.pk).update(status="offline")
        server_register(name="new", url=new.url, base_model="acme/moving-llama",
                        served_name="moving", api_key=None)  # fmt: skip
        old.gone.add("moving")
        answer = httpx.post(url, json=ask, headers=bearer, timeout=30)

    assert answer.status_code == 200 and "".join(WORDS) in "".join(
        json.loads(line.removeprefix("data: "))["choices"][0]["delta"].get("content", "")
        for line in answer.text.splitlines()
        if line.startswith("data: {") and '"choices": [{' in line
    )
    assert len(old.bodies) == 2 and len(new.bodies) == 1, "asked the old once more, then the new"
    assert InferenceCall.objects.filter(model="acme/moving-llama", status_code=200).count() == 2


def test_completions_that_end_together_are_recorded_in_one_write(project, monkeypatch) -> None:
    """The relay's Recorder: twenty answers ending at once cost a few database writes, not
    twenty in a row on the stream process's one database thread, and every one is recorded
    (with its usage) before the recorder lets its answer end."""
    from api.live import inference

    server = server_register(name="rec", url="http://127.0.0.1:9", base_model="acme/rec-llama",
                             served_name="rec", api_key=None)  # fmt: skip
    writes: list[int] = []
    write = inference._calls_record

    async def counted(batch: list) -> None:
        writes.append(len(batch))
        await write(batch)

    monkeypatch.setattr(inference, "_calls_record", counted)
    recorder = inference.Recorder()
    route = inference.Route(server.url, {}, "rec", None, server.pk)
    usage = {"prompt_tokens": 4, "completion_tokens": 7}

    async def twenty_end_at_once() -> None:
        calls = [inference._Call(project.pk, "acme/rec-llama", True, began=time.monotonic())
                 for _ in range(20)]  # fmt: skip
        await asyncio.gather(*(recorder.record(route, call, 200, usage) for call in calls))

    asyncio.run(twenty_end_at_once())
    assert sum(writes) == 20 and len(writes) <= 2, writes  # one write, or the first and the rest
    recorded = InferenceCall.objects.filter(model="acme/rec-llama", project=project)
    assert recorded.count() == 20 and {c.completion_tokens for c in recorded} == {7}


def test_a_relay_with_every_slot_taken_refuses_with_retry_after_and_gives_back_its_slots(
    user, key_of
) -> None:
    """Past MAX_IN_FLIGHT completions at once the next is a 503 that OpenAI's SDK retries after
    Retry-After, not a wait; a call that ends, however it ends, gives its slot back."""
    from api.live import inference

    relay = inference.InferenceRelay()
    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions",
             "query_string": b"", "headers": [(b"authorization", f"Bearer {key_of(user)}".encode())]}  # fmt: skip

    async def call() -> tuple[dict, dict]:
        sent: list[dict] = []

        async def receive() -> dict:
            return {"type": "http.request", "body": json.dumps(ASK).encode()}

        async def send(message: dict) -> None:
            sent.append(message)

        await relay(scope, receive, send)
        return sent[0], json.loads(sent[-1]["body"])

    relay._in_flight = inference.MAX_IN_FLIGHT
    start, body = asyncio.run(call())
    assert start["status"] == 503 and (b"retry-after", b"1") in start["headers"]
    assert body["error"]["code"] == "relay_busy"

    relay._in_flight = inference.MAX_IN_FLIGHT - 1
    start, body = asyncio.run(call())  # admitted: then refused for its model, which no one serves
    assert start["status"] == 404 and body["error"]["code"] == "model_not_found"
    assert relay._in_flight == inference.MAX_IN_FLIGHT - 1, "the refused call gave its slot back"
