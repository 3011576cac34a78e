"""jobs.services.core.specs on both backends: each attempt uploads to keys of its own, and resumes
from the newest *sealed* checkpoint of an earlier attempt (the attacks on this are in
tests/security/test_artifacts.py)."""

from __future__ import annotations

from urllib.parse import parse_qs, unquote, urlsplit

import pytest
from django.core import signing

from jobs import storage
from jobs.models import JobAttempt, TrainingJob
from jobs.services.core import specs
from jobs.services.core.attempts import attempt_end, attempt_start
from jobs.states import EndReason
from jobs.storage import grants

pytestmark = pytest.mark.usefixtures("storage_backend", "sent")


def next_attempt(job: TrainingJob, previous: JobAttempt | None = None) -> JobAttempt:
    if previous is not None:  # lost: back to the queue for another attempt
        assert attempt_end(attempt=previous, reason=EndReason.WORKER_LOST)
    return attempt_start(job=TrainingJob.objects.get(pk=job.pk), target="local")


def checkpoint(job: TrainingJob, number: int, data: bytes) -> None:
    storage.save_stream(storage.checkpoint_key(job.project_id, job.public_id, number), [data])


def resumes_from(attempt: JobAttempt) -> bytes | None:
    """The bytes of the sealed checkpoint the attempt's resume_url names."""
    url = specs.attempt_spec(attempt)["outputs"]["resume_url"]
    if url is None:
        return None
    job = attempt.job
    for number in range(attempt.number - 1, 0, -1):
        key = storage.sealed_key(storage.checkpoint_key(job.project_id, job.public_id, number))
        if names(url, key, "GET"):
            return b"".join(storage.read_chunks(key))
    raise AssertionError(f"resume_url names no sealed checkpoint of an earlier attempt: {url}")


def names(url: str, key: str, method: str) -> bool:
    """Whether a transfer URL allows ``method`` on ``key``: the local route's signed grant, or
    an S3 presigned URL (the key is its path; the method is signed, checked by test_storage_s3)."""
    parts = urlsplit(url)
    if parts.path.startswith("/transfer/"):
        grant = signing.loads(parse_qs(parts.query)["t"][0], salt=grants.SALT)
        return bool(grant["key"] == key and grant["method"] == method)
    return unquote(parts.path).endswith("/" + key)


def test_each_attempt_uploads_its_checkpoint_to_its_own_key(make_job) -> None:
    job = make_job()
    first = next_attempt(job)
    second = next_attempt(job, first)
    urls = {a.number: specs.attempt_spec(a)["outputs"]["checkpoint_url"] for a in (first, second)}
    for number, url in urls.items():
        assert names(url, storage.checkpoint_key(job.project_id, job.public_id, number), "PUT")


def test_a_later_attempt_resumes_from_the_newest_earlier_checkpoint(make_job) -> None:
    job = make_job()
    first = next_attempt(job)
    assert resumes_from(first) is None, "nothing to resume from yet"
    checkpoint(job, 1, b"step 5")

    second = next_attempt(job, first)
    assert resumes_from(second) == b"step 5"
    checkpoint(job, 2, b"step 10")

    third = next_attempt(job, second)
    assert resumes_from(third) == b"step 10"
    assert resumes_from(third) == b"step 10", "built again: the same bytes"


def test_an_attempt_without_a_checkpoint_passes_on_the_one_before(make_job) -> None:
    job = make_job()
    first = next_attempt(job)
    checkpoint(job, 1, b"step 5")
    second = next_attempt(job, first)  # never built its spec: lost before launch
    third = next_attempt(job, second)
    assert resumes_from(third) == b"step 5"


@pytest.mark.parametrize(
    ("target", "capacity", "notice"),
    [("aws", "spot", "aws"), ("aws", "on_demand", None), ("vastai", "spot", None),
     ("local", "", None)],
)  # fmt: skip
def test_only_a_spot_machine_that_warns_has_its_executor_watch_for_the_notice(
    make_job, target: str, capacity: str, notice: str | None
) -> None:
    """AWS warns two minutes ahead in the instance metadata; Vast.ai bids just stop. A spec
    without the field is what executors before it read."""
    attempt = next_attempt(make_job())
    JobAttempt.objects.filter(pk=attempt.pk).update(target=target, capacity=capacity)
    attempt.refresh_from_db()
    spec = specs.attempt_spec(attempt)
    assert spec.get("preemption_notice") == notice
    assert ("preemption_notice" in spec) == (notice is not None)


@pytest.mark.parametrize("packing", [True, False])
def test_packing_at_the_executors_default_is_left_out_of_the_spec(make_job, packing: bool) -> None:
    """An executor older than ``packing`` refuses fields it does not know: a spec carries the
    field only when it differs from what such an executor does anyway (the current executor
    reads the absence as its default, on)."""
    from trainhub_contract.spec import parse_job_spec

    job = make_job()
    TrainingJob.objects.filter(pk=job.pk).update(
        hyperparameters={**job.hyperparameters, "packing": packing}
    )
    spec = specs.attempt_spec(next_attempt(job))
    assert ("packing" in spec["hyperparameters"]) is not packing
    assert parse_job_spec(spec).hyperparameters.packing is packing


@pytest.mark.parametrize("interval", [0, 25])
def test_eval_interval_at_the_executors_default_is_left_out_of_the_spec(
    make_job, interval: int
) -> None:
    """Likewise ``eval_interval``: left out at 0 (auto), so an older executor, which knows no
    such field (and evaluates each epoch), still takes the job."""
    from trainhub_contract.spec import parse_job_spec

    job = make_job()
    TrainingJob.objects.filter(pk=job.pk).update(
        hyperparameters={**job.hyperparameters, "eval_interval": interval}
    )
    spec = specs.attempt_spec(next_attempt(job))
    assert ("eval_interval" in spec["hyperparameters"]) is bool(interval)
    assert parse_job_spec(spec).hyperparameters.eval_interval == interval
