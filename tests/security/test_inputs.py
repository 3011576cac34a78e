"""Limits on what outside input can make trainhub hold (issue 15, findings 3, 4, 6 and the hub
id of 7): uploads over the limit or the project's quota, a JSON body too large, a bundle whose
PAX header is a memory bomb, a rented machine that streams gigabytes, and a model reference
that would load a folder from the executor's working directory.

Each test makes the attack through the real path (HTTP to a live server, the real sshd on
loopback, the executor as a process) and asserts the refusal, what it cost, and that nothing
stored changed."""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import shutil
import stat
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.conf import settings as django_settings
from django.core.files.uploadhandler import FileUploadHandler

from jobs.models import JobAttempt, TrainingFile, TrainingJob
from jobs.services.cloud import remote
from jobs.states import EndReason
from providers import ssh
from providers.errors import PermanentProviderError
from tests.gpu_worker.conftest import spec_dict, write_jsonl
from tests.jobs.services.cloud.test_remote import authorize, fresh, keyed_attempt, ssh_cloud, up
from tests.support.api import assert_error, upload
from trainhub_contract.outcomes import ExitCode

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 1 << 20  # TRAINHUB_MAX_UPLOAD_BYTES in the upload tests
BOUNDARY = "trainhub-attack-boundary"


def _example(i: int) -> str:
    turns = [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}]
    return json.dumps({"messages": turns})


GOOD = ("\n".join(_example(i) for i in range(5)) + "\n").encode()

__all__ = ["ssh_cloud"]  # a fixture, used by name


class CountingHandler(FileUploadHandler):
    """Placed right after the limit handler: counts the bytes handed on towards the memory and
    temporary-file handlers, i.e. what the server stores of an upload."""

    handed_on = 0

    def receive_data_chunk(self, raw_data: bytes, start: int) -> bytes:
        CountingHandler.handed_on += len(raw_data)
        return raw_data

    def file_complete(self, file_size: int) -> None:
        return None


@pytest.fixture
def counted_uploads(settings, tmp_path: Path) -> Path:
    """Upload limit 1 MiB, the counting handler in the chain, Django's temporary files in a
    folder of their own (returned) so that what is left there can be checked."""
    CountingHandler.handed_on = 0
    settings.TRAINHUB_MAX_UPLOAD_BYTES = LIMIT
    settings.FILE_UPLOAD_HANDLERS = [
        "api.uploads.UploadLimitHandler",
        f"{__name__}.CountingHandler",
        "django.core.files.uploadhandler.MemoryFileUploadHandler",
        "django.core.files.uploadhandler.TemporaryFileUploadHandler",
    ]
    settings.FILE_UPLOAD_MAX_MEMORY_SIZE = 64 << 10  # larger uploads go to a temporary file
    temp = tmp_path / "django-uploads"
    temp.mkdir()
    settings.FILE_UPLOAD_TEMP_DIR = str(temp)
    return temp


@pytest.fixture
def bearer(transactional_db, user, project) -> str:
    """A raw API key of the test user, for requests to the live server (whose thread sees only
    committed rows: hence the transactional database)."""
    from jobs.services.accounts.projects import api_key_create

    _, raw = api_key_create(user=user, name="attack", project=project)
    return raw


def _multipart_head(filename: str = "data.jsonl") -> bytes:
    return (
        f"--{BOUNDARY}\r\n"
        f'Content-Disposition: form-data; name="file"; filename="{filename}"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n"
    ).encode()


def _multipart(content: bytes) -> bytes:
    return _multipart_head() + content + f"\r\n--{BOUNDARY}--\r\n".encode()


def _connection(live_server) -> http.client.HTTPConnection:
    url = urlsplit(live_server.url)
    return http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=30)


def _start_upload(conn: http.client.HTTPConnection, raw_key: str, headers: dict[str, str]) -> None:
    conn.putrequest("POST", "/api/v1/files/")
    conn.putheader("Authorization", f"Bearer {raw_key}")
    conn.putheader("Content-Type", f"multipart/form-data; boundary={BOUNDARY}")
    for name, value in headers.items():
        conn.putheader(name, value)
    conn.endheaders()


def _error(response: http.client.HTTPResponse) -> dict[str, Any]:
    assert response.getheader("Content-Type", "").startswith("application/json")
    return json.loads(response.read())["error"]


def _nothing_stored(temp_dir: Path) -> None:
    assert TrainingFile.objects.count() == 0
    storage_dir = Path(django_settings.TRAINHUB_STORAGE_DIR)
    assert not storage_dir.exists() or not [p for p in storage_dir.rglob("*") if p.is_file()]
    assert list(temp_dir.iterdir()) == [], "no temporary file is left behind"


# --- uploads ------------------------------------------------------------------------------------


def test_an_upload_streamed_without_content_length_is_refused_unread(
    live_server, bearer, counted_uploads
) -> None:
    """Chunked transfer encoding, 8 MiB promised: Django would read such a body as empty, so the
    upload is refused (411) without a byte of it being read or stored."""
    conn = _connection(live_server)
    _start_upload(conn, bearer, {"Transfer-Encoding": "chunked"})
    chunk = _multipart_head() + b"x" * (LIMIT // 4)
    conn.send(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
    response = conn.getresponse()
    assert response.status == 411
    error = _error(response)
    assert error["code"] == "length_required" and "Content-Length" in error["message"]
    conn.close()
    assert CountingHandler.handed_on == 0
    _nothing_stored(counted_uploads)


def test_an_upload_declaring_more_than_the_limit_is_refused_before_it_is_read(
    live_server, bearer, counted_uploads
) -> None:
    """Content-Length: 50 MB and no body sent at all: the answer comes without waiting for it."""
    conn = _connection(live_server)
    _start_upload(conn, bearer, {"Content-Length": str(50 * 1000 * 1000)})
    response = conn.getresponse()  # the body was never sent: the server did not read it
    assert response.status == 413
    error = _error(response)
    assert error["code"] == "file_too_large" and str(LIMIT) in error["message"]
    conn.close()
    assert CountingHandler.handed_on == 0
    _nothing_stored(counted_uploads)


def test_an_over_limit_file_stops_streaming_at_the_limit(
    live_server, bearer, counted_uploads
) -> None:
    """A body small enough to be read (the limit plus the multipart allowance) whose file is
    over the limit: the server stops at the chunk that passes it; the handlers that store
    (memory, temporary file) got at most the limit, and nothing is kept."""
    body = _multipart(b"y" * (LIMIT + 48 * 1024))
    conn = _connection(live_server)
    _start_upload(conn, bearer, {"Content-Length": str(len(body))})
    conn.send(body)
    response = conn.getresponse()
    assert response.status == 413
    assert _error(response)["code"] == "file_too_large"
    conn.close()
    assert 0 < CountingHandler.handed_on <= LIMIT, CountingHandler.handed_on
    _nothing_stored(counted_uploads)


@pytest.mark.parametrize("quota", ["bytes", "files"])
def test_an_upload_over_the_project_quota_is_refused_and_stored_files_stay(
    api, settings, quota: str
) -> None:
    """Two files fill the quota (in bytes: all but 10 of it; in number: both places); the
    third upload is refused, the first two unchanged in the database and in storage."""
    if quota == "bytes":
        settings.TRAINHUB_PROJECT_STORAGE_BYTES = 2 * len(GOOD) + 10
    else:
        settings.TRAINHUB_PROJECT_MAX_FILES = 2
    kept = [upload(api, GOOD).json()["id"] for _ in range(2)]
    before = {
        f.public_id: (f.bytes, f.sha256, _stored_sha256(f.storage_key))
        for f in TrainingFile.objects.all()
    }

    response = upload(api, GOOD)

    error = assert_error(response, 403, param="file", code="storage_quota_exceeded")
    limit = (
        settings.TRAINHUB_PROJECT_STORAGE_BYTES
        if quota == "bytes"
        else settings.TRAINHUB_PROJECT_MAX_FILES
    )
    assert f"of at most {limit}" in error["message"], error["message"]
    assert f"stores 2 of at most {settings.TRAINHUB_PROJECT_MAX_FILES} files" in error["message"]
    after = {
        f.public_id: (f.bytes, f.sha256, _stored_sha256(f.storage_key))
        for f in TrainingFile.objects.all()
    }
    assert after == before and sorted(after) == sorted(kept)
    stored = [p for p in Path(settings.TRAINHUB_STORAGE_DIR).rglob("*") if p.is_file()]
    assert len(stored) == 2


def _stored_sha256(key: str) -> str:
    return hashlib.sha256(
        (Path(django_settings.TRAINHUB_STORAGE_DIR) / key).read_bytes()
    ).hexdigest()


def test_a_json_body_over_the_limit_is_refused_unread(api, settings) -> None:
    """DRF's JSON parser reads a body whole; Django's DATA_UPLOAD_MAX_MEMORY_SIZE does not
    apply to it. A larger Content-Length is refused before the parser reads it."""
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 4096
    body = {"model": "acme/tiny-llama", "training_file": "file-x", "suffix": "s" * 8000}
    response = api.post("/api/v1/jobs/", body, format="json")
    error = assert_error(response, 413, code="body_too_large")
    assert "4096" in error["message"]
    assert TrainingJob.objects.count() == 0


# --- bundles ------------------------------------------------------------------------------------

PAX_BOMB = r"""
import json, resource, sys, tarfile
from trainhub_contract.bundle import BundleError, verify_bundle

SIZE = 256 << 20
info = tarfile.TarInfo("././@PaxHeader")
info.type, info.size = tarfile.XHDTYPE, SIZE

def chunks():
    yield info.tobuf(format=tarfile.USTAR_FORMAT)
    piece = b"9" * (1 << 20)  # the record's bytes: never meant to be parsed
    for _ in range(SIZE >> 20):
        yield piece

before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    verify_bundle(chunks())
    error = None
except BundleError as exc:
    error = exc.message
grew = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
print(json.dumps({"error": error, "grew_kib": grew}))
"""


def test_a_pax_header_bomb_is_refused_with_flat_memory() -> None:
    """A bundle whose first header announces a 256 MiB PAX record (the finding: +513 MiB RSS)
    is refused by its typed error before the record is read; the verifying process grows by
    far less than 64 MB. Run in its own process so that its peak RSS is its own."""
    out = subprocess.run(
        [sys.executable, "-c", PAX_BOMB],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["error"] and "PAX header" in result["error"], result
    assert str(256 << 20) in result["error"]
    assert result["grew_kib"] <= 64 * 1024, result


# --- rented machines ----------------------------------------------------------------------------

FLOODING_EXECUTOR = """#!/bin/sh
# A hostile machine's executor: a 512 MiB log (sparse: costs no disk), then a crash.
truncate -s 512M executor.log
echo 'the last line of a very long log'
exit 1
"""


@pytest.fixture
def flooding_cloud(ssh_cloud, settings, tmp_path: Path):
    script = tmp_path / "flooding-executor"
    script.write_text(FLOODING_EXECUTOR)
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    settings.TRAINHUB_REMOTE_PYTHON = str(script)
    return ssh_cloud


def test_a_machine_with_a_huge_log_costs_only_the_logs_tail(flooding_cloud, make_job, sshd) -> None:
    """The executor dies without a report, leaving a 512 MiB executor.log: the attempt fails
    with the log's last lines, having read at most LOG_TAIL_BYTES of it (traced memory peak
    of the polls far below the log's size)."""
    attempt = keyed_attempt(make_job, max_attempts=1)
    authorize(sshd, attempt)
    remote.attempt_drive(attempt=fresh(attempt), state=up(sshd))  # starts it
    tracemalloc.start()
    try:
        deadline = time.monotonic() + 60
        while fresh(attempt).ended_at is None:
            assert time.monotonic() < deadline
            time.sleep(0.2)
            remote.attempt_drive(attempt=fresh(attempt), state=up(sshd))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    ended = fresh(attempt)
    assert ended.end_reason == EndReason.INTERNAL_ERROR
    message = TrainingJob.objects.get(pk=attempt.job_id).error_message
    assert message.endswith("the last line of a very long log"), message[-300:]
    assert len(message) < remote.LOG_TAIL_BYTES + 200
    assert peak < 16 << 20, f"the polls held {peak} bytes at their peak"


def test_a_machine_flooding_a_commands_output_is_cut_off(sshd, tmp_path: Path) -> None:
    """Every remote command goes through one runner; a machine answering one with a gigabyte of
    output is refused once it passes MAX_COMMAND_OUTPUT, quickly and with flat memory."""
    executor = ssh.RemoteExecutor(
        ssh.SshAddress(sshd.host, sshd.port, sshd.username),
        private_key=sshd.private_key,
        remote_dir=str(tmp_path / "remote"),
    )
    tracemalloc.start()
    started = time.monotonic()
    try:
        with executor, pytest.raises(PermanentProviderError, match="printed more than"):
            executor._sh("head -c 1000000000 /dev/zero")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert time.monotonic() - started < 10
    assert peak < 4 << 20, peak


def test_a_machine_flooding_the_exit_code_file_is_read_to_the_cap(sshd, tmp_path: Path) -> None:
    """exit_code is written by our own wrapper, so a few bytes: a 1 GiB one is read to 32
    bytes, and a number that is no exit status (0-255) is no exit."""
    remote_dir = tmp_path / "remote"
    remote_dir.mkdir()
    with (remote_dir / "exit_code").open("wb") as fh:
        fh.write(b"1" * 40)
        fh.truncate(1 << 30)
    executor = ssh.RemoteExecutor(
        ssh.SshAddress(sshd.host, sshd.port, sshd.username),
        private_key=sshd.private_key,
        remote_dir=str(remote_dir),
    )
    tracemalloc.start()
    try:
        with executor:
            assert executor.exit_code() is None
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, peak


# --- models -------------------------------------------------------------------------------------


def test_a_hub_id_is_not_loaded_from_the_executors_working_directory(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """A loadable model at dir/model in the executor's working directory, and a spec naming the
    hub id 'dir/model': the executor (a real process) refuses it instead of loading the folder
    (before the fix it trained on it and succeeded)."""
    cwd = tmp_path / "executor-cwd"
    shutil.copytree(tiny_model_dir, cwd / "dir" / "model")
    dataset = write_jsonl(
        tmp_path / "train.jsonl",
        [{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}],
    )
    spec = spec_dict("dir/model", dataset, tmp_path / "out")
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(spec))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpu_worker",
            "run",
            str(spec_path),
            "--workdir",
            str(tmp_path / "w"),
        ],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == ExitCode.FAILED, out.stdout[-2000:] + out.stderr[-2000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["reason"] == "invalid_model", summary
    assert "working directory" in summary["message"] and "dir/model" in summary["message"]
    assert not (tmp_path / "out" / "adapter.tar").exists()


@pytest.mark.parametrize("model", ["../x/model", "./dir/model", "dir/../model", "a/b/c", "/etc"])
def test_a_relative_or_unlisted_local_model_is_refused_at_the_api(api, make_file, model) -> None:
    """Only 'owner/name' hub ids and absolute paths the operator listed are models."""
    training = make_file()
    response = api.post(
        "/api/v1/jobs/", {"model": model, "training_file": training.public_id}, format="json"
    )
    error = assert_error(response, 400, param="model")
    assert model.strip() in error["message"]
    assert TrainingJob.objects.count() == 0
    assert JobAttempt.objects.count() == 0
