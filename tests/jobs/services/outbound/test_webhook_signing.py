"""Standard Webhooks signatures as the reference library (standardwebhooks) computes and
verifies them: every secret we generate, and several signatures in one header."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest
from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError

from jobs import webhook_signing


def test_our_signature_is_the_reference_ones() -> None:
    secret = webhook_signing.secret_new()
    body = '{"object":"event","id":"evt_1","data":{"id":"ftjob-x"}}'
    now = int(time.time())
    ours = webhook_signing.signature(secret, message_id="msg_1", timestamp=now, body=body.encode())
    theirs = Webhook(secret).sign("msg_1", datetime.fromtimestamp(now, UTC), body)
    assert ours == theirs


@pytest.mark.parametrize("count", [1, 2, 3])
def test_any_one_of_several_secrets_verifies(count: int) -> None:
    secrets = [webhook_signing.secret_new() for _ in range(count)]
    body = b'{"type":"fine_tuning.job.succeeded"}'
    headers = webhook_signing.headers(
        secrets, message_id="msg_abc", timestamp=int(time.time()), body=body
    )
    assert headers["webhook-id"] == "msg_abc"
    assert len(headers["webhook-signature"].split(" ")) == count
    for secret in secrets:
        assert Webhook(secret).verify(body, headers) == {"type": "fine_tuning.job.succeeded"}
    with pytest.raises(WebhookVerificationError):
        Webhook(webhook_signing.secret_new()).verify(body, headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(secrets[0]).verify(body + b" ", headers)


def test_secrets_are_distinct_and_in_the_whsec_format() -> None:
    made = {webhook_signing.secret_new() for _ in range(50)}
    assert len(made) == 50
    assert all(s.startswith("whsec_") and len(s) == 6 + 44 for s in made)
