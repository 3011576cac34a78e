"""Flower as the Procfile runs it (``python -m trainhub.flower``) watching the control worker:
its task list shows work (an upload's validation, a storage sweep) and none of the
housekeeping ticks that run every few seconds, and no task argument it shows holds a secret.
Its login and listening address are tests/security/test_operations.py."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from django.conf import settings

from devsupport.processes import free_port
from devsupport.readiness import wait_http_ready
from tests.e2e.conftest import Process
from tests.support.api import upload
from tests.support.broker_watch import SECRET
from trainhub_contract import celery_conf as cc

ROOT = Path(__file__).resolve().parents[2]
LOGIN = ("ops", "flower-test-password")


@pytest.fixture
def flower(control_worker, tmp_path: Path) -> Iterator[str]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLOWER_", "TRAINHUB_"))}
    env.update(
        DJANGO_SETTINGS_MODULE="trainhub.settings",
        CELERY_BROKER_URL=settings.CELERY_BROKER_URL,
        TRAINHUB_VAR_DIR=str(tmp_path / "var"),
        FLOWER_PORT=str(port),
        FLOWER_BASIC_AUTH=":".join(LOGIN),
    )
    proc = Process(
        "flower", [sys.executable, "-m", "trainhub.flower"], env, tmp_path / "flower.log"
    )
    proc.start()
    base = f"http://127.0.0.1:{port}"
    try:
        wait_http_ready(
            f"{base}/api/workers", timeout=60, session=_session(), proc=proc.proc, log=proc.log
        )
        yield base
    finally:
        proc.stop()


def _session() -> requests.Session:
    session = requests.Session()
    session.auth = LOGIN
    return session


def _tasks(base: str) -> dict[str, dict[str, Any]]:
    response = _session().get(f"{base}/api/tasks", timeout=5)
    assert response.status_code == 200, response.text[:300]
    return response.json()


def _send_until_listed(base: str, name: str, timeout: float = 60) -> str:
    """Send ``name`` (a harmless task) until Flower lists one as finished: events flow."""
    from trainhub.celery import app

    deadline = time.monotonic() + timeout
    sent: list[str] = []
    while time.monotonic() < deadline:
        sent.append(app.send_task(name).id)
        for _ in range(10):
            tasks = _tasks(base)
            if any(tasks.get(i, {}).get("state") == "SUCCESS" for i in sent):
                return sent[-1]
            time.sleep(0.3)
    raise AssertionError(f"Flower never listed {name}: {sorted(_tasks(base))[:5]}")


@pytest.mark.slow
def test_flower_lists_work_not_ticks_and_shows_no_secret_in_any_argument(
    plane, flower: str, api, demo_dataset: bytes
) -> None:
    from trainhub.celery import app

    _send_until_listed(flower, cc.STORAGE_SWEEP)  # Flower has switched the worker's events on

    uploaded = upload(api, demo_dataset)  # real work: the upload's validation task
    assert uploaded.status_code == 201, uploaded.content
    for name in sorted(cc.QUIET_TASKS):
        app.send_task(name, args=["runpod-serverless"] if name == cc.POLL_TARGET else [])
    # One worker, one queue, in order: once this one is listed the ticks before it have run.
    last = _send_until_listed(flower, cc.STORAGE_SWEEP)

    tasks = _tasks(flower)
    names = {t["name"] for t in tasks.values()}
    assert cc.VALIDATE_FILE in names and tasks[last]["state"] == "SUCCESS"
    assert not names & cc.QUIET_TASKS, f"ticks in Flower's task list: {names & cc.QUIET_TASKS}"
    # Broker messages carry ids (tests/support/broker_watch.py checks the wire); this is what an
    # operator reads in Flower, arguments and results included.
    shown = [f"{t.get('args')} {t.get('kwargs')} {t.get('result')}" for t in tasks.values()]
    assert not [s for s in shown if SECRET.search(s)]
