"""Attacks on the operator-facing boundaries (docs/SECURITY.md, issue 15 findings 5 and 7):
Flower, API throttling, the offers cache, webhook URLs, node names in waiting reasons, the
reconciler's reach, one-way key revocation in the admin, the production switch and the embedded
database's file mode. Each tries the attack through the real path, asserts it is refused and
that nothing stored changed."""

from __future__ import annotations

import json
import math
import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from django.core import signing
from django.db import connection
from django.test import Client
from rest_framework.test import APIClient

from devsupport.processes import free_port
from devsupport.readiness import wait_http_ready
from jobs.models import ApiKey, GpuNode, JobEvent, TrainingJob
from jobs.services.accounts.projects import api_key_create, api_key_revoke, credential_create
from jobs.services.cloud import provider_webhooks as webhooks
from jobs.services.cloud import reconcile
from jobs.services.core.attempts import parse_machine_name
from providers import registry
from providers.base import RemoteState, RemoteStatus
from tests.support.api import assert_error, assert_list
from tests.support.cloud import launched
from tests.support.db import fresh
from tests.support.factories import ProjectFactory
from tests.support.fakes.adapter import FakeAdapter, register_fake
from tests.support.fleet import H100, online_node
from tests.support.processes import database_url
from trainhub.shared_redis import redis_client
from trainhub_contract import celery_conf as cc

ROOT = Path(__file__).resolve().parents[2]


def _child_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The environment of a trainhub process started by a test: this test run's services, its
    own var dir, nothing of the caller's Flower or production settings."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("FLOWER_", "TRAINHUB_", "DJANGO_SECRET"))
    }
    env.update(
        DJANGO_SETTINGS_MODULE="trainhub.settings",
        TRAINHUB_VAR_DIR=str(tmp_path / "var"),
        TRAINHUB_STORAGE_DIR=str(tmp_path / "storage"),
        **extra,
    )
    return env


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def _listening_addresses(port: int) -> set[str]:
    """The local addresses (hex, as the kernel lists them) of TCP sockets listening on
    ``port``, IPv4 and IPv6."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as fh:
            for line in fh.readlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                address, _, hex_port = local.rpartition(":")
                if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                    found.add(address)
    return found


# --- 5. Flower ---------------------------------------------------------------------------------


def test_flower_without_credentials_is_401_and_listens_on_loopback_only(tmp_path: Path) -> None:
    """Procfile's flower (``python -m trainhub.flower``) with no FLOWER_BASIC_AUTH: it generates
    a login (0600) and asks for it; an anonymous page view, API read or task revoke is 401."""
    port = free_port()
    log = tmp_path / "flower.log"
    env = _child_env(tmp_path, FLOWER_PORT=str(port))
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "trainhub.flower"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        anonymous = wait_http_ready(
            f"{base}/", timeout=60, ok=lambda r: r.status_code != 0, proc=proc, log=log
        )
        assert anonymous.status_code == 401, anonymous.text[:300]
        assert anonymous.headers["WWW-Authenticate"].startswith("Basic")
        assert requests.get(f"{base}/api/workers", timeout=5).status_code == 401
        revoke = requests.post(f"{base}/api/task/revoke/some-task-id", timeout=5)
        assert revoke.status_code == 401

        login = tmp_path / "var" / "flower_basic_auth"
        assert stat.S_IMODE(login.stat().st_mode) == 0o600
        user, _, password = login.read_text().strip().partition(":")
        assert password not in log.read_text(), "the launcher says where the login is, not what"
        assert requests.get(f"{base}/", auth=(user, "wrong-password"), timeout=5).status_code == 401
        assert requests.get(f"{base}/", auth=(user, password), timeout=5).status_code == 200

        assert _listening_addresses(port) == {"0100007F"}, "127.0.0.1 only"
    finally:
        _stop(proc)


# --- 7. API throttling -------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_burst_of_api_requests_is_429_with_retry_after_across_web_workers(
    tmp_path: Path, user, project
) -> None:
    """Real gunicorn with two workers that each restart after 3 requests: a count kept in a
    process would start over, so only the shared (Redis) count can refuse the 6th request."""
    if connection.vendor != "postgresql":
        pytest.skip("gunicorn needs a shared server database (PostgreSQL)")
    _, raw = api_key_create(user=user, name="burst")
    _, other_raw = api_key_create(user=user, name="other")
    _forget_throttle_counts()  # key ids restart with each test database
    port = free_port()
    log = tmp_path / "gunicorn.log"
    env = _child_env(
        tmp_path,
        DATABASE_URL=database_url(connection.settings_dict),
        TRAINHUB_API_RATE_LIMIT="5/hour",  # an hour-long window: the burst never straddles two
    )
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "trainhub.wsgi", "-b", f"127.0.0.1:{port}",
             "-w", "2", "--max-requests", "3"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    base = f"http://127.0.0.1:{port}/api/v1"
    bearer = {"Authorization": f"Bearer {raw}"}
    try:
        wait_http_ready(
            f"{base}/jobs/",
            timeout=60,
            ok=lambda r: r.status_code == 401,  # up; unauthenticated calls are not counted
            proc=proc,
            log=log,
        )
        answers = []
        for _ in range(5):  # a fresh connection each: the two workers share the burst
            answers.append(requests.get(f"{base}/jobs/", headers=bearer, timeout=30).status_code)
        assert answers == [200] * 5

        jobs_before = TrainingJob.objects.count()
        refused = requests.post(
            f"{base}/jobs/",
            headers=bearer,
            json={"model": "acme/tiny-llama", "training_file": "file-x"},
            timeout=30,
        )
        assert refused.status_code == 429, refused.text[:300]
        retry_after = int(refused.headers["Retry-After"])
        window_left = 3600 - time.time() % 3600
        assert 0 < retry_after <= math.ceil(window_left) + 1
        error = refused.json()["error"]
        assert (error["type"], error["code"]) == ("rate_limit_error", "rate_limited")
        assert "5/hour per API key" in error["message"]
        assert TrainingJob.objects.count() == jobs_before, "the refused create stored nothing"
        again = requests.get(f"{base}/jobs/", headers=bearer, timeout=30)
        assert again.status_code == 429

        # The count is the key's: another key of the same user still answers.
        other = requests.get(
            f"{base}/jobs/", headers={"Authorization": f"Bearer {other_raw}"}, timeout=30
        )
        assert other.status_code == 200
    finally:
        _stop(proc)
        _forget_throttle_counts()


def _forget_throttle_counts() -> None:
    for key in redis_client().scan_iter("trainhub:throttle:*"):
        redis_client().delete(key)


# --- 7. the offers cache -----------------------------------------------------------------------


@pytest.fixture
def priced_cloud(settings, fresh_provider_state) -> Iterator[FakeAdapter]:
    """A priced cloud needing a 'vastai' key, standing in for the real Vast target (left out
    meanwhile so nothing reaches the real API)."""
    settings.TRAINHUB_PUBLIC_URL = "http://127.0.0.1:8000"
    settings.TRAINHUB_OPERATOR_API_KEYS = {}
    real = registry.get("vastai")
    registry.unregister("vastai")
    adapter = register_fake("priced-cloud", credential_kind="vastai", has_offers=True)
    adapter.add_offer("a-3090", 0.22, gpu="RTX 3090", vram_gb=24)
    adapter.add_offer("a-4090", 0.35, gpu="RTX 4090", vram_gb=24)
    adapter.add_offer("a-l40s", 0.80, gpu="L40S", vram_gb=48)
    yield adapter
    registry.unregister("priced-cloud")
    if real is not None:
        registry.register(real)


def test_varying_the_offers_filter_asks_the_provider_once(api, project, priced_cloud) -> None:
    """Each different GPU name or VRAM figure was a new cache key, so a client could make the
    control plane call the provider (with the project's key, under its rate limit) at will."""
    credential_create(project=project, provider="vastai", name="main", secrets={"api_key": "vk_1"})
    url = "/api/v1/providers/priced-cloud/offers/"
    names = ["*4090*", "*3090*", "RTX*", "*L40S*", "nothing-like-it", "*"]
    seen = {}
    for name in names:
        seen[name] = [
            o["offer_id"] for o in assert_list(api.get(url, {"gpu": name, "min_vram_gb": 24}))
        ]
    for vram in (24, 25, 30.5, 31.9):
        assert_list(api.get(url, {"min_vram_gb": vram}))

    assert len(priced_cloud.offer_queries) == 1, priced_cloud.offer_queries
    assert priced_cloud.offer_queries == [{"count": 1, "min_vram_gb": 24}]
    # Filtering happens on the cached list, exactly as asked.
    assert seen["*4090*"] == ["a-4090"] and seen["*3090*"] == ["a-3090"]
    assert seen["*L40S*"] == ["a-l40s"] and seen["nothing-like-it"] == []
    keys = list(redis_client().scan_iter("trainhub:offers:priced-cloud:*"))
    assert len(keys) == 1, "one cache entry for the account and machine shape"


# --- 7. webhook URLs ---------------------------------------------------------------------------


class _SignedLongAgo(signing.TimestampSigner):
    """Signs as webhook_url did ``age`` seconds ago (a URL that leaked back then)."""

    def __init__(self, age: int) -> None:
        super().__init__(salt=webhooks.WEBHOOK_SALT)
        self.age = age

    def timestamp(self) -> str:
        return signing.b62_encode(int(time.time()) - self.age)


@pytest.mark.django_db
def test_an_expired_webhook_url_is_refused_and_polls_nothing(
    fake_cloud, make_job, client, sent, django_capture_on_commit_callbacks
) -> None:
    job, attempt = launched(make_job)
    redis_client().delete(f"trainhub:webhook-poll:{attempt.pk}")
    age = job.max_runtime_seconds + webhooks.WEBHOOK_SLACK_SECONDS + 60
    token = _SignedLongAgo(age).sign(str(attempt.pk))
    events = JobEvent.objects.filter(job=job).count()
    sent.clear()

    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(f"/api/v1/webhooks/provider/{token}/", {}, format="json")
    assert_error(response, 403, code="webhook_expired")
    assert sent.calls == [], "no poll was sent"
    assert (fresh(job).status, JobEvent.objects.filter(job=job).count()) == (job.status, events)

    # The URL the launch handed out, still within its time, is answered.
    fresh_url = fake_cloud.launches[-1].webhook_url.removeprefix("http://127.0.0.1:8000")
    with django_capture_on_commit_callbacks(execute=True):
        assert client.post(fresh_url, {}, format="json").status_code == 200
    assert sent.named(cc.POLL_ATTEMPT) == [[attempt.pk]]


# --- 7. node names in waiting reasons ----------------------------------------------------------


def test_a_tenant_sees_no_node_name_in_waiting_reasons_or_events(
    api, make_job, dispatch_now, make_user
) -> None:
    """The dispatcher words a wait with the operator's node names and states; a tenant's job
    and its events say why by kind only, while the operator's admin keeps the detail."""
    online_node("lab-secret-h100", H100)
    running = make_job()
    busy = make_job()  # the one node that fits is taken by ``running``
    unfit = make_job(gpu={"count": 2})  # no node has two GPUs
    assert dispatch_now() == 1
    assert fresh(running).status == "provisioning"

    for job, kind in ((busy, "is busy"), (unfit, "meets its gpu needs")):
        shown = api.get(f"/api/v1/jobs/{job.public_id}/").json()
        assert shown["status"] == "queued"
        assert kind in shown["waiting_reason"]
        assert "lab-secret" not in shown["waiting_reason"]
        events = assert_list(api.get(f"/api/v1/jobs/{job.public_id}/events/"))
        assert not [e for e in events if "lab-secret" in e["message"]], events
        assert [e for e in events if kind in e["message"]]
        assert "lab-secret" not in json.dumps(events)

    # Stored as it was: the operator still sees the detail.
    assert "lab-secret-h100 (busy)" in fresh(busy).waiting_reason
    assert "lab-secret-h100 has 1 GPU(s)" in fresh(unfit).waiting_reason
    admin = Client()
    admin.force_login(make_user("ops", is_staff=True, is_superuser=True))
    page = admin.get(f"/admin/jobs/trainingjob/{busy.pk}/change/").content.decode()
    assert "lab-secret-h100 (busy)" in page
    assert GpuNode.objects.filter(name="lab-secret-h100").exists()


# --- 7. the reconciler's reach -----------------------------------------------------------------


@pytest.fixture
def per_account_cloud(settings) -> Iterator[dict[str, FakeAdapter]]:
    """A cloud needing a 'vastai' key whose machines are per account: api key → the account's
    scripted adapter (the real Vast target is left out meanwhile)."""
    settings.TRAINHUB_OPERATOR_API_KEYS = {}
    accounts: dict[str, FakeAdapter] = {}

    def factory(secrets: dict[str, str]) -> FakeAdapter:
        return accounts.setdefault(secrets["api_key"], FakeAdapter(name="acct-cloud"))

    real = registry.get("vastai")
    registry.unregister("vastai")
    registry.register(
        registry.Target(
            name="acct-cloud",
            description="Scripted per-account fake provider (tests only).",
            kind=registry.TargetKind.SSH_MACHINE,
            credential_kind="vastai",
            adapter_factory=factory,
        )
    )
    yield accounts
    registry.unregister("acct-cloud")
    if real is not None:
        registry.register(real)


def _machine(account: FakeAdapter, instance_id: str, name: str) -> None:
    account.states[instance_id] = RemoteState(RemoteStatus.RUNNING, "running")
    account.names[instance_id] = name


def test_a_machine_named_after_another_projects_job_does_not_touch_that_job(
    per_account_cloud, make_job, project
) -> None:
    """A tenant with its own key names a machine in its own account after someone else's job:
    the reconciler terminates it there but writes nothing into that job."""
    credential_create(project=project, provider="vastai", name="v", secrets={"api_key": "vk_v"})
    attacker = ProjectFactory()
    credential_create(project=attacker, provider="vastai", name="a", secrets={"api_key": "vk_a"})
    victim_job = make_job()
    forged = f"trainhub-{victim_job.public_id}-a1"
    assert parse_machine_name(forged) == (victim_job.public_id, 1)
    before = (fresh(victim_job).status, JobEvent.objects.filter(job=victim_job).count())
    per_account_cloud["vk_a"] = FakeAdapter(name="acct-cloud")
    _machine(per_account_cloud["vk_a"], "evil-1", forged)

    assert reconcile.providers_reconcile() == 1

    assert per_account_cloud["vk_a"].cancelled_ids == ["evil-1"], "ended in its own account"
    after = (fresh(victim_job).status, JobEvent.objects.filter(job=victim_job).count())
    assert after == before, "nothing was written into the other project's job"

    # The same machine in the job's own account is reported to the job.
    _machine(per_account_cloud["vk_v"], "own-1", forged)
    assert reconcile.providers_reconcile() == 1
    note = JobEvent.objects.filter(job=victim_job, message__startswith="Reconciler").get()
    assert "own-1" in note.message


# --- 7. one-way revocation in the admin --------------------------------------------------------


def test_the_admin_cannot_unrevoke_an_api_key(user, project, make_user) -> None:
    key, raw = api_key_create(user=user, name="laptop")
    api_key_revoke(key=key)
    revoked_at = ApiKey.objects.get(pk=key.pk).revoked_at
    assert revoked_at is not None
    admin = Client()
    admin.force_login(make_user("ops", is_staff=True, is_superuser=True))

    response = admin.post(
        f"/admin/jobs/apikey/{key.pk}/change/",
        {"name": "laptop again", "revoked_at_0": "", "revoked_at_1": "", "_save": "Save"},
    )

    assert response.status_code == 302, response.content[:500]  # saved: the name may change
    stored = ApiKey.objects.get(pk=key.pk)
    assert (stored.name, stored.revoked_at) == ("laptop again", revoked_at)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert_error(client.get("/api/v1/jobs/"), 401)
    page = admin.get(f"/admin/jobs/apikey/{key.pk}/change/").content.decode()
    assert 'name="revoked_at' not in page, "no input for it"


# --- 7. the production switch ------------------------------------------------------------------


def _manage(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT, env=_child_env(tmp_path, **env), capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_check_deploy_is_clean_with_the_production_switch(tmp_path: Path) -> None:
    """Without it, a deployment sends session and CSRF cookies over plain HTTP and never tells
    browsers to stay on HTTPS; ``check --deploy`` says so. With it, nothing is left to say."""
    plain = _manage(tmp_path, "check", "--deploy", "--fail-level", "WARNING")
    assert plain.returncode != 0
    for warning in ("security.W004", "security.W008", "security.W012", "security.W016"):
        assert warning in plain.stderr + plain.stdout

    production = _manage(
        tmp_path,
        "check",
        "--deploy",
        "--fail-level",
        "WARNING",
        TRAINHUB_PRODUCTION="1",
        TRAINHUB_PUBLIC_URL="https://trainhub.example.com",
    )
    assert production.returncode == 0, production.stderr + production.stdout
    assert "no issues" in production.stdout


# --- 7. the embedded database file -------------------------------------------------------------


def test_the_embedded_sqlite_database_is_readable_by_its_owner_only(tmp_path: Path) -> None:
    """Even under umask 000 the database (API key hashes, encrypted provider keys, every
    tenant's jobs), its WAL files and the var dir are the owner's only; an older world-readable
    file is tightened on start."""
    script = (
        "import os, json, stat\n"
        "os.umask(0)\n"
        "import django; django.setup()\n"
        "from django.conf import settings\n"
        "from django.db import connection\n"
        "with connection.cursor() as c:\n"
        "    c.execute('CREATE TABLE IF NOT EXISTS t (x int)'); c.execute('INSERT INTO t VALUES (1)')\n"
        "name = str(settings.DATABASES['default']['NAME'])\n"
        "modes = {p: oct(stat.S_IMODE(os.stat(p).st_mode)) for p in"
        " (name, name + '-wal', name + '-shm', os.path.dirname(name)) if os.path.exists(p)}\n"
        "print(json.dumps(modes))\n"
    )
    env = _child_env(tmp_path)
    env.pop("DATABASE_URL", None)  # the embedded default

    def run() -> dict[str, str]:
        done = subprocess.run(
            [sys.executable, "-c", script],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout.strip().splitlines()[-1])

    database = tmp_path / "var" / "trainhub.sqlite3"
    modes = run()
    assert modes == {
        str(database): "0o600",
        f"{database}-wal": "0o600",
        f"{database}-shm": "0o600",
        str(database.parent): "0o700",
    }
    database.chmod(0o644)  # as an earlier trainhub left it
    assert run()[str(database)] == "0o600"
