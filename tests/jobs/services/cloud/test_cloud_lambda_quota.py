"""Lambda's ``global/quota-exceeded`` through the launch service: the quota is the account's,
so the launch stops at the first offer (each Lambda launch try costs a 12.5 s slot of the
account's launch bucket) and ends the attempt with a message naming the quota, where
``insufficient-capacity`` goes on to the next offer and remembers the sold-out one."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from jobs.services.cloud import launch, offers
from jobs.states import EndReason
from providers import registry
from providers.errors import PermanentProviderError, QuotaExceeded
from providers.lambda_cloud import translate
from tests.support.db import fresh
from tests.support.fakes.adapter import FakeAdapter, register_fake

pytestmark = pytest.mark.django_db


@pytest.fixture
def lambda_like(settings) -> Iterator[FakeAdapter]:
    settings.TRAINHUB_PUBLIC_URL = "http://127.0.0.1:8000"
    adapter = register_fake("quota-cloud", has_offers=True)
    yield adapter
    registry.unregister("quota-cloud")


def _lambda_refusal(code: str, message: str) -> Exception:
    """What the Lambda adapter raises for a launch refused with ``code`` (its error mapping)."""
    return translate(
        PermanentProviderError(
            f"lambda POST /instance-operations/launch returned HTTP 400: {code}; {message}",
            provider="lambda",
            status=400,
            code=code,
        )
    )


def test_a_quota_refusal_stops_the_launch_at_the_first_offer(lambda_like, make_job) -> None:
    first = lambda_like.add_offer("gpu_1x_h100_sxm5@us-east-1", 2.49)
    second = lambda_like.add_offer("gpu_1x_h100_sxm5@us-west-2", 2.49)
    refusal = _lambda_refusal("global/quota-exceeded", "Quota exceeded")
    assert isinstance(refusal, QuotaExceeded)
    lambda_like.launch_error = refusal
    job = make_job(target="quota-cloud", max_attempts=1)

    attempt = launch.attempt_launch(job=job, candidates=[first, second])

    assert attempt is not None
    assert len(lambda_like.launches) == 1, "the second offer would be refused the same way"
    assert fresh(attempt).end_reason == EndReason.PROVIDER_ERROR
    job.refresh_from_db()
    assert "account's quota" in job.error_message
    assert offers.refused_reasons([first, second]) == {}, "the offers are not sold out"


def test_insufficient_capacity_still_tries_the_next_offer(lambda_like, make_job) -> None:
    first = lambda_like.add_offer("gpu_1x_a100@us-east-1", 1.29)
    second = lambda_like.add_offer("gpu_1x_a100@us-west-2", 1.29)
    lambda_like.launch_error = _lambda_refusal(
        "instance-operations/launch/insufficient-capacity", "Not enough capacity"
    )
    job = make_job(target="quota-cloud", max_attempts=1)

    launch.attempt_launch(job=job, candidates=[first, second])

    assert len(lambda_like.launches) == 2
