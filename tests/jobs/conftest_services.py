"""Fixtures for the service / state-machine / task tests. Import the ones a module uses
(``from tests.jobs.conftest_services import fake_cloud, sent``) so pytest registers them there."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from providers import registry
from tests.fakes.adapter import FakeAdapter, register_fake


@dataclass
class SentTasks:
    """What ``trainhub.celery.app.send_task`` was asked to send (nothing reaches the broker)."""

    calls: list[tuple[str, list[Any]]] = field(default_factory=list)
    queues: list[str | None] = field(default_factory=list)  # the queue of each call

    def __call__(self, name: str, args: Any = None, kwargs: Any = None, **options: Any) -> None:
        self.calls.append((name, list(args or [])))
        self.queues.append(options.get("queue"))

    def named(self, name: str) -> list[list[Any]]:
        return [args for sent_name, args in self.calls if sent_name == name]

    def clear(self) -> None:
        self.calls.clear()
        self.queues.clear()


@pytest.fixture
def sent(monkeypatch) -> SentTasks:
    from trainhub.celery import app

    recorder = SentTasks()
    monkeypatch.setattr(app, "send_task", recorder)
    return recorder


@pytest.fixture
def fake_cloud(settings) -> Iterator[FakeAdapter]:
    # Rented machines need storage they can reach; with local storage, a public address.
    settings.TRAINHUB_PUBLIC_URL = "http://127.0.0.1:8000"
    adapter = register_fake("fake-cloud")
    yield adapter
    registry.unregister("fake-cloud")


@pytest.fixture
def fresh_provider_state() -> None:
    """Offers, refusals and the providers' rate-limit bookings live in Redis across processes
    and tests: a test using this starts without them (an earlier test's Lambda launch would
    otherwise make this one's wait out its 12.5 s window)."""
    from jobs.locks import redis_client

    client = redis_client()
    for pattern in ("trainhub:offers:*", "trainhub:ratelimit:*"):
        for key in client.scan_iter(pattern):
            client.delete(key)
