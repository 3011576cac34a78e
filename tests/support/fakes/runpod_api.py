"""A fake RunPod on loopback: REST v2 pods and serverless queue jobs over real HTTP.

One ThreadingHTTPServer serves both APIs under ``/v2``, so RUNPOD_REST_URL and
RUNPOD_SERVERLESS_URL can both be ``fake.url``. Payloads follow runpod/docs
``api-reference-v2/openapi.json`` (Pod, CreatePodRequest, ErrorResponse; 2026 snapshot) and
``serverless/endpoints/operation-reference.mdx``; where the docs say nothing, a comment says the
shape is a guess. One lock guards all state; chaos draws and ids come from generators seeded by
``seed``, so a run is reproducible for a given order of requests. Times come from ``clock`` (the
wall clock by default, so another process can compare ``status_changes`` with what it saw).

    with FakeRunpod(failure_rate=0.3, seed=7, pod_ready_seconds=2.0) as fake:
        requests.get(fake.url + "/pods", headers={"Authorization": "Bearer rp-test-key"})

As a process: ``python -m tests.support.fakes.runpod_api --port 8765 --latency 0.05`` prints its URL and
adds control routes (no auth, chaos or limits): ``GET /_fake/stats``,
``GET /_fake/status_changes[?id=...]`` and ``POST /_fake/script`` with
``{"default": {...}, "jobs": {"<job id>": {...}}}`` (keys as in :meth:`FakeRunpod.script_job`).
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import http.server
import json
import math
import random
import signal
import string
import threading
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qs, urlsplit

API_KEY = "rp-test-key"
# Serverless: RunPod's documented per-endpoint limits (send-requests.mdx). Pods: not documented
# per route, so a guess at something sane.
DEFAULT_RATE_LIMITS = {"run": (1000, 10.0), "status": (2000, 10.0), "cancel": (100, 10.0)}
DEFAULT_RATE_LIMITS |= {f"pods.{op}": (100, 10.0) for op in ("create", "list", "get", "delete")}
DEFAULT_RATE_LIMITS["catalog"] = (100, 10.0)
# (bucket, method, path after /v2); "*" captures a segment. Pods first: "pods" is no endpoint.
ROUTES = (
    ("pods.list", "GET", ("pods",)),
    ("pods.create", "POST", ("pods",)),
    ("pods.get", "GET", ("pods", "*")),
    ("pods.delete", "DELETE", ("pods", "*")),
    ("catalog", "GET", ("catalog", "gpus")),
    ("run", "POST", ("*", "run")),
    ("status", "GET", ("*", "status", "*")),
    ("cancel", "POST", ("*", "cancel", "*")),
)
MUTATING = frozenset({"pods.create", "pods.delete", "run", "cancel"})
FAILURES = ("500", "503", "429")
AFTER_EFFECT_FAILURES = ("502_after", "drop_after")  # the action took effect, the answer is lost
# CreatePodRequest and CreateGpuConfig are unevaluatedProperties:false (unknown field: 422).
CREATE_FIELDS = {"name", "image", "args", "disk", "env", "ports", "registry", "cloud", "cpu"}
CREATE_FIELDS |= {"gpu", "dataCenterIds", "globalNetworking", "mounts", "startJupyter"}
CREATE_FIELDS |= {"startSsh", "templateId"}
GPU_FIELDS = {"id", "count", "allowedCudaVersions", "minCudaVersion"}
GPU_FIELDS |= {"minRamPerGpu", "minVcpuCountPerGpu"}  # in the 2026 schema; the notes doubted it
# Pod fields echoed from the request, with the defaults a create without them gets.
POD_DEFAULTS = {"image": "", "args": "", "disk": 50, "mounts": {}, "ports": [], "env": {}}
POD_DEFAULTS |= {"registry": None, "cloud": "SECURE", "template": None, "locked": False}
GPU_PRICES = {"NVIDIA H100 80GB HBM3": 2.99, "NVIDIA A100 80GB PCIe": 1.64, "NVIDIA L40S": 0.86}
DEFAULT_GPU_PRICE = 2.49  # USD per GPU-hour for any other GPU id
# The GPU catalogue (GET /v2/catalog/gpus): id → (display name, VRAM GB); priced as pods bill.
CATALOG = {
    "NVIDIA H100 80GB HBM3": ("H100 SXM", 80),
    "NVIDIA A100 80GB PCIe": ("A100 PCIe", 80),
    "NVIDIA L40S": ("L40S", 48),
    "NVIDIA RTX A6000": ("RTX A6000", 48),
    "NVIDIA GeForce RTX 4090": ("RTX 4090", 24),
}
# podAction's description: the actions each status allows (published in the pod's `actions`).
ACTIONS = {"PROVISIONING": ["stop", "terminate"], "STARTING": ["stop", "terminate"]}
ACTIONS |= {"RUNNING": ["stop", "restart", "terminate"], "EXITED": ["start", "terminate"]}
ACTIONS |= {"ERROR": ["start", "terminate"], "TERMINATED": []}
NO_CAPACITY = (
    "There are no longer any instances available with the requested specifications. "
    "Please refresh and try again."
)
TERMINAL = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMED_OUT"})
SCRIPT_KEYS = {"queue_seconds", "run_seconds", "final_status", "progress_events", "output"}
SCRIPT_KEYS |= {"error"}
EVENT_WINDOW = 200  # the handler's RunPod sink sends the latest 200 events
HTML_PAGE = (
    "<html><head><title>{code} {phrase}</title></head><body><center><h1>{code} {phrase}</h1>"
    "</center><hr><center>cloudflare</center></body></html>"
)


@dataclass
class Reply:
    status: int
    body: Any = None  # dict: JSON; str: HTML; None: no body
    headers: dict[str, str] = field(default_factory=dict)
    drop: bool = False  # close the connection without answering


@dataclass(frozen=True)
class _Call:
    bucket: str
    args: tuple[str, ...]  # the "*" segments of the route
    query: dict[str, list[str]]
    body: bytes


@dataclass
class _Pod:
    id: str
    request: dict[str, Any]
    created: float
    proxy_user: str
    exited: float | None = None
    terminated: float | None = None


@dataclass
class _Job:
    id: str
    endpoint: str
    input: Any
    submitted: float
    script: dict[str, Any]
    timeout: float  # policy.executionTimeout in seconds (RunPod's default: 10 min)
    ttl: float  # policy.ttl in seconds from submission (default: 24 h)
    cancelled: float | None = None


def problem(
    status: int, detail: str, errors: list[str] | None = None, retry_after: int = 0
) -> Reply:
    """An RFC 9457 body, as the v2 API's ErrorResponse: title, status, detail, errors?."""
    body: dict[str, Any] = {"title": HTTPStatus(status).phrase, "status": status, "detail": detail}
    if errors:
        body["errors"] = errors
    return Reply(status, body, {"Retry-After": str(retry_after)} if retry_after else {})


def html(status: int) -> Reply:
    """What a proxy in front of an API answers when the API is down: not JSON."""
    return Reply(status, HTML_PAGE.format(code=status, phrase=HTTPStatus(status).phrase))


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _match(method: str, parts: tuple[str, ...]) -> tuple[str, tuple[str, ...]] | int:
    """(bucket, captured segments), or the HTTP status for no such path (404) or method (405)."""
    rest, status = parts[1:], 404
    for bucket, verb, pattern in ROUTES if parts[:1] == ("v2",) else ():
        pairs = list(zip(pattern, rest, strict=False))
        if len(pattern) == len(rest) and all(p in ("*", s) for p, s in pairs):
            if verb == method:
                return bucket, tuple(s for p, s in pairs if p == "*")
            status = 405
    return status


def _validate_create(req: dict[str, Any]) -> list[str]:
    """The 422 ``errors`` of a CreatePodRequest, worded like RunPod's schema validator."""
    errors = [
        f"$: additional properties '{k}' not allowed" for k in sorted(set(req) - CREATE_FIELDS)
    ]
    needed = ("name",) if "templateId" in req else ("name", "image")  # image, unless a template
    if missing := [k for k in needed if not req.get(k) or not isinstance(req[k], str)]:
        errors.append("$: missing properties: " + ", ".join(f"'{k}'" for k in missing))
    gpu = req.get("gpu", {})
    if not isinstance(gpu, dict) or not isinstance(gpu.get("id", ""), str):
        return [*errors, "$.gpu: got a non-object, want {id, count}"]
    errors += [
        f"$.gpu: additional properties '{k}' not allowed" for k in sorted(set(gpu) - GPU_FIELDS)
    ]
    if "gpu" in req and "id" not in gpu:
        errors.append("$.gpu: missing properties: 'id'")
    if not isinstance(gpu.get("count", 1), int) or gpu.get("count", 1) < 1:
        errors.append(f"$.gpu.count: minimum: got {gpu['count']!r}, want 1")
    cpu = req.get("cpu", {})
    if not isinstance(cpu, dict) or ("cpu" in req and not {"id", "vcpuCount"} <= set(cpu)):
        errors.append("$.cpu: missing properties: 'id', 'vcpuCount'")
    return errors


def _timeline(job: _Job) -> list[tuple[str, float]]:
    """Every status the job's script takes it through, with when (possibly in the future)."""
    start = job.submitted + job.script["queue_seconds"]
    run, final = job.script["run_seconds"], job.script["final_status"]
    if run > job.timeout:  # RunPod stops a job at its executionTimeout
        run, final = job.timeout, "TIMED_OUT"
    steps = [("IN_QUEUE", job.submitted), ("IN_PROGRESS", start), (final, start + run)]
    if job.cancelled is not None:
        steps = [st for st in steps[:2] if st[1] < job.cancelled] + [("CANCELLED", job.cancelled)]
    return steps


def _event(seq: int, kind: str, message: str, data: dict[str, Any], ts: float) -> dict[str, Any]:
    """One executor event, shaped like gpu_worker.report's."""
    return {"seq": seq, "type": kind, "level": "info", "message": message, "data": data, "ts": ts}


class FakeRunpod:
    """The fake RunPod; see the module docstring. Its public methods are test controls: no
    chaos, auth or rate limits apply to them.

    - ``failure_rate``: the share of API calls (after auth and rate limits) that fail: 500 HTML,
      503, 429 with Retry-After 1 and, for POST /pods, DELETE, /run and /cancel, 502 HTML or a
      dropped connection *after* the action took effect.
    - ``rate_limits``: bucket -> (calls, window seconds), over DEFAULT_RATE_LIMITS; buckets are
      pods.create, pods.list, pods.get, pods.delete, run, status, cancel.
    - ``pod_ready_seconds``: a pod is PROVISIONING for the first half, STARTING for the second,
      then RUNNING (``pod_never_ready``: STARTING for ever); ``ssh_address`` (host, port) fills
      ``ssh.direct`` of RUNNING pods that expose 22/tcp; ``unavailable_gpus`` answer a create
      with RunPod's no-capacity 400.
    - ``queue_seconds``, ``run_seconds``, ``final_status``, ``progress_events``: every job's
      default script (see script_job); ``result_retention_seconds``: how long a finished job
      stays readable (RunPod: 30 min for /run).
    """

    def __init__(
        self,
        *,
        api_key: str = API_KEY,
        host: str = "127.0.0.1",
        port: int = 0,
        latency_seconds: float = 0.0,
        failure_rate: float = 0.0,
        seed: int = 0,
        rate_limits: dict[str, tuple[int, float]] | None = None,
        pod_ready_seconds: float = 0.0,
        pod_never_ready: bool = False,
        ssh_address: tuple[str, int] | None = None,
        unavailable_gpus: tuple[str, ...] = (),
        honor_name_filter: bool = True,
        queue_seconds: float = 0.0,
        run_seconds: float = 0.0,
        final_status: str = "COMPLETED",
        progress_events: int = 0,
        result_retention_seconds: float = 1800.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.api_key, self.host, self.port = api_key, host, port
        self.latency_seconds, self.failure_rate = latency_seconds, failure_rate
        self.limits = {**DEFAULT_RATE_LIMITS, **(rate_limits or {})}
        self.pod_ready_seconds, self.pod_never_ready = pod_ready_seconds, pod_never_ready
        self.ssh_address, self.unavailable_gpus = ssh_address, frozenset(unavailable_gpus)
        # listPods in the 2026 v2 schema documents only includeClusterPods (v1 had `name`), so a
        # client should filter by name itself; False makes this fake ignore `?name=`.
        self.honor_name_filter = honor_name_filter
        self.result_retention_seconds = result_retention_seconds  # /run results: 30 min
        self._defaults = {"queue_seconds": queue_seconds, "run_seconds": run_seconds}
        self._defaults |= {"final_status": final_status, "progress_events": progress_events}
        self._defaults |= {"output": None, "error": None}
        self._clock, self._lock = clock, threading.Lock()
        self._chaos_rng, self._id_rng = random.Random(seed), random.Random(f"ids-{seed}")  # noqa: S311
        self._pods: dict[str, _Pod] = {}
        self._names: list[str] = []
        self._jobs: dict[str, _Job] = {}
        self._calls: Counter[str] = Counter()
        self._responses: Counter[str] = Counter()
        self._injected: Counter[str] = Counter()
        self._limited = 0
        self._seen: dict[str, deque[float]] = {}  # every call, for max_window_calls
        self._admitted: dict[str, deque[float]] = {}  # calls let through, for the limit
        self._max_window: Counter[str] = Counter()
        self._server: _Server | None = None

    # --- lifecycle ---------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/v2"

    def start(self) -> str:
        self._server = _Server((self.host, self.port), _Handler)
        self._server.fake, self.port = self, self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True).start()
        return self.url

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FakeRunpod:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- test controls -----------------------------------------------------------------------

    def exit_pod(self, pod_id: str) -> None:
        """The pod stops unasked, as a spot interruption or a crash would: EXITED, cost 0."""
        with self._lock:
            pod = self._pods[pod_id]
            if pod.terminated is None and pod.exited is None:
                pod.exited = self._clock()

    def pods(self, include_terminated: bool = False) -> list[dict[str, Any]]:
        with self._lock:
            now, pods = self._clock(), list(self._pods.values())
            return [
                self._pod_view(p, now) for p in pods if include_terminated or p.terminated is None
            ]

    def live_pods(self) -> list[dict[str, Any]]:
        """Pods not TERMINATED: billed, or (EXITED) still holding a disk."""
        return self.pods(include_terminated=False)

    def created_names(self) -> list[str]:
        """The name of every successful create, in order, duplicates included."""
        with self._lock:
            return list(self._names)

    def job_ids(self) -> list[str]:
        with self._lock:
            return list(self._jobs)

    def script_defaults(self, **script: Any) -> None:
        """Change the script of jobs submitted from now on (keys as in script_job)."""
        with self._lock:
            self._defaults.update(_checked(script))

    def script_job(self, job_id: str, **script: Any) -> None:
        """Re-script one job, timed from its submission: ``queue_seconds``, ``run_seconds``
        (math.inf: never ends), ``final_status`` (COMPLETED, FAILED or TIMED_OUT), ``output``
        (the final output; None: a trainhub handler result), ``error`` (a FAILED job's error
        string), ``progress_events`` (metrics events emitted over the run)."""
        with self._lock:
            self._jobs[job_id].script.update(_checked(script))

    def status_changes(self, job_id: str) -> list[tuple[str, float]]:
        """(status, clock time) of every status the job has reached so far, in order."""
        with self._lock:
            now = self._clock()
            return [(s, t) for s, t in _timeline(self._jobs[job_id]) if t <= now]

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {
                "calls": dict(self._calls),  # per bucket, every call (401s and 429s included)
                "responses": dict(self._responses),  # per status code, plus "dropped"
                "429": {"rate_limit": self._limited, "injected": self._injected["429"]},
                "injected": dict(self._injected),  # per failure kind
                "max_window_calls": dict(self._max_window),  # most calls in one limit window
                "rate_limits": {b: list(limit) for b, limit in self.limits.items()},
            }

    # --- requests ----------------------------------------------------------------------------

    def handle(self, method: str, target: str, authorization: str, body: bytes) -> Reply:
        """Answer one HTTP request (the handler thread sleeps the latency around this)."""
        url = urlsplit(target)
        parts, query = tuple(p for p in url.path.split("/") if p), parse_qs(url.query)
        if parts[:1] == ("_fake",):
            return self._control(method, parts[1:], query, body)
        route = _match(method, parts)
        with self._lock:
            now = self._clock()
            if isinstance(route, int):
                reply = problem(route, f"no route {method} {url.path} in this fake")
            else:
                call = _Call(route[0], route[1], query, body)
                self._calls[call.bucket] += 1
                reply = (
                    self._auth(call.bucket, authorization)
                    or self._throttle(call.bucket, now)
                    or self._chaos(call, now)
                    or self._apply(call, now)
                )
            self._responses["dropped" if reply.drop else str(reply.status)] += 1
        return reply

    def _auth(self, bucket: str, authorization: str) -> Reply | None:
        if authorization == f"Bearer {self.api_key}":
            return None
        if bucket.startswith("pods."):
            return problem(401, "invalid bearer token" if authorization else "missing bearer token")
        if authorization == self.api_key:  # the serverless docs' curl examples send the bare key
            return None
        return Reply(401, {"error": "Unauthorized"})  # serverless 401 body: undocumented, a guess

    def _throttle(self, bucket: str, now: float) -> Reply | None:
        """A sliding window per bucket: ``calls`` admitted in any ``window`` seconds."""
        calls, window = self.limits.get(bucket, (math.inf, 10.0))
        seen = self._seen.setdefault(bucket, deque())
        admitted = self._admitted.setdefault(bucket, deque())
        for times in (seen, admitted):
            while times and times[0] <= now - window:
                times.popleft()
        seen.append(now)
        self._max_window[bucket] = max(self._max_window[bucket], len(seen))
        if len(admitted) < calls:
            admitted.append(now)
            return None
        self._limited += 1
        retry_after = max(1, math.ceil(admitted[0] + window - now))  # whole seconds, as RunPod
        detail = f"rate limit of {calls} requests per {window:g} s exceeded for {bucket}"
        return problem(429, detail, retry_after=retry_after)

    def _chaos(self, call: _Call, now: float) -> Reply | None:
        if self.failure_rate <= 0 or self._chaos_rng.random() >= self.failure_rate:
            return None
        kinds = FAILURES + (AFTER_EFFECT_FAILURES if call.bucket in MUTATING else ())
        kind = self._chaos_rng.choice(kinds)
        self._injected[kind] += 1
        if kind == "500":
            return html(500)
        if kind == "503":
            return problem(503, "upstream temporarily unavailable; retry with backoff")
        if kind == "429":
            return problem(429, "rate limit exceeded for the minute window", retry_after=1)
        self._apply(call, now)  # done, but the answer never arrives
        return html(502) if kind == "502_after" else Reply(0, drop=True)

    def _apply(self, call: _Call, now: float) -> Reply:
        if call.bucket == "pods.create":
            return self._create_pod(call.body, now)
        if call.bucket == "pods.list":
            pods = [self._pod_view(p, now) for p in self._pods.values() if p.terminated is None]
            if self.honor_name_filter and "name" in call.query:
                pods = [p for p in pods if p["name"] == call.query["name"][0]]
            return Reply(200, {"pods": pods})
        if call.bucket in ("pods.get", "pods.delete"):
            pod = self._pods.get(call.args[0])
            if pod is None or pod.terminated is not None:
                return problem(404, "pod not found")
            if call.bucket == "pods.get":
                return Reply(200, self._pod_view(pod, now))
            pod.terminated = now
            return Reply(204)
        if call.bucket == "catalog":
            return Reply(200, {"gpus": [self._gpu_type(i, call.query) for i in CATALOG]})
        if call.bucket == "run":
            return self._submit(call.args[0], call.body, now)
        job = self._jobs.get(call.args[1])
        if job is None or job.endpoint != call.args[0] or self._expired(job, now):
            return Reply(404, {"error": "request does not exist"})  # body undocumented, a guess
        if call.bucket == "status":
            return Reply(200, self._job_view(job, now))
        status = [s for s, t in _timeline(job) if t <= now][-1]
        if status not in TERMINAL:  # cancelling a finished job changes nothing
            job.cancelled, status = now, "CANCELLED"
        return Reply(200, {"id": job.id, "status": status})

    # --- pods --------------------------------------------------------------------------------

    def _create_pod(self, body: bytes, now: float) -> Reply:
        try:
            req = json.loads(body or b"null")
        except ValueError:
            return problem(400, "the request body is not valid JSON")
        if not isinstance(req, dict):
            return problem(422, "Request validation failed.", ["$: got non-object, want object"])
        if errors := _validate_create(req):
            return problem(422, "Request validation failed.", errors)
        if ("gpu" in req) == ("cpu" in req):  # "enforced at the handler layer": 400, not 422
            return problem(400, "exactly one of gpu or cpu must be set")
        if req.get("gpu", {}).get("id") in self.unavailable_gpus:  # capacity: no code, a detail
            return problem(400, NO_CAPACITY)
        alphabet = string.ascii_lowercase + string.digits
        pod_id = "".join(self._id_rng.choice(alphabet) for _ in range(14))
        pod = _Pod(pod_id, req, now, f"{pod_id}-{self._id_rng.getrandbits(32):08x}")
        self._pods[pod_id] = pod
        self._names.append(req["name"])
        return Reply(201, self._pod_view(pod, now, "PROVISIONING"))

    def _pod_status(self, pod: _Pod, now: float) -> str:
        if pod.terminated is not None:
            return "TERMINATED"
        if pod.exited is not None:
            return "EXITED"
        if now - pod.created < self.pod_ready_seconds / 2:
            return "PROVISIONING"
        ready = not self.pod_never_ready and now - pod.created >= self.pod_ready_seconds
        return "RUNNING" if ready else "STARTING"

    def _pod_view(self, pod: _Pod, now: float, status: str = "") -> dict[str, Any]:
        """The v2 Pod. ``ssh`` is always an object (docs and notes agree): ``ssh.direct`` is
        null unless the pod is RUNNING with 22/tcp in ``ports`` (and this fake was given an
        ssh_address); ``runtime`` is null unless RUNNING; ``cost`` is 0 once EXITED/TERMINATED."""
        req, status = pod.request, status or self._pod_status(pod, now)
        proxy = {"host": "ssh.runpod.io", "port": 22, "username": pod.proxy_user}
        proxy["command"] = f"ssh {pod.proxy_user}@ssh.runpod.io"
        view: dict[str, Any] = {
            "id": pod.id,
            "name": req["name"],
            "status": status,
            "actions": list(ACTIONS[status]),
            **{k: copy.deepcopy(req.get(k, default)) for k, default in POD_DEFAULTS.items()},
            "dataCenterId": (req.get("dataCenterIds") or ["US-TX-3"])[0],
            "cudaVersion": "12.8" if "gpu" in req else None,
            "ssh": {"proxy": None if status == "TERMINATED" else proxy, "direct": None},
            "cost": 0.0,
            "globalNetworking": {"enabled": False},
            "runtime": None,
            "createdAt": _iso(pod.created),
            "startedAt": None,
        }
        if status == "RUNNING":
            view["startedAt"] = _iso(pod.created + self.pod_ready_seconds)
            uptime = max(0, int(now - pod.created - self.pod_ready_seconds))
            view["runtime"] = {"uptime": uptime, "gpus": [], "ports": []}
            if self.ssh_address and "22/tcp" in view["ports"]:
                host, port = self.ssh_address
                view["ssh"]["direct"] = {"host": host, "port": port, "username": "root"}
                view["ssh"]["direct"]["command"] = f"ssh root@{host} -p {port}"
                view["runtime"]["ports"] = [
                    {"private": 22, "public": port, "type": "tcp", "ip": host}
                ]
        if "gpu" in req:
            count = req["gpu"].get("count", 1)
            view["gpu"] = {"id": req["gpu"]["id"], "count": count, "vcpuCount": 16 * count}
            view["gpu"]["memory"] = 125 * count
            rate = GPU_PRICES.get(req["gpu"]["id"], DEFAULT_GPU_PRICE) * count
        else:
            vcpus = req["cpu"].get("vcpuCount", 2)
            view["cpu"] = {"id": req["cpu"].get("id"), "vcpuCount": vcpus, "memory": 2 * vcpus}
            rate = 0.04 * vcpus
        view["cost"] = 0.0 if status in ("EXITED", "TERMINATED") else round(rate, 4)
        return view

    @staticmethod
    def _gpu_type(gpu_id: str, query: dict[str, list[str]]) -> dict[str, Any]:
        """A v2 GpuType, sold in both clouds at the rate its pods bill, always in stock."""
        name, memory = CATALOG[gpu_id]
        price = GPU_PRICES.get(gpu_id, DEFAULT_GPU_PRICE)
        gpu: dict[str, Any] = {"id": gpu_id, "name": name, "pool": None, "memory": memory}
        gpu |= {"manufacturer": "NVIDIA", "secure": True, "community": True}
        gpu["price"] = {"secure": price, "community": round(price * 0.8, 2), "serverless": None}
        gpu["maxCount"] = {"secure": 8, "community": 8}
        if "AVAILABILITY" in query.get("include", [""])[0].split(","):
            gpu["availability"] = "HIGH"
            gpu["dataCenters"] = [{"id": "US-TX-3", "name": "US-TX-3", "availability": "HIGH"}]
        return gpu

    # --- serverless --------------------------------------------------------------------------

    def _submit(self, endpoint: str, body: bytes, now: float) -> Reply:
        try:
            req = json.loads(body or b"null")
        except ValueError:
            return Reply(400, {"error": "the request body is not valid JSON"})
        if not isinstance(req, dict) or "input" not in req:
            return Reply(400, {"error": "the request body needs an 'input' object"})
        policy = req.get("policy") or {}
        job_id = f"{uuid.UUID(int=self._id_rng.getrandbits(128), version=4)}-u1"
        timeout = policy.get("executionTimeout", 600_000) / 1000
        ttl = policy.get("ttl", 86_400_000) / 1000
        self._jobs[job_id] = _Job(
            job_id, endpoint, req["input"], now, dict(self._defaults), timeout, ttl
        )
        return Reply(200, {"id": job_id, "status": "IN_QUEUE"})

    def _expired(self, job: _Job, now: float) -> bool:
        """Past its ttl (even while running), or its result outlived the retention: RunPod
        then answers 404, as for a job it never had."""
        final, final_at = _timeline(job)[-1]
        kept_until = final_at + self.result_retention_seconds if final in TERMINAL else math.inf
        return now >= min(job.submitted + job.ttl, kept_until)

    def _job_view(self, job: _Job, now: float) -> dict[str, Any]:
        """The /status job object: ``delayTime`` and ``workerId`` once a worker took the job,
        ``executionTime`` once it ended (ms); ``output`` is the progress payload while running
        and the handler's result when COMPLETED; a FAILED job carries ``error`` (a string)."""
        timeline = _timeline(job)
        reached = [(s, t) for s, t in timeline if t <= now]
        status, end, script = reached[-1][0], timeline[-1][1], job.script
        view: dict[str, Any] = {"id": job.id, "status": status}
        started = next((t for s, t in reached if s == "IN_PROGRESS"), None)
        if started is None:
            return view
        view["delayTime"] = int((started - job.submitted) * 1000)
        view["workerId"] = hashlib.sha256(job.endpoint.encode()).hexdigest()[:14]
        if status in TERMINAL:
            view["executionTime"] = int((end - started) * 1000)
        if status == "IN_PROGRESS" and script["progress_events"]:
            view["output"] = self._output(job, started, end, now, done=False)
        elif status == "COMPLETED":
            default = script["output"] is None
            view["output"] = (
                self._output(job, started, end, end, done=True) if default else script["output"]
            )
        elif status == "FAILED":  # the worker SDK moves a handler's {"error": ...} here
            view["error"] = script["error"] or "internal_error: the fake job failed"
        return view

    def _output(self, job: _Job, start: float, end: float, upto: float, *, done: bool) -> Any:
        """``{"attempt", "events"}`` while running; when done, what gpu_worker.runpod_handler
        returns for a success (its ``refresh_worker`` is stripped by the worker SDK)."""
        n = job.script["progress_events"]
        step = (end - start) / (n + 1) if math.isfinite(end - start) else 1.0
        events = [_event(0, "status", "Training started.", {"status": "running"}, start)]
        for i in range(1, n + 1):
            if start + i * step > upto:
                break
            data = {"step": i, "total_steps": n, "loss": round(2.0 / (1 + i), 4)}
            events.append(_event(i, "metrics", f"step {i}/{n}", data, start + i * step))
        if not done:
            attempt = job.input.get("attempt", 1) if isinstance(job.input, dict) else 1
            return {"attempt": attempt, "events": events[-EVENT_WINDOW:]}
        sha, size = hashlib.sha256(job.id.encode()).hexdigest(), 4096
        files = [{"path": "adapter_model.safetensors", "size": size, "sha256": sha}]
        status = {"status": "succeeded", "sha256": sha, "size": size}
        events.append(_event(len(events), "status", "Training finished.", status, end))
        result = {"manifest": {"format": 1, "files": files}, "metrics": {"train_loss": 0.5}}
        return status | result | {"events": events[-EVENT_WINDOW:]}

    # --- control routes ----------------------------------------------------------------------

    def _control(self, method: str, parts: tuple[str, ...], query: dict, body: bytes) -> Reply:
        try:
            if (method, parts) == ("GET", ("stats",)):
                return Reply(200, self.stats())
            if (method, parts) == ("GET", ("status_changes",)):
                ids = query.get("id") or self.job_ids()
                return Reply(200, {"jobs": {i: self.status_changes(i) for i in ids}})
            if (method, parts) == ("POST", ("script",)):
                req = json.loads(body or b"{}")
                self.script_defaults(**req.get("default", {}))
                for job_id, script in req.get("jobs", {}).items():
                    self.script_job(job_id, **script)
                return Reply(200, {"scripted": len(req.get("jobs", {}))})
        except (KeyError, TypeError, ValueError) as err:
            return Reply(400, {"error": f"{type(err).__name__}: {err}"})
        return Reply(404, {"error": f"no control route {method} /_fake/{'/'.join(parts)}"})


def _checked(script: dict[str, Any]) -> dict[str, Any]:
    if unknown := set(script) - SCRIPT_KEYS:
        raise ValueError(f"unknown script keys {sorted(unknown)}; use {sorted(SCRIPT_KEYS)}")
    return script


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 512  # a benchmark opens hundreds of connections at once
    fake: FakeRunpod


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as a requests.Session expects
    # Buffered: headers and body leave in one segment (flushed after each request). Two small
    # writes meet the client's delayed ACK and cost ~40 ms a request.
    wbufsize = 1 << 16
    server: _Server

    def do_GET(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        fake = self.server.fake
        time.sleep(fake.latency_seconds / 2)  # half on the way in, half on the way out
        reply = fake.handle(self.command, self.path, self.headers.get("Authorization", ""), body)
        time.sleep(fake.latency_seconds / 2)
        if reply.drop:
            self.close_connection = True
            return
        payload, kind = b"", ""
        if isinstance(reply.body, str):
            payload, kind = reply.body.encode(), "text/html; charset=utf-8"
        elif reply.body is not None:
            payload, kind = json.dumps(reply.body).encode(), "application/json"
            if reply.status >= 400 and "title" in reply.body:
                kind = "application/problem+json"
        self.send_response(reply.status)
        for name, value in reply.headers.items():
            self.send_header(name, value)
        if kind:
            self.send_header("Content-Type", kind)
        if reply.status != 204:  # RFC 9110: a 204 has no Content-Length
            self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_POST = do_DELETE = do_PUT = do_PATCH = do_GET

    def log_message(self, format: str, *args: Any) -> None:
        pass  # a line per request would drown a benchmark's output


def _rate_limit(text: str) -> tuple[str, tuple[int, float]]:
    bucket, _, spec = text.partition("=")
    calls, _, window = spec.partition("/")
    return bucket, (int(calls), float(window or 10))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m tests.support.fakes.runpod_api", description=__doc__
    )
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    add = parser.add_argument
    add("--host", default="127.0.0.1")
    add("--port", type=int, default=0, help="0: any free port (the URL is printed)")
    add("--api-key", default=API_KEY)
    add("--latency", dest="latency_seconds", type=float, default=0.0, help="seconds per request")
    add("--failure-rate", type=float, default=0.0, help="0..1: share of calls that fail")
    add("--seed", type=int, default=0)
    add("--rate-limit", dest="rate_limits", type=_rate_limit, action="append", default=[])
    add("--pod-ready", dest="pod_ready_seconds", type=float, default=0.0)
    add("--pod-never-ready", action="store_true")
    add("--ssh", dest="ssh_address", default="", metavar="HOST:PORT", help="of RUNNING pods")
    add("--unavailable-gpu", dest="unavailable_gpus", action="append", default=[])
    add("--queue-seconds", type=float, default=0.0)
    add("--run-seconds", type=float, default=0.0)
    add("--final-status", default="COMPLETED", choices=("COMPLETED", "FAILED", "TIMED_OUT"))
    add("--progress-events", type=int, default=0)
    options = vars(parser.parse_args(argv))
    options["rate_limits"] = dict(options["rate_limits"])
    host, _, port = options["ssh_address"].rpartition(":")
    options["ssh_address"] = (host, int(port)) if port else None
    options["unavailable_gpus"] = tuple(options["unavailable_gpus"])
    fake = FakeRunpod(**options)
    print(fake.start(), flush=True)
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    try:
        stopped.wait()
    except KeyboardInterrupt:
        pass
    finally:
        fake.stop()


if __name__ == "__main__":
    main()
