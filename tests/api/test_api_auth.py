"""Authentication: bearer keys (hashed at rest), revocation, the key command, sessions, scoping,
and the rate limit per key (per user for a session)."""

from __future__ import annotations

import hashlib
import io

import pytest
from django.core.management import CommandError, call_command
from rest_framework.test import APIClient

from api.auth import rate_limit as parsed_rate_limit
from jobs.models import ApiKey, ProjectMembership, TrainingJob
from jobs.services.accounts.projects import (
    api_key_create,
    api_key_revoke,
    project_create,
    project_default_for_user,
    project_member_add,
)
from tests.support.api import assert_error, assert_list
from trainhub.shared_redis import redis_client

JOBS = "/api/v1/jobs/"


def _client(raw: str | None = None, header: str | None = None) -> APIClient:
    client = APIClient()
    if header is not None:
        client.credentials(HTTP_AUTHORIZATION=header)
    elif raw is not None:
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


@pytest.mark.parametrize("url", [JOBS, "/api/v1/files/", "/api/v1/credentials/", f"{JOBS}ftjob-x/"])
def test_no_credentials_is_401_json(db, url: str) -> None:
    response = APIClient().get(url)
    error = assert_error(response, 401, param=None)
    assert error["type"] == "authentication_error"
    assert response["WWW-Authenticate"].startswith("Bearer")


def test_post_without_credentials_creates_nothing(db) -> None:
    response = APIClient().post(JOBS, {"model": "acme/tiny-llama"}, format="json")
    assert_error(response, 401)
    assert TrainingJob.objects.count() == 0


@pytest.mark.parametrize(
    "header",
    [
        "Bearer th-not-a-real-key-at-all-0123456789",
        "Bearer sk-something-else",
        "Bearer ",
        "bearer th-",
    ],
)
def test_wrong_key_is_401(user, header: str) -> None:
    api_key_create(user=user, name="real")
    error = assert_error(_client(header=header).get(JOBS), 401)
    assert error["type"] == "authentication_error"


def test_key_with_right_prefix_but_wrong_secret_is_401(user) -> None:
    _, raw = api_key_create(user=user, name="real")
    tampered = raw[:-4] + ("AAAA" if not raw.endswith("AAAA") else "BBBB")
    assert_error(_client(tampered).get(JOBS), 401)
    assert _client(raw).get(JOBS).status_code == 200


def test_revoked_key_is_401(user) -> None:
    key, raw = api_key_create(user=user, name="soon-revoked")
    assert _client(raw).get(JOBS).status_code == 200

    api_key_revoke(key=key)

    assert_error(_client(raw).get(JOBS), 401)
    key.refresh_from_db()
    assert key.revoked_at is not None


def test_key_of_inactive_user_is_401(user) -> None:
    _, raw = api_key_create(user=user, name="k")
    user.is_active = False
    user.save(update_fields=["is_active"])
    assert_error(_client(raw).get(JOBS), 401)


def test_key_is_stored_hashed_and_records_last_use(user) -> None:
    key, raw = api_key_create(user=user, name="k")
    assert raw.startswith("th-")
    assert key.last_used_at is None

    row = ApiKey.objects.get(pk=key.pk)
    assert row.key_sha256 == hashlib.sha256(raw.encode()).hexdigest()
    assert row.key_sha256 != raw
    for field in ApiKey._meta.concrete_fields:
        assert raw not in str(getattr(row, field.attname)), field.name
    assert raw.startswith(row.prefix) and len(row.prefix) < len(raw) - 20

    assert _client(raw).get(JOBS).status_code == 200
    row.refresh_from_db()
    assert row.last_used_at is not None


def test_create_api_key_command(user) -> None:
    out, err = io.StringIO(), io.StringIO()
    call_command("create_api_key", "alice", "--name", "laptop", stdout=out, stderr=err)

    raw = out.getvalue().strip().splitlines()[-1]
    assert raw.startswith("th-")
    assert raw not in err.getvalue()
    key = ApiKey.objects.get(name="laptop")
    assert key.user == user
    assert key.project == project_default_for_user(user=user)

    response = _client(raw).get(JOBS)
    assert response.status_code == 200
    assert_list(response)


def test_create_api_key_command_errors(user, make_user) -> None:
    with pytest.raises(CommandError, match="nobody"):
        call_command("create_api_key", "nobody", stdout=io.StringIO(), stderr=io.StringIO())
    with pytest.raises(CommandError, match="no-such-project"):
        call_command(
            "create_api_key",
            "alice",
            "--project",
            "no-such-project",
            stdout=io.StringIO(),
            stderr=io.StringIO(),
        )
    bobs = project_create(name="bobs-lab", owner=make_user("bob"))
    with pytest.raises(CommandError):
        call_command(
            "create_api_key",
            "alice",
            "--project",
            bobs.slug,
            stdout=io.StringIO(),
            stderr=io.StringIO(),
        )
    assert not ApiKey.objects.filter(user=user).exists()


def test_key_acts_in_its_own_project(user, project, make_client, make_job) -> None:
    lab = project_create(name="lab", owner=user)
    in_default = make_job()
    in_lab = make_job(proj=lab)
    default_client, lab_client = make_client(user), make_client(user, project=lab)

    assert [j["id"] for j in assert_list(default_client.get(JOBS))] == [in_default.public_id]
    assert [j["id"] for j in assert_list(lab_client.get(JOBS))] == [in_lab.public_id]
    assert_error(default_client.get(f"{JOBS}{in_lab.public_id}/"), 404)
    assert lab_client.get(f"{JOBS}{in_lab.public_id}/").json()["organization_id"] == lab.slug


def test_another_users_key_sees_only_its_project(api, make_user, make_client, make_job) -> None:
    alices = make_job()
    bob_client = make_client(make_user("bob"))

    assert assert_list(bob_client.get(JOBS)) == []
    assert_error(bob_client.get(f"{JOBS}{alices.public_id}/"), 404, code="job_not_found")
    assert_error(bob_client.post(f"{JOBS}{alices.public_id}/cancel/"), 404)
    assert api.get(f"{JOBS}{alices.public_id}/").status_code == 200
    assert TrainingJob.objects.get(pk=alices.pk).status == "queued"


def test_key_stops_working_when_its_user_leaves_the_project(user, make_user, make_job) -> None:
    bob = make_user("bob")
    lab = project_create(name="lab", owner=user)
    project_member_add(project=lab, user=bob)
    _, raw = api_key_create(user=bob, name="bobs", project=lab)
    job = make_job(proj=lab)
    assert _client(raw).get(f"{JOBS}{job.public_id}/").status_code == 200

    ProjectMembership.objects.filter(project=lab, user=bob).delete()

    error = assert_error(_client(raw).get(f"{JOBS}{job.public_id}/"), 401)
    assert "no longer a member" in error["message"]
    assert_error(_client(raw).post(f"{JOBS}{job.public_id}/cancel/"), 401)
    assert TrainingJob.objects.get(pk=job.pk).status == "queued"


def test_session_auth_uses_the_default_project(user, project, make_job) -> None:
    job = make_job()
    client = APIClient()
    client.force_login(user)

    listed = assert_list(client.get(JOBS))
    assert [j["id"] for j in listed] == [job.public_id]
    assert listed[0]["organization_id"] == project.slug

    page = client.get(JOBS, HTTP_ACCEPT="text/html")
    assert page.status_code == 200
    assert page["Content-Type"].startswith("text/html")
    assert job.public_id.encode() in page.content

    detail = client.get(f"{JOBS}{job.public_id}/", HTTP_ACCEPT="text/html")
    assert detail.status_code == 200
    files_page = client.get("/api/v1/files/", HTTP_ACCEPT="text/html")
    assert files_page.status_code == 200

    cancelled = client.post(f"{JOBS}{job.public_id}/cancel/")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"


def test_session_writes_need_csrf_but_bearer_writes_do_not(user, make_job) -> None:
    job = make_job()
    browser = APIClient(enforce_csrf_checks=True)
    browser.force_login(user)
    assert browser.get(JOBS).status_code == 200

    error = assert_error(browser.post(f"{JOBS}{job.public_id}/cancel/"), 403)
    assert error["type"] == "permission_error"
    assert "CSRF" in error["message"]
    assert TrainingJob.objects.get(pk=job.pk).status == "queued"

    _, raw = api_key_create(user=user, name="script")
    script = APIClient(enforce_csrf_checks=True)
    script.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert script.post(f"{JOBS}{job.public_id}/cancel/").status_code == 200


def test_session_of_user_without_project_gets_one(make_user) -> None:
    carol = make_user("carol")
    client = APIClient()
    client.force_login(carol)
    assert assert_list(client.get(JOBS)) == []
    assert project_default_for_user(user=carol).memberships.filter(user=carol).exists()


# --- throttling (the attack across real gunicorn workers: tests/security/test_operations.py) ---


@pytest.fixture
def rate_limit(settings) -> str:
    settings.TRAINHUB_API_RATE_LIMIT = "3/hour"  # an hour-long window: a test never straddles two
    for key in redis_client().scan_iter("trainhub:throttle:*"):  # ids restart with the test db
        redis_client().delete(key)
    return settings.TRAINHUB_API_RATE_LIMIT


def test_a_key_over_its_rate_is_429_in_the_error_shape_with_retry_after(
    user, rate_limit, make_job
) -> None:
    job = make_job()
    _, raw = api_key_create(user=user, name="busy")
    client = _client(raw)
    assert [client.get(JOBS).status_code for _ in range(3)] == [200, 200, 200]

    response = client.post(f"{JOBS}{job.public_id}/cancel/")
    error = assert_error(response, 429, param=None, code="rate_limited")
    assert error["type"] == "rate_limit_error"
    assert error["message"].startswith("Too many requests: at most 3/hour per API key")
    assert 0 < int(response["Retry-After"]) <= 3600
    assert TrainingJob.objects.get(pk=job.pk).status == "queued", "the refused cancel did nothing"

    _, fresh_raw = api_key_create(user=user, name="other")
    assert _client(fresh_raw).get(JOBS).status_code == 200, "counted per key"


def test_a_browser_session_is_counted_per_user(user, make_user, rate_limit) -> None:
    mine, theirs = APIClient(), APIClient()
    mine.force_login(user)
    theirs.force_login(make_user("bob"))
    assert [mine.get(JOBS).status_code for _ in range(4)] == [200, 200, 200, 429]
    assert theirs.get(JOBS).status_code == 200


def test_unauthenticated_requests_are_refused_before_they_count(user, rate_limit) -> None:
    for _ in range(5):
        assert_error(APIClient().get(JOBS), 401)
    assert list(redis_client().scan_iter("trainhub:throttle:*")) == []


def test_the_rate_limit_can_be_turned_off(user, settings) -> None:
    settings.TRAINHUB_API_RATE_LIMIT = "off"
    _, raw = api_key_create(user=user, name="bench")
    client = _client(raw)
    assert {client.get(JOBS).status_code for _ in range(10)} == {200}
    assert parsed_rate_limit() is None


@pytest.mark.parametrize(
    ("raw", "parsed"),
    [("1200/minute", (1200, 60)), ("5/s", (5, 1)), ("10/hour", (10, 3600)), ("1/day", (1, 86400))],
)
def test_rates_are_requests_per_window(settings, raw, parsed) -> None:
    settings.TRAINHUB_API_RATE_LIMIT = raw
    assert parsed_rate_limit() == parsed
