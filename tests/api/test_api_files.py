"""Files API: upload, validation, list, get, delete (through HTTP, on the real database)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from django.conf import settings

from jobs import tasks
from jobs.models import TrainingFile
from jobs.services.core.files import file_validate
from tests.support.api import assert_error, assert_list, assert_unix_seconds, upload
from trainhub_contract import celery_conf as cc


def _line(user: str, assistant: str, role: str = "assistant") -> str:
    return json.dumps(
        {"messages": [{"role": "user", "content": user}, {"role": role, "content": assistant}]}
    )


GOOD = ("\n".join(_line(f"q{i}", f"a{i}") for i in range(5)) + "\n").encode()
# Line 2: broken JSON; line 4: a role that does not exist.
BROKEN = "\n".join(
    [_line("q1", "a1"), '{"messages": [', _line("q3", "a3"), _line("q4", "a4", role="wizard")]
).encode()


def _stored_files() -> list[Path]:
    root = Path(settings.TRAINHUB_STORAGE_DIR)
    return [p for p in root.rglob("*") if p.is_file()] if root.exists() else []


def test_upload_good_file_then_validate(api, django_capture_on_commit_callbacks) -> None:
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = upload(api, GOOD, filename="chat.jsonl")

    assert response.status_code == 201, response.content
    body = response.json()
    assert body["id"].startswith("file-")
    assert body["object"] == "file"
    assert body["status"] == "uploaded"
    assert body["filename"] == "chat.jsonl"
    assert body["purpose"] == "fine-tune"
    assert body["bytes"] == len(GOOD)
    assert body["sha256"] == hashlib.sha256(GOOD).hexdigest()
    assert_unix_seconds(body["created_at"])
    assert body["format"] is None and body["errors"] == [] and body["error_count"] == 0
    assert len(callbacks) == 1, "validation is enqueued once the upload commits"

    record = TrainingFile.objects.get(public_id=body["id"])
    assert (Path(settings.TRAINHUB_STORAGE_DIR) / record.storage_key).read_bytes() == GOOD

    file_validate(file_pk=record.pk)

    got = api.get(f"/api/v1/files/{body['id']}/")
    assert got.status_code == 200
    processed = got.json()
    assert processed["status"] == "processed"
    assert processed["format"] == "messages"
    assert processed["example_count"] == 5
    assert processed["token_estimate"] > 0
    assert processed["errors"] == [] and processed["error_count"] == 0
    assert processed["sha256"] == body["sha256"]


def test_broken_file_reports_line_numbers(api) -> None:
    response = upload(api, BROKEN)
    assert response.status_code == 201
    file_validate(file_pk=TrainingFile.objects.get(public_id=response.json()["id"]).pk)

    body = api.get(f"/api/v1/files/{response.json()['id']}/").json()
    assert body["status"] == "error"
    assert body["error_count"] == 2
    assert [e["line"] for e in body["errors"]] == [2, 4]
    assert "wizard" in body["errors"][1]["message"]
    assert all(isinstance(e["message"], str) and e["message"] for e in body["errors"])


def test_upload_filename_cannot_pick_the_storage_path(api) -> None:
    response = upload(api, GOOD, filename="../../outside.jsonl")
    assert response.status_code == 201
    assert response.json()["filename"] == "outside.jsonl"
    root = Path(settings.TRAINHUB_STORAGE_DIR).resolve()
    stored = _stored_files()
    assert len(stored) == 1 and stored[0].resolve().is_relative_to(root)
    assert response.json()["id"] in stored[0].name
    assert not list(root.parent.glob("*.jsonl")) and not list(root.parent.parent.glob("outside*"))


def test_upload_without_file_field(api) -> None:
    response = api.post("/api/v1/files/", {"purpose": "fine-tune"}, format="multipart")
    assert_error(response, 400, param="file", code="missing_file")
    assert TrainingFile.objects.count() == 0


def test_upload_empty_file(api) -> None:
    response = upload(api, b"")
    assert_error(response, 400, param="file", code="empty_file")
    assert TrainingFile.objects.count() == 0
    assert _stored_files() == []


def test_upload_too_large_leaves_nothing(api, settings) -> None:
    settings.TRAINHUB_MAX_UPLOAD_BYTES = 100
    response = upload(api, GOOD)
    error = assert_error(response, 413, param="file", code="file_too_large")
    assert "100" in error["message"]
    assert TrainingFile.objects.count() == 0
    assert _stored_files() == []


def test_upload_wrong_purpose(api) -> None:
    response = upload(api, GOOD, purpose="assistants")
    assert_error(response, 400, param="purpose", code="invalid_value")
    assert TrainingFile.objects.count() == 0
    assert _stored_files() == []


def test_upload_as_json_is_rejected(api) -> None:
    response = api.post("/api/v1/files/", {"file": "x"}, format="json")
    assert_error(response, 415)


def test_list_pagination(api) -> None:
    ids = [upload(api, GOOD).json()["id"] for _ in range(5)]
    newest_first = ids[::-1]

    first = assert_list(api.get("/api/v1/files/?limit=2"), has_more=True)
    assert [f["id"] for f in first] == newest_first[:2]
    assert all(f["object"] == "file" for f in first)

    second = assert_list(api.get(f"/api/v1/files/?limit=2&after={first[-1]['id']}"), has_more=True)
    assert [f["id"] for f in second] == newest_first[2:4]

    last = assert_list(api.get(f"/api/v1/files/?limit=2&after={second[-1]['id']}"), has_more=False)
    assert [f["id"] for f in last] == newest_first[4:]

    everything = assert_list(api.get("/api/v1/files/"), has_more=False)
    assert [f["id"] for f in everything] == newest_first


@pytest.mark.parametrize(
    "query", ["limit=0", "limit=101", "limit=abc", "after=file-nope", "after=file-%00"]
)
def test_list_bad_query(api, query: str) -> None:
    param = query.split("=")[0]
    assert_error(api.get(f"/api/v1/files/?{query}"), 400, param=param)


def test_other_project_file_is_invisible(api, other_client) -> None:
    file_id = upload(api, GOOD).json()["id"]

    assert_error(other_client.get(f"/api/v1/files/{file_id}/"), 404, code="file_not_found")
    assert_error(other_client.delete(f"/api/v1/files/{file_id}/"), 404)
    assert assert_list(other_client.get("/api/v1/files/")) == []
    # Paging with a foreign id does not reveal that it exists elsewhere.
    assert_error(other_client.get(f"/api/v1/files/?after={file_id}"), 400, param="after")
    assert TrainingFile.objects.filter(public_id=file_id).exists()


@pytest.mark.parametrize("file_id", ["file-doesnotexist", "file-%00", "%C2%B2"])
def test_get_unknown_file(api, file_id: str) -> None:
    assert_error(api.get(f"/api/v1/files/{file_id}/"), 404, code="file_not_found")
    assert_error(api.delete(f"/api/v1/files/{file_id}/"), 404, code="file_not_found")


def test_delete_file(api, django_capture_on_commit_callbacks, sent) -> None:
    file_id = upload(api, GOOD).json()["id"]
    assert len(_stored_files()) == 1

    with django_capture_on_commit_callbacks(execute=True):
        response = api.delete(f"/api/v1/files/{file_id}/")

    assert response.status_code == 200
    assert response.json() == {"id": file_id, "object": "file", "deleted": True}
    assert_error(api.get(f"/api/v1/files/{file_id}/"), 404)
    # The delete committed a StorageDeletion and sent its purge; the worker runs it:
    [[deletion_pk]] = sent.named(cc.PURGE_STORAGE)
    assert len(_stored_files()) == 1
    tasks.purge_storage(deletion_pk)
    assert _stored_files() == [], "the stored object goes once the purge runs"


def test_delete_file_used_by_live_job_conflicts(api, make_job) -> None:
    job = make_job()
    file_id = job.training_file.public_id

    assert_error(api.delete(f"/api/v1/files/{file_id}/"), 409, code="file_in_use")
    assert TrainingFile.objects.filter(public_id=file_id).exists()

    # Still referenced once the job is over; deleting the job frees the file.
    assert api.post(f"/api/v1/jobs/{job.public_id}/cancel/").status_code == 200
    assert_error(api.delete(f"/api/v1/files/{file_id}/"), 409, code="file_in_use")
    assert api.delete(f"/api/v1/jobs/{job.public_id}/").status_code == 200
    assert api.delete(f"/api/v1/files/{file_id}/").status_code == 200


def test_an_upload_that_a_concurrent_one_pushed_over_the_quota_is_refused(
    project, user, settings
) -> None:
    """The quota is checked before reading and again, under the project's row lock, before the
    record is made: an upload that another one overtook while it streamed is refused then, and
    its stored bytes removed."""
    from jobs.errors import QuotaExceeded
    from jobs.services.core.files import file_create

    settings.TRAINHUB_PROJECT_STORAGE_BYTES = len(GOOD) * 3 // 2
    overtaking: list[TrainingFile] = []

    def chunks():
        yield GOOD[:10]
        overtaking.append(
            file_create(project=project, user=user, filename="other.jsonl", chunks=[GOOD])
        )
        yield GOOD[10:]

    with pytest.raises(QuotaExceeded) as exc:
        file_create(project=project, user=user, filename="late.jsonl", chunks=chunks())

    assert exc.value.code == "storage_quota_exceeded" and exc.value.http_status == 403
    assert list(TrainingFile.objects.values_list("public_id", flat=True)) == [
        overtaking[0].public_id
    ]
    assert [p.name for p in _stored_files()] == [Path(overtaking[0].storage_key).name]
