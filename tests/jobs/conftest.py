"""Fixtures shared by the tests/jobs modules (the project-wide ones are in tests/conftest.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings) -> None:
    # make_user sets a password; PBKDF2 costs ~0.3 s a user, which adds up over the suite.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
