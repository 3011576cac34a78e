"""The names trainhub gives the SSH keys it registers at Lambda."""

from __future__ import annotations

import hashlib
import re

KEY_PREFIX = "trainhub-"
# Only keys we named are ever deleted: an operator's own "trainhub-laptop" key is left alone.
OUR_KEY = re.compile(rf"^{re.escape(KEY_PREFIX)}[0-9a-f]{{16}}$")


def key_name(public_key: str) -> str:
    """The Lambda name of an SSH key: from the hash of its blob, so the comment does not
    matter and the same key is registered once however often an attempt is launched."""
    parts = public_key.split()
    blob = parts[1] if len(parts) > 1 else public_key.strip()
    return KEY_PREFIX + hashlib.sha256(blob.encode()).hexdigest()[:16]
