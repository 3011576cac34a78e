"""The fake RunPod, tested through real HTTP: payload shapes, lifecycles, auth, rate limits,
injected failures (including those after the action took effect) and the counters."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from tests.support.fakes.runpod_api import API_KEY, FakeRunpod

AUTH = {"Authorization": f"Bearer {API_KEY}"}
H100 = "NVIDIA H100 80GB HBM3"
# Every field the v2 Pod schema marks required, plus gpu (present for GPU pods).
POD_FIELDS = {
    "id", "name", "status", "actions", "image", "args", "disk", "mounts", "ports", "env",
    "registry", "cloud", "dataCenterId", "cudaVersion", "ssh", "template", "cost", "locked",
    "runtime", "createdAt", "startedAt", "globalNetworking", "gpu",
}  # fmt: skip


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1_767_225_600.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def http() -> Iterator[requests.Session]:
    with requests.Session() as session:
        session.headers.update(AUTH)
        yield session


def pod_body(name: str = "trainhub-job-1", **extra: object) -> dict[str, object]:
    return {"name": name, "image": "trainhub/gpu:1", "gpu": {"id": H100, "count": 1}, **extra}


def create(http: requests.Session, fake: FakeRunpod, **extra: object) -> dict:
    response = http.post(f"{fake.url}/pods", json=pod_body(**extra), timeout=5)
    assert response.status_code == 201, response.text
    return response.json()


# --- pods --------------------------------------------------------------------------------------


def test_create_returns_the_documented_pod(http: requests.Session) -> None:
    with FakeRunpod() as fake:
        pod = create(http, fake, env={"K": "V"}, ports=["22/tcp"])
    assert set(pod) >= POD_FIELDS
    assert re.fullmatch(r"[a-z0-9]{14}", pod["id"])
    assert pod["status"] == "PROVISIONING" and pod["actions"] == ["stop", "terminate"]
    assert pod["gpu"]["id"] == H100 and pod["gpu"]["count"] == 1
    assert pod["cost"] == 2.99 and pod["env"] == {"K": "V"} and pod["ports"] == ["22/tcp"]
    assert pod["ssh"]["direct"] is None and pod["ssh"]["proxy"]["host"] == "ssh.runpod.io"
    assert pod["runtime"] is None and pod["startedAt"] is None
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", pod["createdAt"])


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        (pod_body(bogus=1), 422, "additional properties 'bogus' not allowed"),
        ({"image": "x", "gpu": {"id": H100}}, 422, "missing properties: 'name'"),
        ({"name": "x", "gpu": {"id": H100}}, 422, "missing properties: 'image'"),
        (pod_body(gpu={"id": H100, "spot": True}), 422, "additional properties 'spot'"),
        (pod_body(gpu={"count": 1}), 422, "$.gpu: missing properties: 'id'"),
        ({"name": "x", "image": "x"}, 400, "exactly one of gpu or cpu"),
        (pod_body(cpu={"id": "cpu5c", "vcpuCount": 2}), 400, "exactly one of gpu or cpu"),
        (pod_body(gpu={"id": "NVIDIA B200"}), 400, "no longer any instances available"),
    ],
)
def test_create_validates_like_the_api(
    http: requests.Session, body: dict, status: int, needle: str
) -> None:
    with FakeRunpod(unavailable_gpus=("NVIDIA B200",)) as fake:
        response = http.post(f"{fake.url}/pods", json=body, timeout=5)
        assert fake.created_names() == []
    assert response.status_code == status
    assert response.headers["Content-Type"] == "application/problem+json"
    problem = response.json()
    assert problem["status"] == status and problem["title"] and problem["detail"]
    assert needle in " ".join([problem["detail"], *problem.get("errors", [])])


def test_a_template_replaces_the_image_and_a_cpu_pod_needs_no_gpu(
    http: requests.Session,
) -> None:
    with FakeRunpod() as fake:
        body = {"name": "cpu", "templateId": "tpl", "cpu": {"id": "cpu5c", "vcpuCount": 4}}
        pod = http.post(f"{fake.url}/pods", json=body, timeout=5).json()
    assert pod["cpu"] == {"id": "cpu5c", "vcpuCount": 4, "memory": 8} and "gpu" not in pod
    assert pod["cudaVersion"] is None and pod["cost"] == 0.16


def test_pod_becomes_running_with_direct_ssh_only_when_22_is_exposed(
    http: requests.Session, clock: Clock
) -> None:
    fake = FakeRunpod(pod_ready_seconds=10, ssh_address=("127.0.0.1", 2222), clock=clock)
    with fake:
        with_ssh = create(http, fake, ports=["22/tcp"])
        without = create(http, fake, name="no-ssh", ports=["8888/http"])

        def get(pod: dict) -> dict:
            return http.get(f"{fake.url}/pods/{pod['id']}", timeout=5).json()

        assert get(with_ssh)["status"] == "PROVISIONING"
        clock.now += 5
        assert get(with_ssh)["status"] == "STARTING" and get(with_ssh)["ssh"]["direct"] is None
        clock.now += 5
        running, plain = get(with_ssh), get(without)
    assert running["status"] == plain["status"] == "RUNNING"
    assert running["actions"] == ["stop", "restart", "terminate"]
    assert running["ssh"]["direct"] == {
        "host": "127.0.0.1",
        "port": 2222,
        "username": "root",
        "command": "ssh root@127.0.0.1 -p 2222",
    }
    assert running["runtime"]["ports"] == [
        {"private": 22, "public": 2222, "type": "tcp", "ip": "127.0.0.1"}
    ]
    assert running["startedAt"] is not None and running["runtime"]["uptime"] == 0
    assert plain["ssh"]["direct"] is None and plain["runtime"]["ports"] == []


def test_a_pod_that_never_gets_ready_stays_starting_and_billed(
    http: requests.Session, clock: Clock
) -> None:
    fake = FakeRunpod(pod_never_ready=True, ssh_address=("127.0.0.1", 2222), clock=clock)
    with fake:
        pod = create(http, fake, ports=["22/tcp"])
        clock.now += 3600
        seen = http.get(f"{fake.url}/pods/{pod['id']}", timeout=5).json()
    assert seen["status"] == "STARTING" and seen["ssh"]["direct"] is None
    assert seen["runtime"] is None and seen["cost"] == 2.99


def test_list_filters_by_name_and_delete_ends_the_pod(http: requests.Session) -> None:
    with FakeRunpod() as fake:
        a, b = create(http, fake, name="job-a"), create(http, fake, name="job-b")
        listed = http.get(f"{fake.url}/pods", params={"name": "job-a"}, timeout=5).json()
        assert [p["id"] for p in listed["pods"]] == [a["id"]]
        assert http.delete(f"{fake.url}/pods/{a['id']}", timeout=5).status_code == 204
        assert [p["id"] for p in http.get(f"{fake.url}/pods", timeout=5).json()["pods"]] == [
            b["id"]
        ]
        gone = http.get(f"{fake.url}/pods/{a['id']}", timeout=5)
        again = http.delete(f"{fake.url}/pods/{a['id']}", timeout=5)
        unknown = http.delete(f"{fake.url}/pods/nosuchpod00000", timeout=5)
        terminated = [p for p in fake.pods(include_terminated=True) if p["id"] == a["id"]]
    assert gone.status_code == again.status_code == unknown.status_code == 404
    assert gone.json() == {"title": "Not Found", "status": 404, "detail": "pod not found"}
    assert terminated[0]["status"] == "TERMINATED" and terminated[0]["cost"] == 0.0
    assert [p["id"] for p in fake.live_pods()] == [b["id"]]


def test_name_filter_can_be_ignored_like_the_documented_v2_list(http: requests.Session) -> None:
    with FakeRunpod(honor_name_filter=False) as fake:
        create(http, fake, name="job-a")
        create(http, fake, name="job-b")
        listed = http.get(f"{fake.url}/pods", params={"name": "job-a"}, timeout=5).json()
    assert len(listed["pods"]) == 2


def test_exit_pod_is_an_unasked_stop(http: requests.Session) -> None:
    with FakeRunpod() as fake:
        pod = create(http, fake)
        fake.exit_pod(pod["id"])
        seen = http.get(f"{fake.url}/pods", timeout=5).json()["pods"]
    assert [(p["status"], p["cost"], p["actions"]) for p in seen] == [
        ("EXITED", 0.0, ["start", "terminate"])
    ]
    assert seen[0]["runtime"] is None and [p["id"] for p in fake.live_pods()] == [pod["id"]]


def test_created_names_keeps_every_create_in_order(http: requests.Session) -> None:
    with FakeRunpod() as fake:
        for name in ("a", "b", "a"):
            create(http, fake, name=name)
        assert fake.created_names() == ["a", "b", "a"]


# --- serverless ----------------------------------------------------------------------------------


def test_job_follows_its_script_and_records_when(http: requests.Session, clock: Clock) -> None:
    fake = FakeRunpod(queue_seconds=2, run_seconds=10, progress_events=4, clock=clock)
    with fake:
        submitted = http.post(f"{fake.url}/ep1/run", json={"input": {"attempt": 2}}, timeout=5)
        job_id = submitted.json()["id"]

        def status() -> dict:
            return http.get(f"{fake.url}/ep1/status/{job_id}", timeout=5).json()

        queued = status()
        clock.now += 2 + 10 * 2 / 5  # two of four metrics events into the run
        running = status()
        clock.now += 10
        done = status()
    assert submitted.status_code == 200 and submitted.json()["status"] == "IN_QUEUE"
    assert re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[0-9a-f]{4}-[0-9a-f]{12}-u1", job_id)
    assert queued == {"id": job_id, "status": "IN_QUEUE"}
    assert running["status"] == "IN_PROGRESS" and running["delayTime"] == 2000
    assert running["output"]["attempt"] == 2
    assert [e["type"] for e in running["output"]["events"]] == ["status", "metrics", "metrics"]
    assert "executionTime" not in running
    assert done["status"] == "COMPLETED" and done["executionTime"] == 10_000
    output = done["output"]
    assert output["status"] == "succeeded" and re.fullmatch(r"[0-9a-f]{64}", output["sha256"])
    assert output["events"][-1]["data"] == {
        "status": "succeeded",
        "sha256": output["sha256"],
        "size": output["size"],
    }
    assert [e["seq"] for e in output["events"]] == list(range(6))
    t0 = 1_767_225_600.0
    assert fake.status_changes(job_id) == [
        ("IN_QUEUE", t0),
        ("IN_PROGRESS", t0 + 2),
        ("COMPLETED", t0 + 12),
    ]


def test_script_job_can_fail_a_job_and_cancel_stops_it(
    http: requests.Session, clock: Clock
) -> None:
    with FakeRunpod(run_seconds=5, clock=clock) as fake:
        ids = [
            http.post(f"{fake.url}/ep1/run", json={"input": {}}, timeout=5).json()["id"]
            for _ in range(3)
        ]
        fake.script_job(ids[0], final_status="FAILED", error="oom: CUDA out of memory")
        fake.script_job(ids[1], run_seconds=math.inf)
        clock.now += 1
        cancelled = http.post(f"{fake.url}/ep1/cancel/{ids[1]}", timeout=5).json()
        clock.now += 10
        failed, stopped, completed = (
            http.get(f"{fake.url}/ep1/status/{i}", timeout=5).json() for i in ids
        )
        late_cancel = http.post(f"{fake.url}/ep1/cancel/{ids[2]}", timeout=5).json()
        with pytest.raises(ValueError, match="unknown script keys"):
            fake.script_job(ids[0], bogus=1)
    assert failed["status"] == "FAILED" and failed["error"] == "oom: CUDA out of memory"
    assert "output" not in failed
    assert cancelled == {"id": ids[1], "status": "CANCELLED"} and stopped["status"] == "CANCELLED"
    assert [s for s, _ in fake.status_changes(ids[1])] == ["IN_QUEUE", "IN_PROGRESS", "CANCELLED"]
    assert completed["status"] == late_cancel["status"] == "COMPLETED"


def test_unknown_timed_out_and_expired_jobs(http: requests.Session, clock: Clock) -> None:
    with FakeRunpod(run_seconds=30, result_retention_seconds=1800, clock=clock) as fake:

        def run(**policy: int) -> str:
            body = {"input": {}, "policy": policy}
            return http.post(f"{fake.url}/ep1/run", json=body, timeout=5).json()["id"]

        slow, short_ttl = run(executionTimeout=10_000), run(ttl=20_000)
        clock.now += 25
        timed_out = http.get(f"{fake.url}/ep1/status/{slow}", timeout=5).json()
        expired = http.get(f"{fake.url}/ep1/status/{short_ttl}", timeout=5)
        unknown = http.get(f"{fake.url}/ep1/status/nope-u1", timeout=5)
        other_endpoint = http.get(f"{fake.url}/ep2/status/{slow}", timeout=5)
        cancel_unknown = http.post(f"{fake.url}/ep1/cancel/nope-u1", timeout=5)
        clock.now += 1800
        result_gone = http.get(f"{fake.url}/ep1/status/{slow}", timeout=5)
    assert timed_out["status"] == "TIMED_OUT" and timed_out["executionTime"] == 10_000
    assert {
        r.status_code for r in (expired, unknown, other_endpoint, cancel_unknown, result_gone)
    } == {404}


# --- auth, limits, chaos, stats ---------------------------------------------------------------


def test_auth_is_required(http: requests.Session) -> None:
    with FakeRunpod() as fake:
        bare = requests.get(f"{fake.url}/pods", timeout=5)
        wrong = requests.get(f"{fake.url}/pods", headers={"Authorization": "Bearer x"}, timeout=5)
        serverless = requests.get(f"{fake.url}/ep1/status/x", timeout=5)
        raw_key = requests.post(
            f"{fake.url}/ep1/run", json={"input": {}}, headers={"Authorization": API_KEY}, timeout=5
        )
        stats = fake.stats()
    assert bare.status_code == wrong.status_code == serverless.status_code == 401
    assert bare.json()["detail"] == "missing bearer token"
    assert bare.headers["Content-Type"] == "application/problem+json"
    assert serverless.json() == {"error": "Unauthorized"}
    assert raw_key.status_code == 200  # the serverless docs send the key without "Bearer"
    assert stats["responses"] == {"401": 3, "200": 1}


def test_rate_limit_answers_429_with_retry_after(http: requests.Session, clock: Clock) -> None:
    with FakeRunpod(rate_limits={"status": (5, 10.0)}, clock=clock) as fake:
        codes = []
        for _ in range(6):
            codes.append(http.get(f"{fake.url}/ep1/status/x", timeout=5))
            clock.now += 1
        clock.now += 4  # the first call has left the window
        after = http.get(f"{fake.url}/ep1/status/x", timeout=5)
        stats = fake.stats()
    assert [r.status_code for r in codes] == [404] * 5 + [429]
    limited = codes[-1]
    assert limited.headers["Retry-After"] == "5"
    assert limited.json()["status"] == 429 and "5 requests per 10 s" in limited.json()["detail"]
    assert after.status_code == 404
    assert stats["429"] == {"rate_limit": 1, "injected": 0}
    assert stats["max_window_calls"]["status"] == 6
    assert stats["calls"] == {"status": 7} and stats["rate_limits"]["run"] == [1000, 10.0]


def test_injected_failures_hit_the_configured_share(http: requests.Session) -> None:
    with FakeRunpod(failure_rate=0.3, seed=11, rate_limits={"pods.list": (10_000, 10)}) as fake:
        codes = Counter(http.get(f"{fake.url}/pods", timeout=5).status_code for _ in range(1000))
        stats = fake.stats()
    failures = 1000 - codes[200]
    assert 240 <= failures <= 360  # mean 300, sd 14.5: four sd either side
    assert set(codes) <= {200, 500, 503, 429}  # a read never fails after the effect
    assert sum(stats["injected"].values()) == failures
    assert stats["429"]["injected"] == codes[429] and stats["429"]["rate_limit"] == 0


def test_the_same_seed_fails_the_same_calls(http: requests.Session) -> None:
    def run(seed: int) -> list[int]:
        with FakeRunpod(failure_rate=0.5, seed=seed) as fake:
            return [http.get(f"{fake.url}/pods", timeout=5).status_code for _ in range(60)]

    assert run(3) == run(3) != run(4)


def test_failures_after_the_effect_really_apply_the_action(http: requests.Session) -> None:
    with FakeRunpod(failure_rate=1.0, seed=5, rate_limits={"pods.create": (10_000, 10)}) as fake:
        outcomes = Counter()
        for i in range(60):
            try:
                response = http.post(f"{fake.url}/pods", json=pod_body(f"job-{i}"), timeout=5)
            except requests.ConnectionError:
                outcomes["dropped"] += 1
            else:
                outcomes[response.status_code] += 1
                if response.status_code == 502:
                    assert response.headers["Content-Type"].startswith("text/html")
        stats = fake.stats()
        created = fake.created_names()
    assert outcomes["dropped"] and outcomes[502] and not outcomes[201]
    assert stats["injected"]["502_after"] == outcomes[502]
    assert stats["injected"]["drop_after"] == outcomes["dropped"] == stats["responses"]["dropped"]
    assert len(created) == len(fake.live_pods()) == outcomes[502] + outcomes["dropped"]


def test_a_dropped_delete_still_terminates(http: requests.Session) -> None:
    with FakeRunpod() as fake:
        pod = create(http, fake)
        fake.failure_rate = 1.0
        for _ in range(20):  # until the chaos picks a failure after the effect
            try:
                response = http.delete(f"{fake.url}/pods/{pod['id']}", timeout=5)
            except requests.ConnectionError:
                break
            if response.status_code == 502:
                break
        assert fake.live_pods() == []
        assert fake.pods(include_terminated=True)[0]["status"] == "TERMINATED"


def test_concurrent_clients_lose_nothing() -> None:
    with FakeRunpod() as fake:

        def submit(_: int) -> list[str]:
            with requests.Session() as session:
                url, body = f"{fake.url}/ep1/run", {"input": {}}
                return [
                    session.post(url, json=body, headers=AUTH, timeout=10).json()["id"]
                    for _ in range(50)
                ]

        with ThreadPoolExecutor(16) as pool:
            ids = [job for batch in pool.map(submit, range(16)) for job in batch]
        stats = fake.stats()
    assert len(set(ids)) == len(fake.job_ids()) == stats["calls"]["run"] == 800
    assert stats["responses"] == {"200": 800} and stats["max_window_calls"]["run"] == 800


def test_latency_is_added_to_each_request(http: requests.Session) -> None:
    with FakeRunpod(latency_seconds=0.2) as fake:
        response = http.get(f"{fake.url}/pods", timeout=5)
    assert response.elapsed.total_seconds() >= 0.2


def test_unknown_routes_and_methods(http: requests.Session) -> None:
    with FakeRunpod() as fake:
        assert http.get(f"{fake.url}/nothing/here/at/all", timeout=5).status_code == 404
        assert http.put(f"{fake.url}/pods", json={}, timeout=5).status_code == 405
        assert http.get(f"{fake.url}/ep1/run", timeout=5).status_code == 405


# --- control routes and the separate process --------------------------------------------------


def test_control_routes(http: requests.Session, clock: Clock) -> None:
    with FakeRunpod(clock=clock) as fake:
        base = fake.url.removesuffix("/v2") + "/_fake"
        job = http.post(f"{fake.url}/ep1/run", json={"input": {}}, timeout=5).json()["id"]
        script = {"default": {"queue_seconds": 1}, "jobs": {job: {"run_seconds": 3}}}
        assert requests.post(f"{base}/script", json=script, timeout=5).json() == {"scripted": 1}
        later = http.post(f"{fake.url}/ep1/run", json={"input": {}}, timeout=5).json()["id"]
        clock.now += 5
        changes = requests.get(f"{base}/status_changes", timeout=5).json()["jobs"]
        bad = requests.post(f"{base}/script", json={"default": {"bogus": 1}}, timeout=5)
        stats = requests.get(f"{base}/stats", timeout=5).json()
    t0 = 1_767_225_600.0
    assert changes[job] == [["IN_QUEUE", t0], ["IN_PROGRESS", t0], ["COMPLETED", t0 + 3]]
    assert changes[later] == [["IN_QUEUE", t0], ["IN_PROGRESS", t0 + 1], ["COMPLETED", t0 + 1]]
    assert bad.status_code == 400 and "bogus" in bad.json()["error"]
    assert stats["calls"] == {"run": 2}  # control routes are not counted


@pytest.mark.slow
def test_runs_as_a_separate_process() -> None:
    root = Path(__file__).resolve().parents[2]
    command = [
        sys.executable,
        "-m",
        "tests.support.fakes.runpod_api",
        "--port",
        "0",
        "--latency",
        "0.01",
    ]
    command += ["--rate-limit", "status=3/10", "--failure-rate", "0"]
    process = subprocess.Popen(command, cwd=root, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        url = process.stdout.readline().strip()
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/v2", url)
        codes = [
            requests.get(f"{url}/ep/status/x", headers=AUTH, timeout=5).status_code
            for _ in range(4)
        ]
        stats = requests.get(url.removesuffix("/v2") + "/_fake/stats", timeout=5).json()
    finally:
        process.terminate()
        process.wait(timeout=10)
    assert codes == [404, 404, 404, 429]
    assert stats["calls"] == {"status": 4} and stats["rate_limits"]["status"] == [3, 10.0]
    assert process.returncode == 0
