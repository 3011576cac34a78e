"""VM-style cloud targets (``vastai``, ``lambda``, ``runpod-pod``) through the services and
tasks with their real adapters: the real database and Redis (offer cache, locks, the shared
rate limiter), ``responses`` answering each provider's REST API with its documented shapes
(tests/providers/*_payloads.py), and the session's loopback OpenSSH server standing in for the
rented machine, so the executor really is started over SSH.

The test plays the machine's boot: it appends the attempt's public key to the sshd's
authorized_keys, as Vast's onstart and Lambda's key registration do on a real machine."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import signal
import stat
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import responses

from jobs import tasks
from jobs.models import JobAttempt, JobEvent, TrainingJob
from jobs.services.accounts.projects import credential_create
from jobs.services.cloud import offers, reconcile, remote
from jobs.services.core.attempts import attempt_end, attempt_start, machine_name
from jobs.states import EndReason, JobStatus
from providers import lambda_cloud, vastai
from providers.base import SshAddress
from tests.providers import lambda_payloads as lp
from tests.providers import runpod_payloads as rp
from tests.providers import vast_payloads as vp

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fresh_provider_state")]
S = JobStatus

VAST = vp.BASE
LAMBDA = lp.BASE
RUNPOD = "https://rest.runpod.io/v2"
KEYS = {"vastai": "vast_KEY_7c1e", "lambda": "secret_lambda_KEY_5d2a", "runpod": "rpa_KEY_9b3f"}
OFFER_A, OFFER_B = 21614864, 21614990  # Vast asks, A the cheaper
MACHINE_A, MACHINE_B = 26070301, 26070302  # the instances their creates make
LAMBDA_INSTANCE = "0920582c7ff041399e34823a0be62549"
EVENTS_TIMEOUT = 60.0  # the executor imports torch and transformers before its first event


@pytest.fixture
def remote_root(settings, tmp_path: Path, monkeypatch) -> Path:
    """Settings for rented machines: the provider URLs ``responses`` answers, a public address
    nothing listens on (the executor's dataset download fails fast: these tests are about the
    SSH path), and the executor run by this interpreter in a temporary directory."""
    root = tmp_path / "remote"
    settings.VAST_API_URL = VAST
    settings.LAMBDA_API_URL = LAMBDA
    settings.LAMBDA_INSTANCE_TYPES = []
    settings.LAMBDA_REGIONS = []
    settings.RUNPOD_REST_URL = RUNPOD
    settings.RUNPOD_POD_CLOUD = "SECURE"
    settings.RUNPOD_ENDPOINT_ID = ""  # runpod-serverless is not configured: never asked
    settings.TRAINHUB_PUBLIC_URL = "http://127.0.0.1:9"
    settings.TRAINHUB_REMOTE_DIR = str(root)
    settings.TRAINHUB_REMOTE_PYTHON = sys.executable
    settings.TRAINHUB_REMOTE_SETUP = ""
    settings.TRAINHUB_OPERATOR_API_KEYS = {}  # only the project's own credentials are used
    return root


@pytest.fixture
def executors(remote_root: Path) -> Iterator[Path]:
    """The remote root; every executor started under it dies with the test (what terminating
    the machine does to its processes: the "machine" here is this one's sshd)."""
    yield remote_root
    for pid_file in remote_root.glob("*/pid"):
        with contextlib.suppress(OSError, ValueError):
            os.killpg(int(pid_file.read_text()), signal.SIGKILL)  # setsid: pid = its group


@pytest.fixture
def http() -> Iterator[responses.RequestsMock]:
    """Every provider call goes here, never to the network (an unanswered one is a
    ConnectionError: the adapter's transient error)."""
    with responses.RequestsMock(assert_all_requests_are_fired=False) as mock:
        yield mock


def provider_calls(mock: responses.RequestsMock) -> list[Any]:
    """The calls to the providers these tests answer for. ``responses`` patches every thread of
    the test process, so a call another thread makes at the time (a reporter of an earlier
    in-process executor test, say) is recorded too; it is no provider call of this test's."""
    ours = (RUNPOD, LAMBDA, VAST, vp.V1, "https://api.runpod.ai")
    return [c for c in mock.calls if c.request.url.startswith(ours)]


def calls(mock: responses.RequestsMock, method: str, url: str | re.Pattern[str] = "") -> list[Any]:
    def hit(u: str) -> bool:
        return not url or (
            url.fullmatch(u) is not None if isinstance(url, re.Pattern) else u == url
        )

    return [c for c in mock.calls if c.request.method == method and hit(c.request.url)]


def body(call: Any) -> Any:
    return json.loads(call.request.body)


def url_pattern(base: str, tail: str) -> re.Pattern[str]:
    return re.compile(re.escape(base) + tail)


def live_attempt(job: TrainingJob) -> JobAttempt:
    return JobAttempt.objects.get(job=job, ended_at__isnull=True)


def boot_with_key(sshd: Any, public_key: str) -> None:
    """What the machine does at boot with the attempt's key (Vast's onstart, Lambda's key)."""
    with sshd.authorized_keys.open("a") as out:
        out.write(public_key + "\n")


def assert_executor_started(attempt: JobAttempt, sshd: Any, root: Path) -> Path:
    """Claimed over SSH: the address and the host key trusted on first use are stored, and
    the attempt's directory holds the spec (owner-only: it carries signed URLs) and a pid."""
    assert attempt.claimed_at is not None, "the executor was started"
    assert (attempt.ssh_host, attempt.ssh_port) == ("127.0.0.1", sshd.port)
    assert attempt.ssh_host_key == sshd.host_key, "trusted on first use and stored"
    directory = Path(remote.remote_dir(attempt, SshAddress("127.0.0.1", sshd.port)))
    assert directory.parent == root and directory.name == f"{attempt.job.public_id}-a1"
    spec_file = directory / "spec.json"
    assert stat.S_IMODE(spec_file.stat().st_mode) == 0o600
    spec = json.loads(spec_file.read_text())
    assert (spec["job_id"], spec["attempt"]) == (attempt.job.public_id, attempt.number)
    assert spec["report"]["sinks"] == [{"type": "jsonl", "path": f"{directory}/events.jsonl"}]
    assert int((directory / "pid").read_text()) > 1
    return directory


def poll_until(target: str, what: str, check: Any, log: Path) -> None:
    """Poll ``target`` (every attempt due now) until ``check()``; bounded."""
    deadline = time.monotonic() + EVENTS_TIMEOUT
    while not check():
        if time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-3000:] if log.exists() else "(no log)"
            pytest.fail(f"no {what} within {EVENTS_TIMEOUT:.0f} s; executor.log:\n{tail}")
        time.sleep(0.3)
        JobAttempt.objects.update(next_poll_at=None)
        tasks.poll_target(target)


# --- Vast.ai: SSH executor ------------------------------------------------------------------


def vast_machine(instance_id: int, label: str, public_key: str, ssh_port: int) -> dict[str, Any]:
    """A running ssh_direct instance whose 22/tcp is mapped to the loopback sshd's port."""
    return vp.instance(
        instance_id,
        "running",
        label=label,
        public_key=public_key,
        public_ipaddr="127.0.0.1",
        ports={"22/tcp": [{"HostIp": "0.0.0.0", "HostPort": str(ssh_port)}]},  # noqa: S104
    )


def test_a_vast_machine_gets_the_executor_over_ssh_and_its_events_reach_the_job(
    remote_root, executors, http, make_job, project, sshd, sent
) -> None:
    credential_create(
        project=project, provider="vastai", name="main", secrets={"api_key": KEYS["vastai"]}
    )
    http.post(f"{VAST}/bundles/", json={"offers": [vp.offer(OFFER_A)]})
    http.get(vp.LIST_URL, json=vp.listing())  # launch's look-up: no lost create
    http.put(f"{VAST}/asks/{OFFER_A}/", json=vp.created(MACHINE_A))
    http.post(f"{VAST}/instances/{MACHINE_A}/ssh/", json={"success": True})

    job = make_job(target="vastai", gpu={"count": 1, "min_vram_gb": 24})
    tasks.place_job(job.pk)

    attempt = live_attempt(job)
    assert attempt.provider_instance_id == str(MACHINE_A)
    assert attempt.offer["offer_id"] == str(OFFER_A)
    public_key = remote.attempt_public_key(attempt)
    (create,) = calls(http, "PUT", f"{VAST}/asks/{OFFER_A}/")
    assert body(create)["env"] == {"TRAINHUB_SSH_PUBLIC_KEY": public_key}, "the attempt's key"
    assert body(create)["label"] == machine_name(attempt)
    assert body(create)["onstart"] == vastai.ONSTART
    (attach,) = calls(http, "POST", f"{VAST}/instances/{MACHINE_A}/ssh/")
    assert body(attach) == {"ssh_key": public_key}
    keys = {c.request.headers["Authorization"] for c in provider_calls(http)}
    assert keys == {f"Bearer {KEYS['vastai']}"}, "every call with the project's Vast key"

    boot_with_key(sshd, public_key)
    http.replace(
        responses.GET,
        vp.LIST_URL,
        json=vp.listing(vast_machine(MACHINE_A, machine_name(attempt), public_key, sshd.port)),
    )
    JobAttempt.objects.update(next_poll_at=None)
    tasks.poll_target("vastai")

    attempt.refresh_from_db()
    directory = assert_executor_started(attempt, sshd, remote_root)
    assert attempt.billed_rate_per_hour is not None, "Vast's dph_total is the billed rate"

    # Later polls connect again with the stored host key and tail events.jsonl.
    poll_until(
        "vastai",
        "the executor's start line",
        lambda: JobEvent.objects.filter(
            job=job, attempt=1, message__startswith=f"Attempt 1 of {job.public_id}: "
        ).exists(),
        directory / "executor.log",
    )
    stored = list(JobEvent.objects.filter(job=job, attempt=1).order_by("seq"))
    assert stored[0].seq == 0 and stored[0].type == "log"
    # The executor's own start line (library warnings captured as log events may come first).
    assert any(e.message.startswith(f"Attempt 1 of {job.public_id}: ") for e in stored)
    attempt.refresh_from_db()
    written = (directory / "events.jsonl").read_bytes()[: attempt.events_offset]
    assert [json.loads(line)["seq"] for line in written.splitlines()] == [e.seq for e in stored]
    assert attempt.ssh_host_key == sshd.host_key


# --- Lambda: SSH executor -------------------------------------------------------------------


def test_a_lambda_machine_gets_the_attempts_key_and_the_executor_over_ssh(
    remote_root, executors, http, make_job, project, sshd, sent, monkeypatch
) -> None:
    credential_create(
        project=project, provider="lambda", name="main", secrets={"api_key": KEYS["lambda"]}
    )
    http.get(f"{LAMBDA}/instance-types", json=lp.instance_types((lp.A10, ["us-east-1"])))
    http.get(f"{LAMBDA}/instances", json={"data": []})  # launch's look-up: none of the attempt's
    http.get(f"{LAMBDA}/ssh-keys", json={"data": []})

    def register_key(request: Any) -> tuple[int, dict[str, str], str]:
        sent_key = json.loads(request.body)
        answer = lp.ssh_key("b5d2c1a0", sent_key["name"], sent_key["public_key"])
        return 200, {}, json.dumps({"data": answer})

    http.add_callback(
        responses.POST, f"{LAMBDA}/ssh-keys", callback=register_key, content_type="application/json"
    )
    http.post(
        f"{LAMBDA}/instance-operations/launch", json={"data": {"instance_ids": [LAMBDA_INSTANCE]}}
    )

    job = make_job(target="lambda", gpu={"count": 1})
    tasks.place_job(job.pk)

    attempt = live_attempt(job)
    assert attempt.provider_instance_id == LAMBDA_INSTANCE
    public_key = remote.attempt_public_key(attempt)
    key = lambda_cloud.key_name(public_key)
    (registration,) = calls(http, "POST", f"{LAMBDA}/ssh-keys")
    assert body(registration) == {"name": key, "public_key": public_key}
    (launch,) = calls(http, "POST", f"{LAMBDA}/instance-operations/launch")
    assert body(launch) == {
        "region_name": "us-east-1",
        "instance_type_name": "gpu_1x_a10",
        "ssh_key_names": [key],
        "quantity": 1,
        "name": machine_name(attempt),
    }

    boot_with_key(sshd, public_key)  # Lambda installs the registered key for the login user
    up = lp.instance(LAMBDA_INSTANCE, "active", name=machine_name(attempt), itype=lp.A10)
    http.replace(responses.GET, f"{LAMBDA}/instances", json={"data": [{**up, "ip": "127.0.0.1"}]})
    # Lambda's SSH address is always ubuntu@<ip>:22; the loopback sshd listens on a free port
    # and logs in as root. Only the address is moved there: the adapter's own reading of the
    # instance (status, price, host) is kept and checked.
    real_state = lambda_cloud.instance_state
    addresses: list[SshAddress | None] = []

    def on_loopback(instance: object) -> Any:
        state = real_state(instance)
        addresses.append(state.ssh)
        if state.ssh is None:
            return state
        moved = dataclasses.replace(state.ssh, port=sshd.port, username="root")
        return dataclasses.replace(state, ssh=moved)

    monkeypatch.setattr(lambda_cloud, "instance_state", on_loopback)
    JobAttempt.objects.update(next_poll_at=None)
    tasks.poll_target("lambda")

    assert addresses == [SshAddress("127.0.0.1", lambda_cloud.SSH_PORT, lambda_cloud.SSH_USER)]
    attempt.refresh_from_db()
    assert_executor_started(attempt, sshd, remote_root)
    assert str(attempt.billed_rate_per_hour) == "0.7500", "the type's price_cents_per_hour"


# --- the reconciler across the real adapters ------------------------------------------------


def attempt_on(make_job: Any, target: str, instance_id: str, *, ended: bool = False) -> JobAttempt:
    """An attempt of a new job whose machine ``instance_id`` the provider accepted."""
    job = make_job(target=target, max_attempts=1)
    attempt = attempt_start(job=job, target=target)
    JobAttempt.objects.filter(pk=attempt.pk).update(provider_instance_id=instance_id)
    attempt.refresh_from_db()
    if ended:
        attempt_end(attempt=attempt, reason=EndReason.WORKER_LOST, message="the host went away")
    return attempt


def test_the_reconciler_terminates_exactly_the_orphans_at_each_provider(
    remote_root, http, make_job, project, sent
) -> None:
    for kind, key in KEYS.items():
        credential_create(project=project, provider=kind, name="main", secrets={"api_key": key})
    ids = {
        "runpod-pod": ("rp-live-1", "rp-ended-2", "rp-orphan-3", "rp-theirs-4"),
        "lambda": tuple(f"{LAMBDA_INSTANCE[:-1]}{n}" for n in range(1, 5)),
        "vastai": ("26070401", "26070402", "26070403", "26070404"),
    }
    names: dict[str, tuple[str, ...]] = {}
    owners: dict[str, tuple[JobAttempt, JobAttempt, TrainingJob]] = {}
    for target, (live_id, ended_id, _orphan_id, _theirs) in ids.items():
        live = attempt_on(make_job, target, live_id)
        ended = attempt_on(make_job, target, ended_id, ended=True)
        unowned = make_job(target=target)  # its machine's id was never stored (a lost answer)
        owners[target] = (live, ended, unowned)
        names[target] = (
            machine_name(live),
            machine_name(ended),
            f"trainhub-{unowned.public_id}-a1",
            "jupyter-workstation",  # the account holder's own machine: not ours
        )

    pods = zip(ids["runpod-pod"], names["runpod-pod"], strict=True)
    http.get(
        f"{RUNPOD}/pods",
        json={
            "pods": [rp.pod(i, "RUNNING", name=n, public_key="ssh-ed25519 AAAA x") for i, n in pods]
        },
    )
    http.add(responses.DELETE, url_pattern(RUNPOD, r"/pods/[^/]+"), status=204)

    lambdas = zip(ids["lambda"], names["lambda"], strict=True)
    http.get(
        f"{LAMBDA}/instances", json={"data": [lp.instance(i, "active", name=n) for i, n in lambdas]}
    )
    http.post(
        f"{LAMBDA}/instance-operations/terminate", json={"data": {"terminated_instances": []}}
    )
    http.get(f"{LAMBDA}/ssh-keys", json={"data": []})  # the cancel's key clean-up: none of ours

    vasts = zip(ids["vastai"], names["vastai"], strict=True)
    http.get(vp.LIST_URL, json=vp.listing(*(vp.instance(i, label=n) for i, n in vasts)))
    http.add(responses.DELETE, url_pattern(VAST, r"/instances/\d+/"), json={"success": True})

    started = time.monotonic()
    terminated = reconcile.providers_reconcile()
    took = time.monotonic() - started

    assert terminated == 6
    orphans = {target: list(i[1:3]) for target, i in ids.items()}
    deleted_pods = calls(http, "DELETE", url_pattern(RUNPOD, r"/pods/[^/]+"))
    assert [c.request.url.rsplit("/", 1)[1] for c in deleted_pods] == orphans["runpod-pod"]
    terminations = calls(http, "POST", f"{LAMBDA}/instance-operations/terminate")
    assert [body(c) for c in terminations] == [{"instance_ids": [i]} for i in orphans["lambda"]]
    destroyed = calls(http, "DELETE", url_pattern(VAST, r"/instances/\d+/"))
    assert [c.request.url.split("/")[-2] for c in destroyed] == orphans["vastai"]
    # Nothing else was changed anywhere, and runpod-serverless (not configured) was not asked.
    changes = [c for c in provider_calls(http) if c.request.method != "GET"]
    assert len(changes) == len(deleted_pods) + len(terminations) + len(destroyed)
    asked = {c.request.url for c in provider_calls(http)}
    assert not [u for u in asked if u.startswith("https://api.runpod.ai")], "serverless: never"
    # Vast allows one destroy per 3.3 s (its published limit, kept by the shared limiter): the
    # second orphan waits for it; the other providers' few calls are not held up.
    assert took < 3.3 * (len(orphans["vastai"]) - 1) + 5, f"reconcile took {took:.1f} s"

    for target, (live, ended, unowned) in owners.items():
        assert JobAttempt.objects.get(pk=live.pk).ended_at is None, "the live machine is spared"
        ended_id, orphan_id = orphans[target]
        (about_ended,) = ended.job.events.filter(message__startswith="Reconciler terminated")
        assert about_ended.message == (
            f"Reconciler terminated {target} machine {ended_id} ({names[target][1]}): "
            "attempt 1 ended (worker_lost)."
        )
        assert about_ended.level == "warning"
        (about_orphan,) = unowned.events.filter(message__startswith="Reconciler terminated")
        assert about_orphan.data == {"instance": orphan_id, "reason": "no attempt owns it"}
        assert not live.job.events.filter(message__startswith="Reconciler").exists()


# --- the Vast create that fails yet leaves an instance ----------------------------------------


class VastAccount:
    """Vast's side of one account, for the calls placement and launch make: a create whose
    answer names ``new_contract`` made that instance, whatever else the answer says (a bid too
    low creates it stopped); a destroy removes it; the list shows what is there."""

    def __init__(self, mock: responses.RequestsMock, creates: dict[int, tuple[int, dict]]):
        self.instances: dict[int, dict[str, Any]] = {}
        self._creates = creates  # offer id -> (HTTP status, answer)
        json_type = "application/json"
        mock.add_callback(responses.GET, vp.LIST_URL, callback=self._list, content_type=json_type)
        mock.add_callback(
            responses.PUT,
            url_pattern(VAST, r"/asks/\d+/"),
            callback=self._create,
            content_type=json_type,
        )
        mock.add_callback(
            responses.DELETE,
            url_pattern(VAST, r"/instances/\d+/"),
            callback=self._destroy,
            content_type=json_type,
        )
        mock.add(responses.POST, url_pattern(VAST, r"/instances/\d+/ssh/"), json={"success": True})

    def _list(self, request: Any) -> tuple[int, dict, str]:
        return 200, {}, json.dumps(vp.listing(*self.instances.values()))

    def _create(self, request: Any) -> tuple[int, dict, str]:
        status, answer = self._creates[int(request.url.split("/")[-2])]
        made = answer.get("new_contract")
        if made is not None:
            label = json.loads(request.body)["label"]
            state = "running" if answer.get("success") else "stopped"
            self.instances[made] = vp.instance(
                made,
                "loading" if state == "running" else "stopped",
                label=label,
                intended_status=state,
                cur_state=state,
                next_state=state,
            )
        return status, {}, json.dumps(answer)

    def _destroy(self, request: Any) -> tuple[int, dict, str]:
        instance_id = int(request.url.split("/")[-2])
        if self.instances.pop(instance_id, None) is None:
            return 404, {}, json.dumps(vp.error("no_such_instance", "Instance not found."))
        return 200, {}, json.dumps({"success": True})


@pytest.mark.parametrize(
    "refusal",
    [
        # 2xx, success false, the offer gone (NoCapacity): the next offer is tried.
        (200, vp.error("no_such_ask", "offer taken", new_contract=MACHINE_A)),
        # 400, the bid below the ask's minimum now (the market moved): the next offer too.
        (400, vp.error("invalid_price", "bid price too low", new_contract=MACHINE_A)),
        # 400, a refusal that no other offer changes (permanent): the attempt ends, saying why.
        (400, vp.error("invalid_args", "image is required", new_contract=MACHINE_A)),
    ],
    ids=["no-capacity-next-offer", "bid-too-low-next-offer", "permanent-attempt-ends"],
)
def test_a_vast_create_that_fails_but_left_an_instance_destroys_it(
    refusal, remote_root, http, make_job, project, sent
) -> None:
    credential_create(
        project=project, provider="vastai", name="main", secrets={"api_key": KEYS["vastai"]}
    )
    http.post(
        f"{VAST}/bundles/",
        json={
            "offers": [
                vp.offer(OFFER_B, dph_total=0.45, machine_id=7702),
                vp.offer(OFFER_A, dph_total=0.30, machine_id=7701),
            ]
        },
    )
    account = VastAccount(http, {OFFER_A: refusal, OFFER_B: (200, vp.created(MACHINE_B))})

    job = make_job(target="vastai", gpu={"count": 1, "min_vram_gb": 24}, max_attempts=1)
    tasks.place_job(job.pk)

    destroyed = [c.request.url for c in calls(http, "DELETE")]
    assert destroyed == [f"{VAST}/instances/{MACHINE_A}/"], "the leaked instance, once"
    creates = [c.request.url for c in calls(http, "PUT")]
    attempt = JobAttempt.objects.get(job=job)
    job.refresh_from_db()
    said = refusal[1]["msg"]
    if refusal[1]["error"] != "invalid_args":
        assert creates == [f"{VAST}/asks/{OFFER_A}/", f"{VAST}/asks/{OFFER_B}/"]
        assert attempt.ended_at is None and attempt.number == 1
        assert attempt.offer["offer_id"] == str(OFFER_B)
        assert attempt.provider_instance_id == str(MACHINE_B), "not the leaked one, found by label"
        assert job.status == S.PROVISIONING
        refused = offers.refused_reasons([vp.trainhub_offer(vp.offer(OFFER_A))])
        assert said in refused[("vastai", str(OFFER_A))]
    else:
        assert creates == [f"{VAST}/asks/{OFFER_A}/"], "a permanent refusal tries no other"
        assert attempt.end_reason == EndReason.PROVIDER_ERROR
        assert job.status == S.FAILED and said in job.error_message
    # Whatever the outcome, every instance left in the account is a live attempt's.
    owned = set(
        JobAttempt.objects.filter(ended_at__isnull=True)
        .exclude(provider_instance_id="")
        .values_list("provider_instance_id", flat=True)
    )
    assert {str(i) for i in account.instances} == owned
