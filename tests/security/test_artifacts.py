"""Verified bytes are immutable (docs/SECURITY.md): upload URLs outlive their attempt, so what
they can still write is never what is served or resumed from. Plus the transfer route's edges:
an absurd Range, and the signed token kept out of the web server's access log.

Every upload goes through the real path: the executor's own client against the control plane's
transfer route (live_server) or S3 (moto's server), on both storage backends.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs, quote, urlsplit

import pytest
import requests
from django.core.handlers.wsgi import WSGIHandler
from django.core.servers.basehttp import ThreadedWSGIServer, WSGIRequestHandler

from devsupport.processes import free_port
from devsupport.readiness import wait_http_ready
from gpu_worker import transfer as client
from jobs import storage
from jobs.models import JobAttempt, TrainingJob
from jobs.services.core import specs
from jobs.services.core.artifacts import artifact_ingest
from jobs.services.core.attempts import attempt_end, attempt_start
from jobs.states import EndReason
from tests.support.api import assert_error, download
from tests.support.processes import procfile_command

ROOT = Path(__file__).resolve().parents[2]
EVIL = b"replacement bytes from a replayed URL " * 1000


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def read(key: str) -> bytes:
    return b"".join(storage.read_chunks(key))


def put(url: str, data: bytes) -> requests.Response:
    return requests.put(url, data=data, headers={"Content-Type": "application/x-tar"}, timeout=30)


def refused_or_ignored(resp: requests.Response, storage_backend: str) -> None:
    """The local route refuses a PUT to a sealed upload. An S3 presigned PUT cannot be revoked:
    S3 takes the bytes into the upload key, which nothing reads any more."""
    if storage_backend == "local":
        assert (resp.status_code, resp.json()["error"]["code"]) == (409, "upload_closed")
    else:
        assert resp.status_code == 200, resp.text


@pytest.fixture
def control_url(settings) -> Iterator[str]:
    """The control plane's WSGI app over real HTTP on loopback, for the transfer route. Not
    live_server: that needs a transactional database, which runs the fixtures' on-commit sends
    at once. The transfer route touches no database, so a plain threaded server does."""
    server = ThreadedWSGIServer(("127.0.0.1", 0), WSGIRequestHandler, allow_reuse_address=False)
    server.set_app(WSGIHandler())
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    settings.TRAINHUB_CONTROL_URL = url
    try:
        yield url
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def test_a_replayed_adapter_put_after_ingest_changes_nothing_served(
    finalizing, api, control_url, storage_backend: str, tmp_path: Path
) -> None:
    _, attempt, bundle, bundle_sha = finalizing
    artifact_url = specs.attempt_spec(attempt)["outputs"]["artifact_url"]
    src = tmp_path / "adapter.tar"
    src.write_bytes(bundle)
    client.upload(src, artifact_url, what="adapter bundle", content_type="application/x-tar")
    artifact = artifact_ingest(attempt_pk=attempt.pk, reported_sha256=bundle_sha)
    assert artifact is not None
    assert download(api, artifact.public_id).body == bundle

    refused_or_ignored(put(artifact_url, EVIL), storage_backend)

    assert artifact_ingest(attempt_pk=attempt.pk, reported_sha256=sha(EVIL)) is None
    got = download(api, artifact.public_id)
    assert (got.status, got.body) == (200, bundle)
    assert got.sha256_header == sha(got.body) == bundle_sha
    assert read(artifact.storage_key) == bundle


def _next_attempt(job: TrainingJob, previous: JobAttempt | None = None) -> JobAttempt:
    if previous is not None:  # lost: the job goes back to the queue for another attempt
        assert attempt_end(attempt=previous, reason=EndReason.WORKER_LOST)
    return attempt_start(job=TrainingJob.objects.get(pk=job.pk), target="local")


def test_an_old_attempts_checkpoint_url_cannot_change_what_later_attempts_resume_from(
    make_job, sent, control_url, storage_backend: str, tmp_path: Path
) -> None:
    job = make_job()
    first = _next_attempt(job)
    old_url = specs.attempt_spec(first)["outputs"]["checkpoint_url"]
    good = b"attempt 1's checkpoint " * 1000
    (tmp_path / "ckpt.tar").write_bytes(good)
    client.upload(tmp_path / "ckpt.tar", old_url, what="checkpoint")

    second = _next_attempt(job, first)
    resume_url = specs.attempt_spec(second)["outputs"]["resume_url"]
    assert resume_url is not None

    refused_or_ignored(put(old_url, EVIL), storage_backend)

    got = tmp_path / "resumed.tar"
    client.download(resume_url, got, sha256=sha(good), what="checkpoint")
    # Attempt 2 wrote no checkpoint, so attempt 3 resumes from attempt 1's too: the same bytes,
    # not what the old URL put back into attempt 1's upload key.
    third = _next_attempt(job, second)
    again = specs.attempt_spec(third)["outputs"]["resume_url"]
    assert again is not None
    client.download(again, tmp_path / "again.tar", sha256=sha(good), what="checkpoint")
    sealed = storage.sealed_key(storage.checkpoint_key(job.project_id, job.public_id, 1))
    assert read(sealed) == good


def test_a_range_of_5000_digits_is_416_not_500(ingested, api, control_url) -> None:
    _, artifact, bundle = ingested
    huge = "bytes=" + "9" * 5000 + "-"
    url = storage.transfer_url(artifact.storage_key, "GET", ttl_seconds=60)

    over_transfer = requests.get(url, headers={"Range": huge}, timeout=10)
    over_api = api.get(f"/api/v1/artifacts/{artifact.public_id}/download/", HTTP_RANGE=huge)

    assert (over_transfer.status_code, over_transfer.json()["error"]["code"]) == (
        416,
        "invalid_range",
    )
    assert_error(over_api, 416, code="invalid_range")
    assert read(artifact.storage_key) == bundle


def _procfile_web(port: int, access_log: Path) -> list[str]:
    """The Procfile's ``web`` command, with the access log that a deployment turns on written
    to a file."""
    argv = procfile_command("web", port)
    assert argv[2] == "gunicorn"
    return [*argv, "--workers", "1", "--access-logfile", str(access_log)]


@pytest.mark.parametrize(
    "operator_format",
    [None, "%(r)s %(s)s q=%(q)s ref=%(f)s raw=%({raw_uri}e)s qs=%({query_string}e)s"],
    ids=["procfile", "operator-format"],
)
def test_the_web_access_log_never_holds_a_transfer_token(
    db, settings, tmp_path: Path, operator_format: str | None
) -> None:
    key = storage.bundle_key(1, "ftjob-logged", 1)
    storage.save_stream(key, [b"object bytes"])
    port = free_port()
    settings.TRAINHUB_CONTROL_URL = f"http://127.0.0.1:{port}"
    url = storage.transfer_url(key, "GET", ttl_seconds=300)
    token = parse_qs(urlsplit(url).query)["t"][0]
    access_log, out = tmp_path / "access.log", tmp_path / "gunicorn.log"
    env = {
        **os.environ,
        "DJANGO_SECRET_KEY": settings.SECRET_KEY,  # so the URL signed here is valid there
        "TRAINHUB_STORAGE": "local",
        "TRAINHUB_STORAGE_DIR": str(settings.TRAINHUB_STORAGE_DIR),
    }
    if operator_format is not None:  # gunicorn reads these after the config file
        env["GUNICORN_CMD_ARGS"] = f"--access-logformat={shlex.quote(operator_format)}"
    with out.open("wb") as sink:
        proc = subprocess.Popen(
            _procfile_web(port, access_log), cwd=ROOT, env=env, stdout=sink, stderr=sink
        )
    try:
        resp = wait_http_ready(url, timeout=90, proc=proc, log=out)
        assert resp.content == b"object bytes"
        requests.get(url, headers={"Referer": url}, timeout=10)
        deadline = time.monotonic() + 10
        while access_log.read_text().count("/transfer/") < 2:
            assert time.monotonic() < deadline, out.read_text()[-2000:]
            time.sleep(0.05)
    finally:
        proc.terminate()
        proc.wait(timeout=30)

    logged = access_log.read_text()
    lines = [line for line in logged.splitlines() if "/transfer/" in line]
    assert len(lines) >= 2 and all(" 200 " in line for line in lines[-2:]), logged
    assert token not in logged and quote(token) not in logged
    assert not re.search(r"[?&]t=", logged), logged
    assert token not in out.read_text()
