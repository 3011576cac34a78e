"""The grant the web process puts on its redirect of a completions request to the stream
process (api/live/inference.py): the caller's API key, signed, for one use within 60 s. HTTP
clients drop the Authorization header when a redirect leads to another origin; this is what
authenticates the redirected request there. One use: an access log that keeps query strings
holds only grants already spent."""

from __future__ import annotations

import secrets

from django.core import signing

from jobs.models import ApiKey, ProjectMembership
from trainhub.shared_redis import redis_client

GRANT_SALT = "trainhub.inference.grant"
GRANT_SECONDS = 60


def grant_for(key: ApiKey) -> str:
    nonce = secrets.token_urlsafe(12)
    return signing.dumps({"key": key.pk, "once": nonce}, salt=GRANT_SALT, compress=True)


def granted_key(token: str) -> ApiKey | None:
    """The live API key a grant names, spending the grant; None when it is forged, expired,
    spent already, or its key revoked, its user inactive or no longer a project member."""
    try:
        grant = signing.loads(token, salt=GRANT_SALT, max_age=GRANT_SECONDS)
        pk, nonce = grant["key"], str(grant["once"])
    except (signing.BadSignature, KeyError, TypeError):
        return None
    if not redis_client().set(f"trainhub:grant:{nonce}", 1, nx=True, ex=GRANT_SECONDS + 5):
        return None  # used once already
    key = ApiKey.objects.select_related("project", "user").filter(pk=pk).first()
    if key is None or key.revoked_at is not None or not key.user.is_active:
        return None
    if not ProjectMembership.objects.filter(project=key.project, user=key.user).exists():
        return None  # no longer a member of the key's project: as the bearer check says
    return key
