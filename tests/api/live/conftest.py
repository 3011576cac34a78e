"""Live-update tests: the stream process (tests/conftest.py ``stream_server``, the Procfile's
own ``stream`` line) on the test database; tests store events through the services in this
process and watch them arrive over real WebSocket and SSE connections."""

from __future__ import annotations

from collections.abc import Callable

import pytest


@pytest.fixture
def key_of(make_user) -> Callable[..., str]:
    """A fresh raw API key of ``user`` (in their default project)."""
    from jobs.services.accounts.projects import api_key_create

    def make(user) -> str:
        return api_key_create(user=user, name="live")[1]

    return make
