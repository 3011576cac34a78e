"""The control plane's shared fixtures (a pytest plugin the root conftest loads): dispatch and
claims, fake clouds, a finalizing or ingested job, the admin client. The project-wide ones
(database users, API clients, servers) are in tests/conftest.py."""

from __future__ import annotations

import hashlib
import io
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from django.test import Client

from jobs import storage
from jobs.models import Artifact, GpuNode, JobAttempt, TrainingJob
from jobs.services.core.artifacts import artifact_ingest
from jobs.services.core.attempts import attempt_record_events, attempt_start
from jobs.services.scheduling import dispatch
from providers import registry
from tests.support.db import fresh
from tests.support.fakes.adapter import FakeAdapter, register_fake
from tests.support.fleet import H100, attempt_of, online_node
from trainhub.shared_redis import redis_client
from trainhub_contract.bundle import write_bundle


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings) -> None:
    # make_user sets a password; PBKDF2 costs ~0.3 s a user, which adds up over the suite.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@dataclass
class SentTasks:
    """What ``trainhub.celery.app.send_task`` was asked to send (nothing reaches the broker)."""

    calls: list[tuple[str, list[Any]]] = field(default_factory=list)
    queues: list[str | None] = field(default_factory=list)  # the queue of each call
    options: list[dict[str, Any]] = field(default_factory=list)  # countdown, expires, ...

    def __call__(self, name: str, args: Any = None, kwargs: Any = None, **options: Any) -> None:
        self.calls.append((name, list(args or [])))
        self.queues.append(options.get("queue"))
        self.options.append(options)

    def named(self, name: str) -> list[list[Any]]:
        return [args for sent_name, args in self.calls if sent_name == name]

    def countdowns(self, name: str) -> list[float | None]:
        """The delay each ``name`` message was sent with (None: at once)."""
        return [
            options.get("countdown")
            for (sent_name, _), options in zip(self.calls, self.options, strict=True)
            if sent_name == name
        ]

    def clear(self) -> None:
        self.calls.clear()
        self.queues.clear()
        self.options.clear()


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> SentTasks:
    from trainhub.celery import app

    recorder = SentTasks()
    monkeypatch.setattr(app, "send_task", recorder)
    return recorder


@pytest.fixture
def dispatch_now(django_capture_on_commit_callbacks, sent) -> Callable[[], int]:
    """One dispatcher pass, with its on-commit sends run (and recorded by ``sent``)."""

    def run() -> int:
        with django_capture_on_commit_callbacks(execute=True):
            return dispatch.dispatch_queued()

    return run


class Placed(NamedTuple):
    """A local job placed on an own node, with the node's token."""

    job: TrainingJob
    attempt: JobAttempt
    node: GpuNode
    token: str


@pytest.fixture
def placed(make_job, dispatch_now) -> Placed:
    """A queued job placed on idle node gpu-a (attempt 1 sent, not claimed yet)."""
    node, token = online_node("gpu-a", H100)
    job = make_job()
    assert dispatch_now() == 1
    return Placed(fresh(job), attempt_of(job), fresh(node), token)


class Claimed(NamedTuple):
    """A local job whose node claimed attempt 1: what the claim answered the node with."""

    job: TrainingJob
    attempt: JobAttempt
    node: GpuNode
    token: str  # the node's token
    spec: dict[str, Any]
    report_token: str  # what the attempt's executor reports its events with


@pytest.fixture
def claimed(placed) -> Claimed:
    """``placed``, with attempt 1 claimed by its node."""
    claim = dispatch.attempt_claim(node=placed.node, job_id=placed.job.public_id, attempt_number=1)
    assert claim is not None
    job, attempt, node, token = placed
    return Claimed(job, attempt, node, token, claim.spec, claim.report_token)


@pytest.fixture
def fake_cloud(settings) -> Iterator[FakeAdapter]:
    # Rented machines need storage they can reach; with local storage, a public address.
    settings.TRAINHUB_PUBLIC_URL = "http://127.0.0.1:8000"
    adapter = register_fake("fake-cloud")
    yield adapter
    registry.unregister("fake-cloud")


@pytest.fixture
def clouds(settings, sent) -> Iterator[dict[str, FakeAdapter]]:
    """Two scripted clouds that list priced offers (placement picks among them)."""
    settings.TRAINHUB_PUBLIC_URL = "http://127.0.0.1:8000"  # rented machines reach storage
    made = {name: register_fake(name, has_offers=True) for name in ("cheap-cloud", "dear-cloud")}
    yield made
    for name in made:
        registry.unregister(name)


@pytest.fixture
def fresh_provider_state() -> None:
    """Offers, refusals and the providers' rate-limit bookings live in Redis across processes
    and tests: a test using this starts without them (an earlier test's Lambda launch would
    otherwise make this one's wait out its 12.5 s window)."""
    client = redis_client()
    for pattern in ("trainhub:offers:*", "trainhub:ratelimit:*"):
        for key in client.scan_iter(pattern):
            client.delete(key)


@pytest.fixture
def finalizing(make_job, tmp_path: Path, django_capture_on_commit_callbacks):
    """A job whose executor reported success, and the bundle it produced."""
    job = make_job()
    attempt = attempt_start(job=job, target="local")
    src = tmp_path / "adapter"
    src.mkdir()
    (src / "adapter_model.safetensors").write_bytes(bytes(range(256)) * 400)
    (src / "adapter_config.json").write_text('{"base_model_name_or_path": "acme/tiny-llama"}')
    buf = io.BytesIO()
    write_bundle(src, buf)
    bundle = buf.getvalue()
    sha = hashlib.sha256(bundle).hexdigest()
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        attempt_record_events(
            job_id=job.public_id,
            attempt_number=attempt.number,
            events=[
                {"seq": 0, "type": "status", "message": "training", "data": {"status": "running"}},
                {
                    "seq": 1,
                    "type": "status",
                    "message": "done",
                    "data": {"status": "succeeded", "sha256": sha},
                },
            ],
        )
    job.refresh_from_db()
    assert job.status == "finalizing"
    assert callbacks, "an ingest task is enqueued on commit"
    return job, attempt, bundle, sha


class Ingested(NamedTuple):
    job: TrainingJob
    artifact: Artifact
    bundle: bytes

    def __repr__(self) -> str:  # hypothesis prints fixtures; the bundle is 100 kB
        return f"Ingested({self.artifact.public_id}, {len(self.bundle)} bytes)"


@pytest.fixture
def ingested(finalizing) -> Ingested:
    """A succeeded job and its verified adapter, stored through the real ingest."""
    job, attempt, bundle, sha = finalizing
    key = storage.bundle_key(job.project_id, job.public_id, attempt.number)
    storage.save_stream(key, [bundle])
    artifact = artifact_ingest(attempt_pk=attempt.pk, reported_sha256=sha)
    assert artifact is not None
    job.refresh_from_db()
    return Ingested(job, artifact, bundle)


@pytest.fixture
def admin_client(make_user) -> Client:
    """A Django test client signed in as a superuser (the admin's tests)."""
    root = make_user("root", is_staff=True, is_superuser=True)
    client = Client()
    client.force_login(root)
    return client
