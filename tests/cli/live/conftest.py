"""The live stack of tests/e2e (its fixtures imported here, so only these tests start it): the
web side on pytest-django's live server, the control plane's worker, GPU nodes per test."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_worker.tiny_model import DEMO_DATASET_PATH
from jobs.services.accounts.projects import api_key_create
from tests.e2e.conftest import (  # noqa: F401 - the e2e stack's fixtures, reused as they are
    _quiet_control_worker,
    control_worker,
    control_worker_env,
    plane,
    shared_dir,
    start_node,
)


@pytest.fixture
def key(user) -> str:
    return api_key_create(user=user, name="cli")[1]


@pytest.fixture
def env(live_server, key: str) -> dict[str, str]:
    """The CLI's server and key, through the environment (test_login covers the file)."""
    return {"TRAINHUB_URL": live_server.url, "TRAINHUB_API_KEY": key}


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    path = tmp_path / "chat.jsonl"
    path.write_bytes(DEMO_DATASET_PATH.read_bytes())
    return path
