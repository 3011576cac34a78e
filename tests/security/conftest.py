"""Attacks on trainhub's trust boundaries (docs/SECURITY.md): each test tries to cross one
boundary through the real path and asserts that it is refused and that nothing stored changed."""

from tests.jobs.conftest import *  # noqa: F403 - the service fixtures (sent, placed, ...)
from tests.jobs.conftest import _fast_password_hashing  # noqa: F401 - autouse
