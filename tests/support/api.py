"""Assertions on the API's public shapes (DESIGN "API conventions"), shared by the test_api_* modules."""

from __future__ import annotations

import io
import time
from dataclasses import dataclass
from typing import Any

import requests
from requests.structures import CaseInsensitiveDict
from rest_framework.test import APIClient

ERROR_TYPES = {
    "invalid_request_error",
    "authentication_error",
    "permission_error",
    "not_found_error",
    "rate_limit_error",
    "server_error",
}


def assert_error(
    response: Any,
    status: int,
    *,
    param: str | type[Ellipsis] | None = ...,
    code: str | type[Ellipsis] | None = ...,
) -> dict[str, Any]:
    """The response is ``{"error": {"message", "type", "param", "code"}}`` with ``status``."""
    assert response.status_code == status, (response.status_code, response.content[:500])
    assert response["Content-Type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"error"}, body
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and error["message"], error
    assert error["type"] in ERROR_TYPES, error
    if param is not ...:
        assert error["param"] == param, error
    if code is not ...:
        assert error["code"] == code, error
    return error


def assert_list(response: Any, *, has_more: bool | None = None) -> list[dict[str, Any]]:
    assert response.status_code == 200, (response.status_code, response.content[:500])
    body = response.json()
    assert set(body) == {"object", "data", "has_more"}, body
    assert body["object"] == "list"
    assert isinstance(body["data"], list)
    assert isinstance(body["has_more"], bool)
    if has_more is not None:
        assert body["has_more"] is has_more, body["has_more"]
    return body["data"]


def assert_unix_seconds(value: object, *, nullable: bool = False) -> None:
    if nullable and value is None:
        return
    assert isinstance(value, int) and not isinstance(value, bool), value
    # Seconds, not milliseconds: within a day of now.
    assert abs(value - time.time()) < 86400, value


def upload(
    client: APIClient, content: bytes, *, filename: str = "data.jsonl", **fields: str
) -> Any:
    handle = io.BytesIO(content)
    handle.name = filename
    return client.post("/api/v1/files/", {"file": handle, **fields}, format="multipart")


@dataclass(frozen=True)
class Downloaded:
    status: int
    sha256_header: str | None  # X-Checksum-SHA256, from the API's own response
    body: bytes
    headers: CaseInsensitiveDict  # HTTP header names are case-insensitive (moto sends lowercase)
    redirected: bool


def download(api: APIClient, artifact_id: str, byte_range: str | None = None) -> Downloaded:
    """GET an artifact's download route as a client does: a redirect (S3) is followed with the
    same Range header and without the API key, as curl -L and requests do across hosts."""
    extra = {"HTTP_RANGE": f"bytes={byte_range}"} if byte_range else {}
    resp = api.get(f"/api/v1/artifacts/{artifact_id}/download/", **extra)
    if resp.status_code == 302:
        headers = {"Range": f"bytes={byte_range}"} if byte_range else {}
        followed = requests.get(resp["Location"], headers=headers, timeout=30)
        return Downloaded(
            followed.status_code,
            resp.get("X-Checksum-SHA256"),
            followed.content,
            followed.headers,
            redirected=True,
        )
    body = b"".join(resp.streaming_content) if resp.streaming else resp.content
    return Downloaded(
        resp.status_code,
        resp.get("X-Checksum-SHA256"),
        body,
        CaseInsensitiveDict(resp.items()),
        redirected=False,
    )
