"""The completions routes at their two doors: the web side answers with a 307 carrying a grant
for the caller's key (and refuses what is not a project key), and the stream process refuses
forged, expired or missing grants and keys, bad bodies and other projects' models before
anything reaches an inference server. The whole path, with a server, is
tests/e2e/test_inference.py."""

from __future__ import annotations

import time
from unittest import mock
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from django.core import signing

from api.inference_grant import GRANT_SALT, grant_for
from jobs.models import ApiKey
from jobs.services.accounts.projects import api_key_revoke
from tests.support.api import assert_error

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
