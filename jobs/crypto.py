"""Secrets at rest: MultiFernet over settings.TRAINHUB_ENCRYPTION_KEYS (newest key first)."""

from __future__ import annotations

import json
from typing import cast

from cryptography.fernet import Fernet, MultiFernet
from django.conf import settings


def _fernet() -> MultiFernet:
    return MultiFernet([Fernet(key) for key in settings.TRAINHUB_ENCRYPTION_KEYS])


def encrypt_json(value: dict[str, str]) -> str:
    return _fernet().encrypt(json.dumps(value).encode()).decode()


def decrypt_json(token: str) -> dict[str, str]:
    return cast(dict[str, str], json.loads(_fernet().decrypt(token.encode())))


def rotate(token: str) -> str:
    """Re-encrypt under the newest key (readable by any configured key)."""
    return _fernet().rotate(token.encode()).decode()
