"""gpu_worker.transfer against a real HTTP server on loopback, and file:// URLs."""

from __future__ import annotations

import base64
import hashlib
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import responses

from gpu_worker import transfer
from gpu_worker.errors import Cancelled, ExecutorError

BODY = bytes(range(256)) * 9000  # ~2.3 MB: several download chunks


class Server:
    """Serves ``objects`` by path; ``failures[path]`` = status codes to answer first."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.failures: dict[str, list[int]] = {}
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _fail(self) -> bool:
                path = self.path.split("?")[0]
                owner.requests.append((self.command, self.path, dict(self.headers)))
                pending = owner.failures.get(path)
                if pending:
                    code = pending.pop(0)
                    body = b"try again later"
                    self.send_response(code)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return True
                return False

            def do_GET(self) -> None:
                if self._fail():
                    return
                data = owner.objects.get(self.path.split("?")[0])
                if data is None:
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_PUT(self) -> None:
                length = int(self.headers["Content-Length"])
                data = self.rfile.read(length)
                if self._fail():
                    return
                owner.objects[self.path.split("?")[0]] = data
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[Server]:
    monkeypatch.setattr(transfer, "BACKOFF_SECONDS", 0.0)
    srv = Server()
    thread = threading.Thread(target=srv.httpd.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.httpd.shutdown()
    srv.httpd.server_close()


def test_download_verifies_sha256_and_retries_5xx(server: Server, tmp_path: Path) -> None:
    server.objects["/data.jsonl"] = BODY
    server.failures["/data.jsonl"] = [503, 502]
    dest = tmp_path / "sub" / "data.jsonl"
    size = transfer.download(
        f"{server.url}/data.jsonl?sig=abc", dest, sha256=hashlib.sha256(BODY).hexdigest()
    )
    assert size == len(BODY) and dest.read_bytes() == BODY
    assert [r[0] for r in server.requests] == ["GET"] * 3
    assert list(dest.parent.iterdir()) == [dest]  # no temporary file left behind


def test_download_sha256_mismatch_names_both_and_keeps_nothing(
    server: Server, tmp_path: Path
) -> None:
    server.objects["/data.jsonl"] = BODY
    dest = tmp_path / "data.jsonl"
    with pytest.raises(ExecutorError) as info:
        transfer.download(f"{server.url}/data.jsonl?sig=abc", dest, sha256="a" * 64, what="dataset")
    assert info.value.reason == "download_failed"
    assert f"expected {'a' * 64}" in info.value.message
    assert f"got {hashlib.sha256(BODY).hexdigest()}" in info.value.message
    assert "sig=abc" not in info.value.message
    assert not any(tmp_path.iterdir())
    assert len(server.requests) == 1  # a wrong hash is not retried


def test_download_4xx_fails_at_once_with_a_hint(server: Server, tmp_path: Path) -> None:
    server.failures["/x"] = [403]
    with pytest.raises(ExecutorError) as info:
        transfer.download(f"{server.url}/x?X-Amz-Signature=s3cr3t", tmp_path / "x")
    assert info.value.reason == "download_failed"
    assert "HTTP 403" in info.value.message and "expired" in info.value.message
    assert "s3cr3t" not in info.value.message
    assert len(server.requests) == 1


def test_download_gives_up_after_the_attempts(server: Server, tmp_path: Path) -> None:
    server.objects["/x"] = b"x"
    server.failures["/x"] = [500] * 10
    with pytest.raises(ExecutorError, match=r"after 3 attempts.*HTTP 500"):
        transfer.download(f"{server.url}/x", tmp_path / "x", attempts=3)
    assert len(server.requests) == 3


def test_download_stops_between_chunks_when_asked(server: Server, tmp_path: Path) -> None:
    server.objects["/big"] = BODY
    with pytest.raises(Cancelled):
        transfer.download(f"{server.url}/big", tmp_path / "big", should_stop=lambda: True)
    assert not any(tmp_path.iterdir())


def test_upload_puts_the_file_with_a_length_and_retries(server: Server, tmp_path: Path) -> None:
    src = tmp_path / "bundle.tar"
    src.write_bytes(BODY)
    server.failures["/out/bundle.tar"] = [500]
    assert transfer.upload(
        src, f"{server.url}/out/bundle.tar?sig=1", content_type="application/x-tar"
    ) == len(BODY)
    assert server.objects["/out/bundle.tar"] == BODY
    method, _, headers = server.requests[-1]
    assert method == "PUT"
    assert headers["Content-Length"] == str(len(BODY))
    assert headers["Content-Type"] == "application/x-tar"
    assert "Transfer-Encoding" not in headers  # S3 presigned PUTs reject chunked bodies


def test_upload_4xx_is_upload_failed(server: Server, tmp_path: Path) -> None:
    src = tmp_path / "f"
    src.write_bytes(b"abc")
    server.failures["/f"] = [403]
    with pytest.raises(ExecutorError) as info:
        transfer.upload(src, f"{server.url}/f?sig=zzz")
    assert info.value.reason == "upload_failed" and "HTTP 403" in info.value.message
    assert "zzz" not in info.value.message


def test_a_sealed_upload_fails_at_once_saying_so(server: Server, tmp_path: Path) -> None:
    src = tmp_path / "f"
    src.write_bytes(b"abc")
    server.failures["/f"] = [409, 409]
    with pytest.raises(ExecutorError) as info:
        transfer.upload(src, f"{server.url}/f?t=zzz")
    assert "HTTP 409" in info.value.message and "sealed" in info.value.message
    assert server.failures["/f"] == [409], "a closed upload is not retried"


def test_file_urls_both_ways(tmp_path: Path) -> None:
    src = tmp_path / "a b.bin"  # a space: the URL is percent-encoded
    src.write_bytes(BODY)
    target = tmp_path / "deep" / "dir" / "copy.bin"
    assert transfer.upload(src, target.as_uri()) == len(BODY)
    assert target.read_bytes() == BODY
    back = tmp_path / "back.bin"
    transfer.download(src.as_uri(), back, sha256=hashlib.sha256(BODY).hexdigest())
    assert back.read_bytes() == BODY
    with pytest.raises(ExecutorError) as info:
        transfer.download((tmp_path / "missing").as_uri(), tmp_path / "m")
    assert info.value.reason == "download_failed"
    with pytest.raises(ExecutorError) as info:
        transfer.download("file://otherhost/etc/passwd", tmp_path / "p")
    assert "must be local" in info.value.message


def test_redact_and_scrub() -> None:
    url = "https://bucket.s3.amazonaws.com/a/b.tar?X-Amz-Credential=AK&X-Amz-Signature=ff"
    assert transfer.redact(url) == "https://bucket.s3.amazonaws.com/a/b.tar"
    text = (
        f"Max retries exceeded with url: /a/b.tar?X-Amz-Credential=AK&X-Amz-Signature=ff (x) {url}"
    )
    scrubbed = transfer.scrub(text, url)
    assert "Signature" not in scrubbed and "AK" not in scrubbed and "/a/b.tar" in scrubbed


# --- S3's integrity answers (payloads as S3 documents them) -----------------------------------

S3_PUT_URL = (
    "https://trainhub-bucket.s3.us-east-1.amazonaws.com/projects/1/jobs/ftjob-x/a1/adapter.tar"
)
S3_BAD_DIGEST = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>BadDigest</Code><Message>The '
    b"Content-MD5 you specified did not match what we received.</Message><ExpectedDigest>"
    b"a4e1b9ab6d7f8ac2a3c2d1e0f9e8d7c6</ExpectedDigest><CalculatedDigest>"
    b"0f1e2d3c4b5a69788796a5b4c3d2e1f0</CalculatedDigest><RequestId>4442587FB7D0A2F9"
    b"</RequestId><HostId>hostid</HostId></Error>"
)
S3_INVALID_ARGUMENT = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>InvalidArgument</Code><Message>'
    b"Invalid argument.</Message><RequestId>4442587FB7D0A2F9</RequestId></Error>"
)


@responses.activate
def test_upload_sends_content_md5_and_resends_after_bad_digest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(transfer, "BACKOFF_SECONDS", 0.0)
    src = tmp_path / "adapter.tar"
    src.write_bytes(BODY)
    url = S3_PUT_URL + "?X-Amz-Signature=abc&X-Amz-Expires=600"
    responses.put(S3_PUT_URL, status=400, body=S3_BAD_DIGEST, content_type="application/xml")
    responses.put(S3_PUT_URL, status=200)

    assert transfer.upload(src, url, what="bundle") == len(BODY)

    md5 = base64.b64encode(hashlib.md5(BODY, usedforsecurity=False).digest()).decode()
    assert [c.request.headers["Content-MD5"] for c in responses.calls] == [md5, md5]
    assert all(c.request.headers["Content-Length"] == str(len(BODY)) for c in responses.calls)


@responses.activate
def test_other_s3_400s_fail_at_once_without_quoting_the_signature(tmp_path: Path) -> None:
    src = tmp_path / "adapter.tar"
    src.write_bytes(b"x")
    responses.put(S3_PUT_URL, status=400, body=S3_INVALID_ARGUMENT)
    with pytest.raises(ExecutorError, match="HTTP 400") as info:
        transfer.upload(src, S3_PUT_URL + "?X-Amz-Signature=secret-sig", what="bundle")
    assert len(responses.calls) == 1
    assert "secret-sig" not in str(info.value)
