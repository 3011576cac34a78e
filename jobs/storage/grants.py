"""Signed transfer grants: what a ``/transfer/`` URL allows (one object, one verb, until
when), signed with the Django secret. The local backend issues them; the route
(jobs.storage.transfer) checks them."""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import urlencode

from django.conf import settings
from django.core import signing

from jobs.storage.base import Transfer

SALT = "trainhub.transfer"
METHODS = ("GET", "PUT")


def sign(grant: Transfer) -> str:
    """An absolute URL on this control plane that allows what ``grant`` says (checked by
    ``jobs.storage.transfer_url``): on TRAINHUB_PUBLIC_URL for machines outside the
    operator's network, else on TRAINHUB_CONTROL_URL (GPU nodes)."""
    payload: dict[str, Any] = {
        "key": grant.key,
        "method": grant.method,
        "exp": int(time.time()) + grant.ttl_seconds,
    }
    if grant.method == "PUT":
        payload["max_bytes"] = grant.size if grant.size is not None else grant.max_bytes
        if grant.size is not None:
            payload["size"] = grant.size
        if grant.sha256 is not None:
            payload["sha256"] = grant.sha256
    token = signing.dumps(payload, salt=SALT, compress=True)
    base = settings.TRAINHUB_PUBLIC_URL if grant.public else settings.TRAINHUB_CONTROL_URL
    # In the query string, like an S3 presigned URL's credentials: the executor's messages
    # strip query strings (gpu_worker.transfer.redact/scrub) and so does the web process's
    # access log (trainhub.gunicorn_conf), so the token never reaches a log.
    return f"{base.rstrip('/')}/transfer/?{urlencode({'t': token})}"
