"""Jobs API: create (validation, idempotency, limits), list, actions, events, artifacts."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from api import serializers
from jobs.models import IdempotencyKey, TrainingJob
from jobs.services.accounts.projects import project_default_for_user
from jobs.services.core.attempts import attempt_start
from jobs.services.core.files import file_validate
from jobs.services.core.jobs import job_create
from providers import registry
from tests.support.api import assert_error, assert_list, assert_unix_seconds
from tests.support.fakes.adapter import register_fake

JOBS = "/api/v1/jobs/"
# The presenter's keys are the schema's (api.serializers.Job): what generators are told.
JOB_KEYS = set(serializers.Job().fields)
BROKEN = b'{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}\n{oops\n'


@pytest.fixture
def processed_file(make_file):
    return make_file()


def _create(client, body: Any, **headers: str):
    return client.post(JOBS, body, format="json", **headers)


def _job_body(file_id: str, **extra: Any) -> dict[str, Any]:
    return {"model": "acme/tiny-llama", "training_file": file_id, **extra}


def _status(job_id: str) -> str:
    return TrainingJob.objects.values_list("status", flat=True).get(public_id=job_id)


# --- create ---------------------------------------------------------------------------------


def test_a_price_cap_is_shown_as_a_number(api, project, processed_file, settings) -> None:
    settings.TRAINHUB_PUBLIC_URL = "http://127.0.0.1:8000"
    from providers import registry
    from tests.support.fakes.adapter import register_fake

    register_fake("priced-cloud", has_offers=True)
    try:
        body = _job_body(processed_file.public_id, target="priced-cloud", max_price_per_hour="1.25")
        job = _create(api, body).json()
    finally:
        registry.unregister("priced-cloud")
    assert (job["max_price_per_hour"], job["estimated_cost"], job["cost"]) == (1.25, None, None)


def test_create_with_processed_file_is_queued(api, project, processed_file) -> None:
    response = _create(api, _job_body(processed_file.public_id, suffix="demo", seed=7))

    assert response.status_code == 201, response.content
    job = response.json()
    assert set(job) == JOB_KEYS
    assert job["id"].startswith("ftjob-")
    assert job["object"] == "fine_tuning.job"
    assert job["status"] == "queued"
    assert job["model"] == "acme/tiny-llama"
    assert job["training_file"] == processed_file.public_id
    assert job["validation_file"] is None
    assert job["organization_id"] == project.slug
    assert job["target"] == "local"
    assert job["seed"] == 7 and job["suffix"] == "demo"
    assert job["adapter"]["type"] == "lora" and job["adapter"]["r"] >= 1
    assert job["hyperparameters"]["n_epochs"] >= 1
    assert job["error"] is None
    assert_unix_seconds(job["created_at"])
    assert job["started_at"] is None and job["finished_at"] is None
    assert TrainingJob.objects.filter(public_id=job["id"], project=project).count() == 1

    got = api.get(f"{JOBS}{job['id']}/")
    assert got.status_code == 200
    assert got.json() == job


def test_create_takes_packing_on_by_default(api, processed_file) -> None:
    default = _create(api, _job_body(processed_file.public_id))
    off = _create(api, _job_body(processed_file.public_id, hyperparameters={"packing": False}))
    assert (default.status_code, off.status_code) == (201, 201), off.content
    assert default.json()["hyperparameters"]["packing"] is True
    assert off.json()["hyperparameters"]["packing"] is False


def test_create_before_validation_waits_then_queues(api, make_file) -> None:
    pending = make_file(validate=False)
    response = _create(api, _job_body(pending.public_id))
    assert response.status_code == 201
    job_id = response.json()["id"]
    assert response.json()["status"] == "validating_files"

    file_validate(file_pk=pending.pk)

    assert api.get(f"{JOBS}{job_id}/").json()["status"] == "queued"


def test_create_before_validation_of_a_broken_file_fails_the_job(api, make_file) -> None:
    pending = make_file(BROKEN, validate=False)
    job_id = _create(api, _job_body(pending.public_id)).json()["id"]

    file_validate(file_pk=pending.pk)

    job = api.get(f"{JOBS}{job_id}/").json()
    assert job["status"] == "failed"
    assert job["error"]["code"] == "invalid_dataset"
    assert pending.public_id in job["error"]["message"]
    assert_unix_seconds(job["finished_at"])


@pytest.mark.parametrize(
    ("change", "param", "code"),
    [
        ({"model": None}, "model", None),
        ({"model": "../x"}, "model", None),
        ({"adapter": {"type": "foo"}}, "adapter.type", None),
        ({"adapter": {"r": 0}}, "adapter.r", None),
        ({"adapter": [1]}, "adapter", None),
        ({"hyperparameters": {"learning_rate": -1}}, "hyperparameters.learning_rate", None),
        ({"hyperparameters": {"n_epochs": True}}, "hyperparameters.n_epochs", None),
        ({"hyperparameters": {"batch_size": 2, "dropout": 0.1}}, "hyperparameters.dropout", None),
        ({"hyperparameters": {"packing": "yes"}}, "hyperparameters.packing", None),
        ({"hyperparameters": {"eval_interval": -1}}, "hyperparameters.eval_interval", None),
        ({"hyperparameters": {"eval_interval": 2.5}}, "hyperparameters.eval_interval", None),
        ({"colour": "blue"}, "colour", None),
        ({"training_file": None}, "training_file", "invalid_type"),
        ({"training_file": "file-nope"}, "training_file", "file_not_found"),
        ({"validation_file": "file-nope"}, "validation_file", "file_not_found"),
        ({"target": "nope"}, "target", None),
        ({"seed": "x"}, "seed", "invalid_type"),
        ({"seed": True}, "seed", "invalid_type"),
        ({"seed": -1}, "seed", "invalid_value"),
        ({"max_runtime_seconds": 1}, "max_runtime_seconds", "invalid_value"),
        ({"max_attempts": 11}, "max_attempts", "invalid_value"),
        ({"suffix": 5}, "suffix", None),
        # Falsy wrong types are refused, never read as "not given".
        ({"suffix": 0}, "suffix", None),
        ({"suffix": False}, "suffix", None),
        ({"method": {"type": "supervised", "supervised": 0}}, "method.supervised", None),
        (
            {"method": {"type": "supervised", "supervised": {"hyperparameters": False}}},
            "method.supervised.hyperparameters",
            "invalid_type",
        ),
        # PostgreSQL refuses NUL in text: a 400 naming the field, not a 500.
        ({"suffix": "a\x00b"}, "suffix", "invalid_value"),
        ({"training_file": "file-\x00"}, "training_file", "invalid_value"),
        ({"adapter": {"target_modules": ["q\x00"]}}, "adapter.target_modules.0", "invalid_value"),
    ],
)
def test_create_rejects_bad_field(api, processed_file, change, param, code) -> None:
    body = {
        k: v for k, v in {**_job_body(processed_file.public_id), **change}.items() if v is not None
    }
    error = assert_error(_create(api, body), 400, param=param)
    assert error["type"] == "invalid_request_error"
    if code:
        assert error["code"] == code
    assert TrainingJob.objects.count() == 0


def test_create_target_auto_explains_itself(api, processed_file) -> None:
    error = assert_error(
        _create(api, _job_body(processed_file.public_id, target="auto")), 400, param="target"
    )
    assert "auto" in error["message"] and "local" in error["message"]


@pytest.mark.parametrize("storage_kind", ["local", "local-with-public-url", "s3"])
def test_cloud_targets_need_storage_the_rented_machine_can_reach(
    api, processed_file, settings, storage_kind: str
) -> None:
    register_fake("rented")
    try:
        settings.TRAINHUB_PUBLIC_URL = (
            "https://trainhub.example.org" if "public" in storage_kind else ""
        )
        if storage_kind == "s3":
            settings.TRAINHUB_STORAGE, settings.TRAINHUB_S3_BUCKET = "s3", "trainhub-artifacts"
        response = _create(api, _job_body(processed_file.public_id, target="rented"))
        if storage_kind == "local":
            error = assert_error(response, 400, param="target", code="storage_unreachable")
            assert "TRAINHUB_STORAGE=s3" in error["message"]
            assert "TRAINHUB_PUBLIC_URL" in error["message"]
            assert TrainingJob.objects.count() == 0
        else:
            assert response.status_code == 201, response.content
    finally:
        registry.unregister("rented")


def test_create_model_not_allowed(api, processed_file, settings) -> None:
    settings.TRAINHUB_ALLOWED_MODELS = ["meta-llama/*"]
    error = assert_error(
        _create(api, _job_body(processed_file.public_id)),
        400,
        param="model",
        code="model_not_found",
    )
    assert "acme/tiny-llama" in error["message"]
    ok = _create(api, _job_body(processed_file.public_id, model="meta-llama/Llama-3.2-1B"))
    assert ok.status_code == 201


def test_create_with_another_projects_file(api, bob, make_file) -> None:
    foreign = make_file(proj=project_default_for_user(user=bob))
    assert_error(
        _create(api, _job_body(foreign.public_id)),
        400,
        param="training_file",
        code="file_not_found",
    )
    assert TrainingJob.objects.count() == 0


def test_create_with_a_file_that_failed_validation(api, make_file) -> None:
    broken = make_file(BROKEN)
    assert broken.status == "error"
    error = assert_error(
        _create(api, _job_body(broken.public_id)), 400, param="training_file", code="invalid_file"
    )
    assert broken.public_id in error["message"]


@pytest.mark.parametrize("raw", ['{"model": ', "not json", "[1, 2]", '"text"', "null"])
def test_create_rejects_body_that_is_not_an_object(api, raw: str) -> None:
    response = api.post(JOBS, raw, content_type="application/json")
    assert_error(response, 400)
    assert TrainingJob.objects.count() == 0


@pytest.mark.parametrize("depth", [900, 100_000])
def test_create_rejects_deeply_nested_body(api, processed_file, depth: int) -> None:
    nested = "[" * depth + "]" * depth
    body = f'{{"model": "acme/tiny-llama", "training_file": "{processed_file.public_id}", "adapter": {nested}}}'
    assert_error(api.post(JOBS, body, content_type="application/json"), 400)
    assert TrainingJob.objects.count() == 0


def test_create_with_validation_file(api, processed_file, make_file) -> None:
    pending = make_file(validate=False)
    response = _create(api, _job_body(processed_file.public_id, validation_file=pending.public_id))
    assert response.status_code == 201
    job = response.json()
    assert job["status"] == "validating_files"
    assert job["validation_file"] == pending.public_id

    file_validate(file_pk=pending.pk)
    assert api.get(f"{JOBS}{job['id']}/").json()["status"] == "queued"


def test_create_form_encoded_is_unsupported(api, processed_file) -> None:
    response = api.post(JOBS, _job_body(processed_file.public_id), format="multipart")
    assert_error(response, 415)


# --- idempotency and limits -----------------------------------------------------------------


def test_idempotency_key_replays_the_first_job(api, processed_file) -> None:
    body = _job_body(processed_file.public_id)
    first = _create(api, body, HTTP_IDEMPOTENCY_KEY="req-1")
    again = _create(api, body, HTTP_IDEMPOTENCY_KEY="req-1")

    assert first.status_code == 201 and again.status_code == 200
    assert again.json()["id"] == first.json()["id"]
    assert TrainingJob.objects.count() == 1
    assert IdempotencyKey.objects.count() == 1

    other_body = _job_body(processed_file.public_id, seed=1)
    assert_error(
        _create(api, other_body, HTTP_IDEMPOTENCY_KEY="req-1"),
        409,
        code="idempotency_key_reused",
        param="Idempotency-Key",
    )
    assert TrainingJob.objects.count() == 1

    # Another key is another job.
    assert _create(api, body, HTTP_IDEMPOTENCY_KEY="req-2").status_code == 201
    assert TrainingJob.objects.count() == 2


def test_idempotency_key_too_long(api, processed_file) -> None:
    assert_error(
        _create(api, _job_body(processed_file.public_id), HTTP_IDEMPOTENCY_KEY="k" * 256),
        400,
        param="Idempotency-Key",
    )


def test_concurrent_job_limit(api, project, processed_file) -> None:
    project.max_concurrent_jobs = 1
    project.save(update_fields=["max_concurrent_jobs"])
    first = _create(api, _job_body(processed_file.public_id))
    assert first.status_code == 201

    error = assert_error(
        _create(api, _job_body(processed_file.public_id)), 429, code="concurrent_job_limit"
    )
    assert error["type"] == "rate_limit_error"
    assert TrainingJob.objects.count() == 1

    assert api.post(f"{JOBS}{first.json()['id']}/cancel/").status_code == 200
    assert _create(api, _job_body(processed_file.public_id)).status_code == 201


@pytest.fixture
def no_broker(monkeypatch):
    """Transactional tests commit for real, so on_commit hooks run: keep them off the broker."""
    from jobs.services.outbox import messages

    monkeypatch.setattr(messages, "send_validate_file", lambda file_pk: None)


def _concurrently(*calls):
    """Run the calls at the same moment on their own threads (and database connections)."""
    barrier = threading.Barrier(len(calls))
    results: list[Any] = [None] * len(calls)

    def run(i: int) -> None:
        try:
            barrier.wait(timeout=10)
            results[i] = calls[i]()
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    return results


@pytest.mark.django_db(transaction=True)
def test_concurrent_creates_with_one_idempotency_key(
    user, make_client, make_file, no_broker
) -> None:
    body = _job_body(make_file().public_id)
    clients = [make_client(user), make_client(user)]
    responses = _concurrently(
        *[lambda c=c: _create(c, body, HTTP_IDEMPOTENCY_KEY="same") for c in clients]
    )
    assert sorted(r.status_code for r in responses) == [200, 201], [r.content for r in responses]
    assert len({r.json()["id"] for r in responses}) == 1
    assert TrainingJob.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_concurrent_creates_respect_the_job_limit(
    user, project, make_client, make_file, no_broker
) -> None:
    project.max_concurrent_jobs = 1
    project.save(update_fields=["max_concurrent_jobs"])
    body = _job_body(make_file().public_id)
    clients = [make_client(user) for _ in range(3)]
    responses = _concurrently(*[lambda c=c: _create(c, body) for c in clients])
    assert sorted(r.status_code for r in responses) == [201, 429, 429]
    assert TrainingJob.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_a_job_created_while_its_file_is_validated_is_queued_whatever_the_interleaving(
    user, make_client, make_file, no_broker, monkeypatch
) -> None:
    """The worst order: the create reads its file still unvalidated, then (before the create
    commits) the validation commits and looks for waiting jobs, finding none. The job must
    not wait in validating_files for ever: the create looks again once committed."""
    from django.db import connection

    from jobs.services.core import jobs as job_services
    from jobs.services.core.files import file_validate

    if connection.vendor != "postgresql":
        pytest.skip("two transactions at once need a server database")
    pending = make_file(validate=False)
    read, go = threading.Event(), threading.Event()
    record = job_services.audit_record

    def paused_after_the_read(**kwargs: Any) -> None:  # the create, before its commit
        record(**kwargs)
        if kwargs.get("action") == "job.create":
            read.set()
            assert go.wait(30), "the validation never let the create go on"

    monkeypatch.setattr(job_services, "audit_record", paused_after_the_read)

    def validate_meanwhile() -> None:
        assert read.wait(30), "the create never read its file"
        try:
            file_validate(file_pk=pending.pk)  # commits; the uncommitted job is not seen
        finally:
            go.set()
            connection.close()

    validator = threading.Thread(target=validate_meanwhile)
    validator.start()
    created = _create(make_client(user), _job_body(pending.public_id))
    validator.join(timeout=30)

    assert created.status_code == 201, created.content
    assert created.json()["status"] == "queued", "looked at again once committed"
    job = TrainingJob.objects.get(public_id=created.json()["id"])
    assert job.status == "queued"
    statuses = [e.data["status"] for e in job.events.filter(type="status").order_by("number")]
    assert statuses == ["validating_files", "queued"]


# --- list -----------------------------------------------------------------------------------


@pytest.fixture
def lab_target():
    registry.register(
        registry.Target("lab", "A second fleet, for filter tests.", registry.TargetKind.OWN_FLEET)
    )
    yield "lab"
    registry.unregister("lab")


def test_list_filters_by_status_and_target(api, make_job, lab_target) -> None:
    queued = make_job()
    cancelled = make_job()
    lab = make_job(target=lab_target)
    api.post(f"{JOBS}{cancelled.public_id}/cancel/")

    def ids(query: str) -> list[str]:
        return [j["id"] for j in assert_list(api.get(f"{JOBS}?{query}"))]

    assert ids("") == [lab.public_id, cancelled.public_id, queued.public_id]
    assert ids("status=queued") == [lab.public_id, queued.public_id]
    assert ids("status=cancelled") == [cancelled.public_id]
    assert ids("status=running") == []
    assert ids("target=lab") == [lab.public_id]
    assert ids("target=local&status=queued") == [queued.public_id]
    assert all(j["object"] == "fine_tuning.job" for j in assert_list(api.get(JOBS)))


@pytest.mark.parametrize(
    ("query", "param"),
    [
        ("status=done", "status"),
        ("limit=0", "limit"),
        ("limit=x", "limit"),
        ("after=ftjob-nope", "after"),
        ("after=ftjob-%00", "after"),
        ("target=%00", "target"),
    ],
)
def test_list_bad_query(api, query: str, param: str) -> None:
    assert_error(api.get(f"{JOBS}?{query}"), 400, param=param)


def test_list_pages_deep_with_after(api, project, user, processed_file) -> None:
    project.max_concurrent_jobs = 100
    project.save(update_fields=["max_concurrent_jobs"])
    created = [
        job_create(project=project, user=user, data=_job_body(processed_file.public_id))[
            0
        ].public_id
        for _ in range(23)
    ]
    newest_first = created[::-1]

    default_page = assert_list(api.get(JOBS), has_more=True)
    assert [j["id"] for j in default_page] == newest_first[:20]

    seen: list[str] = []
    after = ""
    while True:
        response = api.get(f"{JOBS}?limit=5" + (f"&after={after}" if after else ""))
        page = assert_list(response)
        seen += [j["id"] for j in page]
        if not response.json()["has_more"]:
            break
        after = page[-1]["id"]
    assert seen == newest_first
    assert len(set(seen)) == 23

    # A filtered deep page stays inside the filter.
    for job_id in newest_first[:6:2]:
        api.post(f"{JOBS}{job_id}/cancel/")
    first = assert_list(api.get(f"{JOBS}?status=queued&limit=2"), has_more=True)
    second = assert_list(
        api.get(f"{JOBS}?status=queued&limit=2&after={first[-1]['id']}"), has_more=True
    )
    expected = [j for j in newest_first if j not in newest_first[:6:2]]
    assert [j["id"] for j in first + second] == expected[:4]
    assert all(j["status"] == "queued" for j in first + second)


@pytest.mark.parametrize("path", ["jobs/", "files/", "jobs/{job}/events/"])
def test_list_queries_do_not_grow_with_rows(api, project, user, make_file, path: str) -> None:
    project.max_concurrent_jobs = 100
    project.save(update_fields=["max_concurrent_jobs"])
    job = job_create(project=project, user=user, data=_job_body(make_file().public_id))[0]
    url = "/api/v1/" + path.format(job=job.public_id)
    api.get(url)  # the key's first use writes last_used_at; count from the second request

    def count() -> int:
        with CaptureQueriesContext(connection) as ctx:
            assert api.get(url).status_code == 200
        return len(ctx.captured_queries)

    few = count()
    for _ in range(4):  # more jobs, files and events
        job_create(project=project, user=user, data=_job_body(make_file().public_id))
        api.post(f"{JOBS}{job.public_id}/cancel/")
        api.post(f"{JOBS}{job.public_id}/retry/")
    assert len(assert_list(api.get(url))) >= 5
    assert count() == few


# --- another project ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "suffix"),
    [
        ("get", ""),
        ("delete", ""),
        ("post", "cancel/"),
        ("post", "retry/"),
        ("get", "events/"),
        ("get", "artifacts/"),
    ],
)
def test_other_projects_job_is_404(other_client, make_job, method: str, suffix: str) -> None:
    job = make_job()
    response = getattr(other_client, method)(f"{JOBS}{job.public_id}/{suffix}")
    assert_error(response, 404, code="job_not_found")
    assert _status(job.public_id) == "queued"
    assert assert_list(other_client.get(JOBS)) == []


# --- actions --------------------------------------------------------------------------------


def test_cancel_queued_job(api, make_job) -> None:
    job = make_job()
    response = api.post(f"{JOBS}{job.public_id}/cancel/")

    assert response.status_code == 200
    body = response.json()
    assert set(body) == JOB_KEYS
    assert body["status"] == "cancelled"
    assert_unix_seconds(body["finished_at"])
    assert _status(job.public_id) == "cancelled"
    statuses = [
        e["data"].get("status") for e in assert_list(api.get(f"{JOBS}{job.public_id}/events/"))
    ]
    assert statuses[-2:] == ["cancelling", "cancelled"]

    assert_error(api.post(f"{JOBS}{job.public_id}/cancel/"), 409, code="job_not_cancellable")
    assert _status(job.public_id) == "cancelled"


def test_cancel_job_with_live_attempt_waits_for_the_stop(
    api, make_job, django_capture_on_commit_callbacks
) -> None:
    job = make_job()
    attempt_start(job=job, target="local")
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = api.post(f"{JOBS}{job.public_id}/cancel/")
    assert response.status_code == 200
    assert response.json()["status"] == "cancelling"
    assert callbacks, "a stop request is sent once the cancel commits"
    assert_error(api.delete(f"{JOBS}{job.public_id}/"), 409, code="job_not_terminal")


def test_retry(api, make_job) -> None:
    job = make_job()
    assert_error(api.post(f"{JOBS}{job.public_id}/retry/"), 409, code="job_not_retryable")

    api.post(f"{JOBS}{job.public_id}/cancel/")
    response = api.post(f"{JOBS}{job.public_id}/retry/")

    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "queued"
    assert body["finished_at"] is None and body["error"] is None
    assert _status(job.public_id) == "queued"


def test_retry_of_job_whose_file_is_broken(api, make_file) -> None:
    pending = make_file(BROKEN, validate=False)
    job_id = _create(api, _job_body(pending.public_id)).json()["id"]
    file_validate(file_pk=pending.pk)
    assert _status(job_id) == "failed"

    assert_error(api.post(f"{JOBS}{job_id}/retry/"), 409, code="invalid_file")
    assert _status(job_id) == "failed"


def test_delete(api, make_job) -> None:
    job = make_job()
    assert_error(api.delete(f"{JOBS}{job.public_id}/"), 409, code="job_not_terminal")
    assert _status(job.public_id) == "queued"

    api.post(f"{JOBS}{job.public_id}/cancel/")
    response = api.delete(f"{JOBS}{job.public_id}/")
    assert response.status_code == 200
    assert response.json() == {"id": job.public_id, "object": "fine_tuning.job", "deleted": True}

    assert_error(api.get(f"{JOBS}{job.public_id}/"), 404, code="job_not_found")
    assert_error(api.get(f"{JOBS}{job.public_id}/events/"), 404)
    assert_error(api.delete(f"{JOBS}{job.public_id}/"), 404)
    assert not TrainingJob.objects.filter(public_id=job.public_id).exists()


def test_unknown_job_and_unknown_url(api) -> None:
    assert_error(api.get(f"{JOBS}ftjob-doesnotexist/"), 404, code="job_not_found")
    assert_error(api.get(f"{JOBS}ftjob-%00/"), 404, code="job_not_found")
    assert_error(api.get(f"{JOBS}ftjob-%00/events/"), 404, code="job_not_found")
    assert_error(api.post(f"{JOBS}ftjob-doesnotexist/cancel/"), 404, code="job_not_found")
    assert_error(api.get("/api/v1/nothing-here/"), 404)
    assert_error(api.put(JOBS, {}, format="json"), 405)


# --- events and artifacts -------------------------------------------------------------------


def test_events_are_ordered_and_tail_with_after(api, make_job) -> None:
    job = make_job()
    suffix = job.public_id.removeprefix("ftjob-")

    events = assert_list(api.get(f"{JOBS}{job.public_id}/events/"), has_more=False)
    assert [e["id"] for e in events] == [f"ftevent-{suffix}-1", f"ftevent-{suffix}-2"]
    for e in events:
        assert e["object"] == "fine_tuning.job.event"
        assert e["type"] == "status" and e["level"] == "info" and e["attempt"] == 0
        assert isinstance(e["message"], str) and e["message"]
        assert_unix_seconds(e["created_at"])
    assert [e["data"]["status"] for e in events] == ["validating_files", "queued"]

    last = events[-1]["id"]
    assert assert_list(api.get(f"{JOBS}{job.public_id}/events/?after={last}"), has_more=False) == []

    api.post(f"{JOBS}{job.public_id}/cancel/")
    newer = assert_list(api.get(f"{JOBS}{job.public_id}/events/?after={last}"))
    assert [e["id"] for e in newer] == [f"ftevent-{suffix}-3", f"ftevent-{suffix}-4"]
    assert [e["data"]["status"] for e in newer] == ["cancelling", "cancelled"]

    paged = assert_list(api.get(f"{JOBS}{job.public_id}/events/?limit=3"), has_more=True)
    assert [e["id"] for e in paged] == [f"ftevent-{suffix}-{n}" for n in (1, 2, 3)]


def test_events_bad_after(api, make_job) -> None:
    job, other = make_job(), make_job()
    url = f"{JOBS}{job.public_id}/events/"
    other_event = f"ftevent-{other.public_id.removeprefix('ftjob-')}-1"
    own = f"ftevent-{job.public_id.removeprefix('ftjob-')}"
    for bad in ("nope", other_event, f"{own}-x", f"{own}-%C2%B2", f"{own}-%00", f"{own}--1"):
        assert_error(api.get(f"{url}?after={bad}"), 400, param="after")


def test_artifacts_empty_for_new_job(api, make_job) -> None:
    job = make_job()
    response = api.get(f"{JOBS}{job.public_id}/artifacts/")
    assert response.status_code == 200
    assert response.json() == {"object": "list", "data": [], "has_more": False}
    assert_error(
        api.get("/api/v1/artifacts/artifact-nope/download/"), 404, code="artifact_not_found"
    )
    assert_error(
        api.get("/api/v1/artifacts/artifact-%00/download/"), 404, code="artifact_not_found"
    )


# --- OpenAPI --------------------------------------------------------------------------------


def test_openapi_schema_and_docs(api) -> None:
    schema = api.get("/api/schema/?format=json")
    assert schema.status_code == 200
    document = json.loads(schema.content)
    paths = document["paths"]
    assert "/api/v1/fine_tuning/jobs/" in paths
    assert "/api/v1/files/{file_id}/content/" in paths
    assert "/api/v1/fine_tuning/jobs/{job_id}/events/" in paths
    # once each: the aliases (no slash, /v1/, the first API's /api/v1/jobs/) are not repeated
    assert not [p for p in paths if p.startswith("/api/v1/jobs/") or not p.endswith("/")]
    operations = [op for item in paths.values() for op in item.values()]
    ids = [op["operationId"] for op in operations]
    assert len(ids) == len(set(ids)) and "fine_tuning_jobs_create" in ids
    create = paths["/api/v1/fine_tuning/jobs/"]["post"]
    assert create["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/JobCreate"
    )
    for op in operations:  # every keyed operation says what its errors look like
        if op["operationId"] == "provider_webhook":  # no key: its URL is signed
            continue
        assert op["responses"]["401"]["content"]["application/json"]["schema"]["$ref"].endswith(
            "/Error"
        ), op["operationId"]
    assert "node agent" in {t for op in operations for t in op.get("tags", [])}

    yaml_schema = api.get("/api/schema/")
    assert yaml_schema.status_code == 200
    assert b"/api/v1/fine_tuning/jobs/" in yaml_schema.content

    docs = api.get("/api/docs/")
    assert docs.status_code == 200
    assert b"swagger" in docs.content.lower()
