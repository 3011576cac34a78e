"""deploy/nginx.conf, run by a real nginx exactly as shipped (devsupport/front_proxy.py) in front
of the web side (Django's live server) and the stream process (the Procfile's line): one base
URL serves the API, completions relayed without a redirect, and the live streams; bodies over
the caps docs/SECURITY.md sets are refused at the door, before trainhub reads them."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import openai
import pytest
from httpx_sse import connect_sse
from websockets.asyncio.client import connect

from devsupport.front_proxy import front_proxy, nginx_missing_reason
from jobs.models import InferenceCall
from jobs.services.accounts.projects import api_key_create
from jobs.services.core.events import event_append
from jobs.services.serving.servers import server_register
from tests.support.fakes.inference_server import WORDS, FakeInferenceServer, fake_inference_server

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(nginx_missing_reason() is not None, reason=str(nginx_missing_reason())),
]
BASE_MODEL = "acme/door-llama"


@pytest.fixture
def upstream() -> Iterator[FakeInferenceServer]:
    with fake_inference_server() as server:
        yield server


@pytest.fixture
def door(live_server, stream_server, tmp_path: Path) -> Iterator[str]:
    """The front door's base URL."""
    web, stream = urlsplit(live_server.url).netloc, urlsplit(stream_server.url).netloc
    with front_proxy(web, stream, tmp_path / "nginx") as proxy:
        yield proxy.url


@pytest.fixture
def raw_key(user) -> str:
    return api_key_create(user=user, name="door")[1]


def test_the_openai_sdk_uses_one_base_url_and_completions_are_never_redirected(
    door, upstream, raw_key
) -> None:
    server_register(name="door", url=upstream.url, base_model=BASE_MODEL, served_name="door-llama",
                    api_key=None)  # fmt: skip
    answered: list[int] = []
    hooks = {"response": [lambda r: answered.append(r.status_code)]}
    http = openai.DefaultHttpxClient(event_hooks=hooks)  # the SDK's own HTTP client, watched
    client = openai.OpenAI(base_url=door + "/v1", api_key=raw_key, max_retries=0, http_client=http)

    assert BASE_MODEL in [m.id for m in client.models.list()]  # the web process
    question = [{"role": "user", "content": "Which colour are owls?"}]
    whole = client.chat.completions.create(model=BASE_MODEL, messages=question)
    stream = client.chat.completions.create(
        model=BASE_MODEL, messages=question, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)

    assert whole.choices[0].message.content == "".join(WORDS) and whole.model == BASE_MODEL
    assert "".join(c.choices[0].delta.content for c in chunks if c.choices) == "".join(WORDS)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 3
    assert answered == [200, 200, 200], "no 307: the door sent completions to the stream process"
    assert [b["model"] for b in upstream.bodies] == ["door-llama", "door-llama"]
    assert InferenceCall.objects.filter(model=BASE_MODEL, status_code=200).count() == 2


def test_a_job_s_events_stream_and_its_socket_go_to_the_stream_process(
    door, make_job, raw_key
) -> None:
    job = make_job()
    last = event_append(job=job, type="log", message="through the door", data={}).number
    bearer = {"Authorization": f"Bearer {raw_key}"}
    route = f"{door}/v1/fine_tuning/jobs/{job.public_id}/events"

    page = httpx.get(route, headers=bearer, timeout=30)  # the web process: a JSON page
    assert page.status_code == 200 and page.headers["content-type"].startswith("application/json")
    assert "through the door" in [e["message"] for e in page.json()["data"]]

    with httpx.Client(timeout=30) as client, connect_sse(
        client, "GET", route, params={"stream": "true"}, headers=bearer
    ) as sse:  # fmt: skip
        assert sse.response.headers["content-type"].startswith("text/event-stream")
        seen = []
        for event in sse.iter_sse():  # unbuffered: each event arrives as it is written
            seen.append(json.loads(event.data))
            if int(event.id) == last:
                break
    assert "through the door" in [e["message"] for e in seen]

    async def socket_says() -> dict:
        ws_url = door.replace("http://", "ws://") + f"/ws/jobs/{job.public_id}"
        async with connect(ws_url, additional_headers=bearer) as ws:
            while True:
                message = json.loads(await asyncio.wait_for(ws.recv(), 20))
                if message.get("seq") == last:
                    return message

    assert asyncio.run(socket_says())["data"]["message"] == "through the door"


def test_bodies_over_the_caps_are_refused_at_the_door(door, stream_server, raw_key) -> None:
    bearer = {"Authorization": f"Bearer {raw_key}", "Content-Type": "application/json"}
    logged_before = stream_server.log.stat().st_size
    big = b'{"model": "x", "messages": [], "pad": "' + b"a" * (5 * 1024 * 1024) + b'"}'
    huge = b"{" + b" " * (12 * 1024 * 1024) + b"}"
    for path, body in (("/v1/chat/completions", big), ("/api/v1/chat/completions", big),
                       ("/v1/fine_tuning/jobs", huge)):  # fmt: skip
        refused = httpx.post(door + path, content=body, headers=bearer, timeout=30)
        assert refused.status_code == 413
        error = refused.json()["error"]
        assert error["code"] == "body_too_large" and f"larger than {path} takes" in error["message"]
    with stream_server.log.open("rb") as log:
        log.seek(logged_before)
        assert b"/v1/chat/completions" not in log.read(), "it never reached the stream process"
