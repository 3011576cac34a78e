"""Shared fixtures. Tests run on the real PostgreSQL and Redis named by DATABASE_URL and
CELERY_BROKER_URL (see Makefile); outbound network is blocked except loopback and unix sockets.

Every test gets exactly one of these markers, from what it uses (``pytest_collection_modifyitems``
below), so ``pytest -m unit`` runs the fast ones and ``-m "not process"`` everything but the
ones that start processes:

- ``unit``: neither the database nor a process;
- ``db``: the test database (``db``, ``transactional_db``, a ``django_db`` mark), no process;
- ``process``: a real process or server (``PROCESS_FIXTURES``: control worker, GPU nodes, the
  stream process, sshd, moto, gunicorn, Flower, the live server, ...) or marked ``slow``;
- and ``e2e`` besides ``process`` for everything under tests/e2e (the whole stack).

``make test`` runs them on pytest-xdist workers (``-n``, ``--dist loadgroup``): each worker has
its own test database, Redis database, live channel prefix and broker users (tests/support/processes.py).
The tests of a module with a module-scoped fixture run on one worker (``xdist_group``), except
the e2e ones, and the modules are handed out e2e first, then process, db and unit (the long
ones first, the short ones fill the gaps at the end).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from rest_framework.test import APIClient

from gpu_worker.tiny_model import DEMO_DATASET_PATH
from tests.support.processes import (
    ROOT,
    STREAM_BUFFER_MESSAGES,
    WORKER_PLUGIN,
    check_parallel_redis,
    database_url,
    procfile_command,
    redis_db,
)
from trainhub_contract import celery_conf

# The control plane's shared fixtures (dispatch, clouds, ingest, the admin client), for every
# folder that tests it (api, console, jobs, security, e2e).
pytest_plugins = ["tests.support.fixtures"]

# --- parallel runs, markers and order -------------------------------------------------------
# Fixtures that start a real process or server (directly or through another fixture): a test
# using one is marked ``process``.
PROCESS_FIXTURES = frozenset(
    {
        "control_worker",  # tests/e2e: the control plane's Celery worker (module-scoped)
        "start_node",  # tests/e2e: GPU node workers
        "flower",  # tests/e2e/test_flower.py
        "worker",  # tests/jobs/test_worker_process.py: a Celery worker (module-scoped)
        "stream_server",  # the Procfile's stream process
        "sshd",  # a real OpenSSH server
        "s3_endpoint",  # moto's S3 server
        "web",  # tests/trainhub/test_static_files.py: the Procfile's gunicorn
        "trainhub",  # tests/cli: the installed console script
        "executor_run",  # tests/gpu_worker/test_log_events.py: the real executor
        "live_server",  # pytest-django's threaded server (transactional, HTTP)
    }
)
# The two cores are shared by the xdist workers and every process they start (control workers,
# nodes, executors, also over the loopback sshd): one OpenMP thread each. Torch's default, a
# thread per core, oversubscribes them, and OpenMP's spinning threads then made the same
# training 3-7x slower in the parallel run than alone (issue 28). Set before anything starts.
ONE_TORCH_THREAD = {"OMP_NUM_THREADS": "1"}
_TIERS = ("e2e", "process", "db", "unit")  # also the order modules are handed out in


def _tier(item: pytest.Item) -> str:
    names = set(getattr(item, "fixturenames", ()))
    callspec = getattr(item, "callspec", None)
    s3_param = callspec is not None and callspec.params.get("storage_backend") == "s3"
    if item.path.is_relative_to(Path(__file__).parent / "e2e"):
        return "e2e"
    if names & PROCESS_FIXTURES or s3_param or item.get_closest_marker("slow"):
        return "process"
    if names & {"db", "transactional_db"} or item.get_closest_marker("django_db"):
        return "db"
    return "unit"


def _uses_module_fixture(item: pytest.Item) -> bool:
    """Whether the test uses a module- or class-scoped fixture (a module's control worker, a
    training run shared by a module's tests): its module then runs on one xdist worker, so the
    fixture is set up once, as in a serial run, not once on every worker."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(
        definitions[-1].scope in ("module", "class", "package")
        and definitions[-1].baseid  # the suite's own, not a plugin's (pytest-django's unittest)
        for name, definitions in info.name2fixturedefs.items()
        if definitions and name in info.names_closure
    )


@pytest.hookimpl(tryfirst=True)  # before xdist reads the xdist_group marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test with its tier (module docstring); keep the tests that share a module's
    fixture on one worker; run the modules of the slowest tier first (stable: a module keeps
    its order)."""
    module_rank: dict[Path, int] = {}
    for item in items:
        tier = _tier(item)
        item.add_marker(tier)
        if tier == "e2e":
            item.add_marker("process")
        # Not the e2e modules: their tests run for minutes each, so spreading them over the
        # workers pays far more than the module's control worker costs to start again.
        if tier != "e2e" and _uses_module_fixture(item):
            item.add_marker(pytest.mark.xdist_group(item.path.relative_to(ROOT).as_posix()))
        rank = _TIERS.index(tier)
        module_rank[item.path] = min(rank, module_rank.get(item.path, rank))
    if hasattr(config, "workerinput"):  # the order xdist hands the tests out in
        items.sort(key=lambda item: module_rank[item.path])


def pytest_configure(config: pytest.Config) -> None:
    """One torch thread for this process and all it starts (``ONE_TORCH_THREAD``). In the
    controller of a parallel run (``-n``): check that each worker can have a Redis database of
    its own, and have the workers load tests/support/processes.py as a plugin, which gives them
    their own services before the settings are read."""
    for name, value in ONE_TORCH_THREAD.items():
        os.environ.setdefault(name, value)
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        check_parallel_redis(os.environ, config.option.numprocesses)
        plugins = [p for p in os.environ.get("PYTEST_PLUGINS", "").split(",") if p]
        if WORKER_PLUGIN not in plugins:
            os.environ["PYTEST_PLUGINS"] = ",".join([*plugins, WORKER_PLUGIN])


@pytest.fixture(autouse=True, scope="session")
def _own_broker_users() -> Iterator[None]:
    """Nodes' broker users (Redis ACL, jobs/broker_acl.py) are server-wide, in no database: the
    users of this run's nodes are named after its Redis database (trainhub<db>-node-<name>), so
    a test here never replaces, deletes or disconnects another run's (or xdist worker's) node
    user of the same name. Set in the environment: this process and the processes it starts
    (the control worker, the nodes) name them alike."""
    from django.conf import settings

    name = celery_conf.BROKER_USER_PREFIX_ENV
    with pytest.MonkeyPatch.context() as mp:
        with contextlib.suppress(ValueError):  # not redis://: no ACLs (single-tenant)
            if not os.environ.get(name):
                mp.setenv(name, f"trainhub{redis_db(settings.CELERY_BROKER_URL)}-node-")
        yield


_real_connect = socket.socket.connect
_real_connect_ex = socket.socket.connect_ex


def _check_address(sock: socket.socket, address: object) -> None:
    if sock.family == socket.AF_UNIX:
        return
    host = address[0] if isinstance(address, tuple) else address
    try:
        if ipaddress.ip_address(host).is_loopback:
            return
    except ValueError:
        if host == "localhost":
            return
    raise RuntimeError(f"tests must not reach the network (tried {address!r})")


def _guarded_connect(sock: socket.socket, address: object) -> None:
    _check_address(sock, address)
    return _real_connect(sock, address)


def _guarded_connect_ex(sock: socket.socket, address: object) -> int:
    _check_address(sock, address)
    return _real_connect_ex(sock, address)


@pytest.fixture(autouse=True, scope="session")
def _block_outbound_network() -> Iterator[None]:
    socket.socket.connect = _guarded_connect  # type: ignore[method-assign]
    socket.socket.connect_ex = _guarded_connect_ex  # type: ignore[method-assign]
    yield
    socket.socket.connect = _real_connect  # type: ignore[method-assign]
    socket.socket.connect_ex = _real_connect_ex  # type: ignore[method-assign]


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random-init Llama + tokenizer, built offline once for the whole session."""
    import torch

    # Two cores shared with other processes: one intra-op thread avoids OpenMP oversubscription,
    # which made the same run 10-20x slower under load here.
    torch.set_num_threads(1)
    from gpu_worker.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("model") / "tiny-llama")


@dataclass(frozen=True)
class SshServer:
    """The loopback sshd of the ``sshd`` fixture and the one client key it accepts."""

    host: str
    port: int
    username: str
    private_key: str  # OpenSSH PEM text
    public_key: str  # 'ssh-ed25519 AAAA... comment'
    host_key: str  # the server's key, 'ssh-ed25519 AAAA...'
    authorized_keys: Path  # append a key line to let it in (as a RunPod image does at boot)


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshServer]:
    """A real OpenSSH server on 127.0.0.1 (one per session) with a throwaway host key, accepting
    one client key generated for this session; logs in as root (tests run as root).

    Without openssh-server installed, the tests that use it are skipped, saying how to install
    it (`make services` installs it when run as root)."""
    from cryptography.hazmat.primitives import serialization as ser
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from devsupport.processes import sshd_missing_reason, sshd_server

    if missing := sshd_missing_reason():
        pytest.skip(missing)
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        ser.Encoding.PEM, ser.PrivateFormat.OpenSSH, ser.NoEncryption()
    ).decode()
    public = key.public_key().public_bytes(ser.Encoding.OpenSSH, ser.PublicFormat.OpenSSH)
    public_line = public.decode() + " trainhub-test"
    workdir = tmp_path_factory.mktemp("sshd")
    # The executors it runs share the two cores with the rest of the suite: one torch thread.
    with sshd_server(workdir, public_line, env=ONE_TORCH_THREAD) as (port, host_key):
        yield SshServer(
            "127.0.0.1", port, "root", private, public_line, host_key, workdir / "authorized_keys"
        )


@pytest.fixture(autouse=True)
def _isolated_storage(settings, tmp_path: Path) -> None:
    settings.TRAINHUB_STORAGE_DIR = tmp_path / "storage"


@pytest.fixture(scope="session")
def s3_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real S3 HTTP API on loopback (moto's server, one process per session)."""
    from devsupport.processes import moto_s3_server

    with pytest.MonkeyPatch.context() as mp:
        # boto3's credential chain stops at the environment: no config files, no metadata service.
        for name, value in {
            "AWS_ACCESS_KEY_ID": "AKIDTRAINHUBTEST",
            "AWS_SECRET_ACCESS_KEY": "trainhub-test-secret",
            "AWS_SESSION_TOKEN": "",
            "AWS_CONFIG_FILE": "/dev/null",
            "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
            "AWS_EC2_METADATA_DISABLED": "true",
        }.items():
            mp.setenv(name, value) if value else mp.delenv(name, raising=False)
        with moto_s3_server(tmp_path_factory.mktemp("moto") / "moto.log") as endpoint:
            yield endpoint


@pytest.fixture
def s3_storage(settings, s3_endpoint: str) -> str:
    """S3 storage for this test: a fresh bucket on the moto server."""
    from jobs import storage

    settings.TRAINHUB_STORAGE = "s3"
    settings.TRAINHUB_S3_ENDPOINT_URL = s3_endpoint
    settings.TRAINHUB_S3_REGION = "us-east-1"
    settings.TRAINHUB_S3_ADDRESSING_STYLE = "path"
    settings.TRAINHUB_S3_BUCKET = f"trainhub-{uuid.uuid4().hex[:16]}"
    storage.backend().client.create_bucket(Bucket=settings.TRAINHUB_S3_BUCKET)
    return "s3"


@pytest.fixture(params=["local", "s3"])
def storage_backend(request: pytest.FixtureRequest) -> str:
    """Run the test once per storage backend: a folder, and S3 (a fresh bucket on moto)."""
    if request.param == "s3":
        request.getfixturevalue("s3_storage")
    return str(request.param)


@pytest.fixture
def make_user(db, django_user_model) -> Callable[..., object]:
    def make(username: str = "alice", **extra: object) -> object:
        return django_user_model.objects.create_user(
            username=username, password="pw-unused", **extra
        )

    return make


@pytest.fixture
def user(make_user):
    return make_user("alice")


@pytest.fixture
def bob(make_user):
    """Another user: what is alice's must be a 404 to him."""
    return make_user("bob")


@pytest.fixture
def project(user):
    from jobs.services.accounts.projects import project_default_for_user

    return project_default_for_user(user=user)


@pytest.fixture
def make_client(db) -> Callable[..., APIClient]:
    """An API client authenticated with a fresh bearer key of ``user``."""
    from jobs.services.accounts.projects import api_key_create

    def make(user, project=None) -> APIClient:
        _, raw = api_key_create(user=user, name="test", project=project)
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
        return client

    return make


@pytest.fixture
def api(make_client, user, project) -> APIClient:
    return make_client(user)


@pytest.fixture
def other_client(make_client, bob) -> APIClient:
    """bob's API client, next to alice's ``api``."""
    return make_client(bob)


@pytest.fixture
def demo_dataset() -> bytes:
    return DEMO_DATASET_PATH.read_bytes()


@pytest.fixture
def make_file(db, project, user):
    """Store and validate a training file through the services (no broker involved)."""
    from jobs.services.core.files import file_create, file_validate

    def make(content: bytes | None = None, *, proj=None, validate: bool = True):
        body = DEMO_DATASET_PATH.read_bytes() if content is None else content
        record = file_create(
            project=proj or project, user=user, filename="data.jsonl", chunks=[body]
        )
        if validate:
            file_validate(file_pk=record.pk)
            record.refresh_from_db()
        return record

    return make


@pytest.fixture
def make_job(db, project, user, make_file):
    """A job created through job_create (files validated, so it lands in ``queued``)."""
    from jobs.services.core.jobs import job_create

    def make(proj=None, **fields):
        proj = proj or project
        data = {
            "model": "acme/tiny-llama",
            "training_file": make_file(proj=proj).public_id,
            **fields,
        }
        job, _ = job_create(project=proj, user=user, data=data)
        return job

    return make


# --- the stream process ----------------------------------------------------------------------
@dataclass(frozen=True)
class StreamServer:
    url: str  # http://127.0.0.1:<port>
    log: Path

    @property
    def ws_url(self) -> str:
        return "ws" + self.url.removeprefix("http")

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def stream_server(
    django_db_setup, django_db_blocker, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[StreamServer]:
    from django.conf import settings
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("the stream process needs a shared server database (PostgreSQL)")
    port = _free_port()
    log = tmp_path_factory.mktemp("stream") / "stream.log"
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "trainhub.settings",
        "DATABASE_URL": database_url(connection.settings_dict),
        "CELERY_BROKER_URL": settings.CELERY_BROKER_URL,
        "TRAINHUB_LIVE_PREFIX": settings.TRAINHUB_LIVE_PREFIX,
        "TRAINHUB_LIVE_BUFFER_MESSAGES": str(STREAM_BUFFER_MESSAGES),
        # The web side's redirect grants (api/inference_grant) and server keys are this
        # process's: the same signing and encryption keys.
        "DJANGO_SECRET_KEY": settings.SECRET_KEY,
        "TRAINHUB_ENCRYPTION_KEYS": ",".join(settings.TRAINHUB_ENCRYPTION_KEYS),
        # uvicorn's keepalive (--ws-ping-timeout, 20 s) would close a watcher that a test keeps
        # from reading (tests/api/live: the slow client) while a flood lasts longer than that, as it
        # does on a machine busy with other tests; what the tests check is the stream's buffer.
        "UVICORN_WS_PING_TIMEOUT": "600",
    }
    with log.open("ab") as out:
        proc = subprocess.Popen(
            procfile_command("stream", port),
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    server = StreamServer(f"http://127.0.0.1:{port}", log)
    try:
        _wait_listening(port, proc, server)
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def _wait_listening(port: int, proc: subprocess.Popen, server: StreamServer) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"the stream process exited:\n{server.tail()}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    pytest.fail(f"the stream process did not listen within 30 s:\n{server.tail()}")
