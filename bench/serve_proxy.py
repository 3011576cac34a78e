"""Streaming chat completions through trainhub vs straight to the same embedded inference server:
what trainhub adds to the time to first token (TTFT), and its throughput relative to direct
(issue 30: added TTFT p50 <= 5 ms and p95 <= 15 ms, throughput >= 0.95x direct, with 64
concurrent streams).

What runs, each as its own process on 127.0.0.1, started as an operator starts it:

- the embedded server (``trainhub.processes.inference_command``: ``python -m gpu_worker serve``)
  with the tiny model (gpu_worker.tiny_model) and an API key, one torch thread, pinned to the
  last CPU while trainhub's processes and the client get the others (``--shared-cores``: no
  pinning): a GPU server shares no cores with the control plane, and here the question is whether
  trainhub keeps the engine fed, not how much CPU they fight over. The engine generates one
  request at a time: its pace bounds every path;
- the web process, the Procfile's ``web`` line (gunicorn, ``-c python:trainhub.gunicorn_conf``,
  2 sync workers), with ``TRAINHUB_STREAM_URL`` set to
- the stream process, the Procfile's ``stream`` line (uvicorn ``trainhub.asgi``), which relays
  (api/live/inference.py);
- trainhub's front door: nginx running deploy/nginx.conf as shipped, in front of both
  (devsupport/front_proxy.py; left out, and said so, where nginx is not installed).

The server is registered with ``server_register`` (what ``manage.py register_server`` calls) for
the base model ``bench/tiny``: a request for a base model a server serves is relayed to it with
no training or deployment (``_lookup`` in api/live/inference.py). One user, project and API key
come from the services.

The client, in this process, sends the same greedy streamed chat completion (``--max-tokens``,
``include_usage``) on four paths, each through its own aiohttp session (its own connection pool):

- ``direct``: to the server, with its key;
- ``door``: through trainhub as deployed, to the front door with the project key: nginx sends
  the completions paths to the stream process;
- ``redirect``: to the web process with the project key, as where no proxy is in front (the
  demo); the 307 is followed by hand as httpx (and so the openai SDK) follows it, body re-sent,
  Authorization dropped for the other origin (the grant in the Location authenticates), so
  that both hops are timed;
- ``stream``: to the stream process itself with the project key: the door without nginx.

Per request, from its own send: the 307 (redirect), the response headers, the first chunk (the
server writes the role chunk before its engine takes the request) and the first chunk with
content: TTFT. Tokens: ``usage.completion_tokens``. Every answer must be the direct one's text.
The direct client opens its connections one at a time and keeps them: the embedded server
listens with a backlog of 5, and a burst of new connections makes some wait a second for their
SYN to be sent again. The stream process's own bursts of upstream connections are part of what
is measured; the machine's listen-queue overflows per round are counted.

1. One at a time (``--requests`` on each path, the order of the three rotating): the engine is
   idle when a request arrives, so nothing hides what trainhub adds. **Added TTFT** = a path's
   TTFT p50 (p95) minus direct's p50 (p95): the shift of the distribution. Not per-request
   differences: the paths carry different requests, and the engine's own jitter would widen
   both tails. Also where a request's time goes (the 307, the stream's headers, the rest).
2. ``--concurrency`` (64) at once, rounds in the order direct, door, redirect, stream, then
   the reverse (``--rounds`` times). TTFT here is mostly the wait for the engine (the k-th served
   waits for k-1 generations), so a quantile moves by whole generations when the engine's pace
   drifts: the added TTFT at 64 is printed beside direct's later rounds minus its earlier ones
   (nothing added: the noise); each round's first token (TTFT min: the first request the engine
   serves, queued behind nothing) and first chunks show trainhub's setup under the burst.
   Throughput = completion tokens / the rounds' wall time (first send to last byte), per path;
   ratio = path / direct. CPU per round of each process (web: gunicorn's master and workers;
   door: nginx's master and worker) and
   the whole machine's busy share (other work on a shared machine shows there).
3. 64 at once against a paced server instead (bench/paced_server.py, pinned where the engine
   is, registered for ``bench/paced``): every stream answered at once, a token every
   ``--token-ms`` (50) ms, the shape of a batching engine on a GPU. With no engine queue in
   the way, TTFT at 64 shows what trainhub adds under that load (the client moves to the
   engine's CPU, idle now, so that it takes none from trainhub's): **added TTFT at 64** = a
   path's TTFT p50 (p95) minus direct's, ``--rounds`` bursts per path in turn. Each token also
   carries the server's ``time.time()`` as it was written, so its delivery delay (arrival at
   the client minus that) is read per token, trainhub's hops and the client's own lag in it.
4. In this process, on the same PostgreSQL and Redis: the web's 307 by Django alone (the test
   client: no gunicorn, no TCP) and the grant: ``grant_for`` (signed by the web process) and
   ``granted_key`` (spent by the stream process: signature, Redis SET NX, the key's row and its
   membership).

    .venv/bin/python bench/serve_proxy.py [--concurrency 64] [--rounds 2] [--requests 30]
        [--max-tokens 16] [--shared-cores] [--keep-logs]

About a minute on 2 cores. Database: ``--database-url``, else ``BENCH_PROXY_DATABASE_URL``,
else ``DATABASE_URL``'s server with the database ``trainhub_bench_proxy``; dropped and created
again on every run (its name must contain ``bench_proxy``). Redis: ``--redis-url`` (default
``redis://127.0.0.1:6379/11``, the bench's own) for the grants' nonces, the throttle's counters
(the limit raised: counted, as in production, never refused) and the ``place_deployments``
message that registering sends (no worker runs; the bench deletes the queue). Every process it
starts is stopped on exit, Ctrl-C and SIGTERM included.

Figures: docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import re
import resource
import shlex
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repo: devsupport, trainhub
from _common import bench_database_url, database_recreate, machine
from dispatch_latency import BenchError, Proc  # a child in its own process group, stopped with it
from stream_fanout import cpu_s, machine_busy, percentile

from devsupport.front_proxy import FrontProxy, front_proxy, nginx_missing_reason
from devsupport.processes import free_port
from devsupport.readiness import NotReady, wait_http_ready

ROOT = Path(__file__).resolve().parent.parent
DB_NAME = "trainhub_bench_proxy"
DEFAULT_REDIS = "redis://127.0.0.1:6379/11"
GOAL_ADDED_P50_MS, GOAL_ADDED_P95_MS, GOAL_RATIO = 5.0, 15.0, 0.95
PACED_MODEL, PACED_NAME = "bench/paced", "paced"
READY_TIMEOUT = 90.0  # gunicorn / uvicorn importing Django on a busy 2-core machine
BASE_MODEL, SERVED_NAME = "bench/tiny", "tiny"  # served name: trainhub.processes.inference_command
SERVER_KEY = "bench-proxy-server-key"
QUESTION = [
    {"role": "user", "content": "What colour is owl number 3, and which day does ferry 2 sail?"}
]


# --- processes ------------------------------------------------------------------------------


def procfile_argv(entry: str, port: int) -> list[str]:
    """The Procfile's ``entry`` line as run here: this interpreter's ``-m`` of its program, on
    127.0.0.1:``port``."""
    line = next(
        text.split(":", 1)[1]
        for text in (ROOT / "Procfile").read_text().splitlines()
        if text.startswith(f"{entry}:")
    )
    argv = shlex.split(re.sub(r"\$\{\w+:-\d+\}", str(port), line))
    return [sys.executable, "-m", *(a.replace("0.0.0.0", "127.0.0.1") for a in argv)]  # noqa: S104


def tree_cpu_s(pid: int) -> float:
    """utime + stime of ``pid`` and its living descendants (gunicorn: master and workers)."""
    total = cpu_s(pid)
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):  # a thread or child that ended meanwhile
            for child in (task / "children").read_text().split():
                total += tree_cpu_s(int(child))
    return total


def cpu_split(shared: bool) -> tuple[set[int], set[int]]:
    """(the engine's CPUs, the rest's): the last CPU for the engine, the others for trainhub's
    processes and the client, as a GPU server shares no cores with the control plane; all of
    them for both with ``--shared-cores`` or a single CPU."""
    cpus = sorted(os.sched_getaffinity(0))
    if shared or len(cpus) < 2:
        return set(cpus), set(cpus)
    return {cpus[-1]}, set(cpus[:-1])


def all_alive(procs: list[Proc]) -> None:
    """Raises BenchError, with its log, for the first of ``procs`` that has exited."""
    for proc in procs:
        proc.check()


@dataclass
class Plane:
    """The running processes, where they listen, and the project key."""

    server: Proc
    paced: Proc
    web: Proc
    stream: Proc
    server_url: str
    paced_url: str
    web_url: str
    stream_url: str
    raw_key: str
    door: FrontProxy | None  # None: nginx is not installed

    def cpu(self) -> dict[str, float]:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return {
            "web": tree_cpu_s(self.web.popen.pid),
            "stream": cpu_s(self.stream.popen.pid),
            "door": tree_cpu_s(self.door.pid) if self.door else 0.0,
            "server": cpu_s(self.server.popen.pid),
            "client": usage.ru_utime + usage.ru_stime,
        }


@contextmanager
def plane(args: argparse.Namespace, tmp: Path) -> Iterator[Plane]:
    """The server, the database seeded and the server registered, the web and stream processes;
    all stopped on the way out, however it is left."""
    import requests
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    from gpu_worker.tiny_model import build_tiny_model
    from jobs.services.accounts.projects import api_key_create, project_default_for_user
    from jobs.services.serving.servers import server_register
    from trainhub.processes import inference_command

    ports = {name: free_port() for name in ("server", "paced", "web", "stream")}
    urls = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
    engine_cpus, plane_cpus = cpu_split(args.shared_cores)
    procs: list[Proc] = []
    try:
        server_env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
                      "TRAINHUB_SERVE_API_KEY": SERVER_KEY}  # fmt: skip
        model = build_tiny_model(tmp / "tiny")
        # A child keeps the CPUs its parent had when it started: the server gets the engine's.
        os.sched_setaffinity(0, engine_cpus)
        procs.append(Proc("server", inference_command(model, ports["server"]), server_env,
                          tmp / "server.log"))  # fmt: skip
        paced_argv = [sys.executable, str(ROOT / "bench" / "paced_server.py"), "--port",
                      str(ports["paced"]), "--token-ms", str(args.token_ms)]  # fmt: skip
        procs.append(Proc("paced", paced_argv, dict(os.environ), tmp / "paced.log"))
        os.sched_setaffinity(0, plane_cpus)
        call_command("migrate", verbosity=0)
        user = get_user_model().objects.create_user(username="proxy-bench", password=None)
        project = project_default_for_user(user=user)
        _, raw_key = api_key_create(user=user, name="proxy-bench", project=project)
        server_register(name="bench-tiny", url=urls["server"], base_model=BASE_MODEL,
                        served_name=SERVED_NAME, api_key=SERVER_KEY, max_adapters=1)  # fmt: skip
        server_register(name="bench-paced", url=urls["paced"], base_model=PACED_MODEL,
                        served_name=PACED_NAME, api_key=None, max_adapters=1)  # fmt: skip
        env = {**os.environ, "TRAINHUB_STREAM_URL": urls["stream"]}
        for name in ("web", "stream"):
            procs.append(Proc(name, procfile_argv(name, ports[name]), env, tmp / f"{name}.log"))
        server, paced, web, stream = procs
        http = requests.Session()
        http.headers["Authorization"] = f"Bearer {raw_key}"
        ready = {server: "/health", paced: "/health", stream: "/healthz", web: "/v1/models"}
        for proc, path in ready.items():
            url = urls[proc.name] + path
            try:
                wait_http_ready(url, timeout=READY_TIMEOUT, session=http, proc=proc.popen,
                                log=proc.log, check=lambda: all_alive(procs))  # fmt: skip
            except NotReady as exc:
                raise BenchError(f"the {proc.name} process is not serving: {exc}") from None
        http.close()
        with contextlib.ExitStack() as door:
            proxy = None
            if nginx_missing_reason() is None:
                web_host, stream_host = (urlsplit(urls[n]).netloc for n in ("web", "stream"))
                proxy = door.enter_context(front_proxy(web_host, stream_host, tmp / "nginx"))
            try:
                yield Plane(server, paced, web, stream, urls["server"], urls["paced"],
                            urls["web"], urls["stream"], raw_key, proxy)  # fmt: skip
            except BenchError:
                if proxy is not None:
                    print(f"--- nginx error log ---\n{proxy.tail()}")
                raise
    finally:
        for proc in reversed(procs):
            proc.stop()
        if args.keep_logs:
            for proc in procs:
                print(f"--- {proc.name} log ---\n{proc.tail()}")


# --- the client -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """Where a request is sent: the server itself, trainhub's front door (nginx), its web process
    (which answers with a 307 to the stream process) or the stream process itself."""

    name: str  # "direct" | "door" | "redirect" | "stream"
    http: Any  # the aiohttp.ClientSession it goes through: one per path
    url: str
    model: str
    headers: dict[str, str]


@dataclass
class Sample:
    """One request; seconds from its own send."""

    sent: float  # perf_counter at the send
    hop: float  # the web's 307 (redirect only; 0 otherwise)
    head: float  # response headers from the server or the stream process
    first_chunk: float  # the role chunk: sent before the engine takes the request
    ttft: float  # the first chunk with content
    end: float
    tokens: int
    text: str
    delays: list[float]  # per content chunk: its arrival minus its ``sent_at`` (paced server)


async def ask(to: Target, max_tokens: int, connected: asyncio.Event | None = None) -> Sample:
    """One streamed chat completion; ``connected`` is set once its headers are in (or it failed)."""
    import aiohttp

    body = {"model": to.model, "messages": QUESTION, "temperature": 0, "max_tokens": max_tokens,
            "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
    sent = time.perf_counter()
    url, headers, hop = f"{to.url}/v1/chat/completions", to.headers, 0.0
    first_chunk = ttft = None
    tokens, parts, delays = 0, [], []
    try:
        if to.name == "redirect":
            async with to.http.post(url, json=body, headers=headers,
                                    allow_redirects=False) as redirect:  # fmt: skip
                said = await redirect.read()
            hop = time.perf_counter() - sent
            if redirect.status != 307:
                raise BenchError(f"the web process answered {redirect.status}: {said[:300]!r}")
            url, headers = redirect.headers["location"], {}  # another origin: no Authorization
        async with to.http.post(url, json=body, headers=headers) as resp:
            head = time.perf_counter() - sent
            if connected is not None:
                connected.set()
            if resp.status != 200:
                said = (await resp.read())[:300]
                raise BenchError(f"{to.name}: HTTP {resp.status}: {said!r}")
            async for raw in resp.content:  # line by line
                line = raw.decode().rstrip("\r\n")
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                now = time.perf_counter() - sent
                chunk = json.loads(line.removeprefix("data: "))
                first_chunk = now if first_chunk is None else first_chunk
                content = chunk["choices"][0]["delta"].get("content") if chunk["choices"] else None
                if content:
                    ttft = now if ttft is None else ttft
                    parts.append(content)
                    if "sent_at" in chunk:
                        delays.append(time.time() - chunk["sent_at"])
                if chunk.get("usage"):
                    tokens = chunk["usage"]["completion_tokens"]
    except aiohttp.ClientError as exc:
        raise BenchError(f"{to.name}: {type(exc).__name__}: {exc}") from exc
    finally:
        if connected is not None:
            connected.set()
    if first_chunk is None or ttft is None or not tokens:
        raise BenchError(f"{to.name}: a stream without content or usage")
    end = time.perf_counter() - sent
    return Sample(sent, hop, head, first_chunk, ttft, end, tokens, "".join(parts), delays)


async def connect_one_by_one(to: Target, n: int) -> None:
    """``n`` requests held open together, each sent once the one before has its headers: the
    client then keeps ``n`` connections without having opened them in a burst (the embedded
    server listens with socketserver's backlog of 5: a burst of connects overflows it, and the
    overflow waits for a SYN retransmission, 1 s, or is reset)."""
    tasks = []
    for _ in range(n):
        connected = asyncio.Event()
        tasks.append(asyncio.create_task(ask(to, 1, connected)))
        await connected.wait()
    await asyncio.gather(*tasks)


def listen_overflows() -> int:
    """The machine's count of connections that found a listen queue full (TcpExt
    ListenOverflows): each waits for its SYN to be sent again, 1 s later."""
    lines = Path("/proc/net/netstat").read_text().splitlines()
    for head, values in zip(lines[::2], lines[1::2], strict=True):
        if head.startswith("TcpExt:"):
            return dict(zip(head.split()[1:], map(int, values.split()[1:]), strict=True))[
                "ListenOverflows"
            ]
    return 0


@dataclass
class Round:
    """One burst of ``--concurrency`` requests on one path."""

    path: str
    samples: list[Sample]
    wall: float
    cpu: dict[str, float]
    busy: float  # the whole machine's busy share over the round
    overflows: int  # connections that found a listen queue full (the machine's)
    made: int  # requests sent in the round (the samples may be fewer: see steady)

    @property
    def tokens(self) -> int:
        return sum(s.tokens for s in self.samples)


async def burst(to: Target, n: int, max_tokens: int, plane: Plane) -> Round:
    """``n`` requests at once; wall = first send to the last byte."""
    cpu0, busy0, overflows = plane.cpu(), machine_busy(), listen_overflows()
    start = time.perf_counter()
    samples = await asyncio.gather(*(ask(to, max_tokens) for _ in range(n)))
    wall = max(s.sent + s.end for s in samples) - start
    cpu1, busy1 = plane.cpu(), machine_busy()
    busy = (busy1[0] - busy0[0]) / max(1, busy1[1] - busy0[1])
    cpu = {k: cpu1[k] - cpu0[k] for k in cpu0}
    overflowed = listen_overflows() - overflows
    return Round(to.name, list(samples), wall, cpu, busy, overflowed, len(samples))


async def steady(
    to: Target, n: int, max_tokens: int, seconds: float, token_s: float, plane: Plane
) -> Round:
    """``n`` requests in flight for ``seconds``, as a load test's ``n`` users each asking again
    once answered (vLLM's benchmark_serving with --max-concurrency): the users start spread
    over one answer's length, so requests arrive steadily rather than in one burst. Samples are
    those sent after the first answer's length (the load established) and before the end."""
    answer_s = (max_tokens + 1) * token_s
    start = time.perf_counter()
    stop = start + answer_s + seconds
    samples: list[Sample] = []
    made = 0

    async def user(i: int) -> None:
        nonlocal made
        await asyncio.sleep(answer_s * i / n)
        while time.perf_counter() < stop:
            sample = await ask(to, max_tokens)
            made += 1
            if sample.sent >= start + answer_s and sample.sent + sample.end <= stop:
                samples.append(sample)

    cpu0, busy0, overflows = plane.cpu(), machine_busy(), listen_overflows()
    await asyncio.gather(*(user(i) for i in range(n)))
    wall = time.perf_counter() - start
    cpu1, busy1 = plane.cpu(), machine_busy()
    busy = (busy1[0] - busy0[0]) / max(1, busy1[1] - busy0[1])
    cpu = {k: cpu1[k] - cpu0[k] for k in cpu0}
    return Round(to.name, samples, wall, cpu, busy, listen_overflows() - overflows, made)


def client_session(keep_seconds: float) -> Any:
    """An aiohttp session for one path: its own pool, so that one path's connections cost
    another's requests nothing. aiohttp, not httpx (the openai SDK's client): with 64 streams
    httpx took ~8 ms of the client's CPU a request and aiohttp ~3 (64 users against the paced
    server alone, on this 2-core machine), and a client short of CPU puts its own lag into
    every path's tail."""
    import aiohttp

    timeout = aiohttp.ClientTimeout(total=None, connect=30, sock_read=600)
    connector = aiohttp.TCPConnector(limit=1000, keepalive_timeout=keep_seconds)
    return aiohttp.ClientSession(connector=connector, timeout=timeout)


async def measure(
    args: argparse.Namespace, plane: Plane
) -> tuple[dict[str, list[Sample]], list[Round], list[Round]]:
    """The warm-up, then sections 1, 2 and 3; every answer must be its direct one's text."""

    # This process holds Django, torch and transformers: a full collection walks all of their
    # objects and stops the client for up to seconds, which the samples would blame on the path
    # they were on. Collect now, keep what is here out of later collections, and collect no more.
    gc.collect()
    gc.freeze()
    gc.disable()

    async with contextlib.AsyncExitStack() as sessions:
        # The direct session keeps its connections for the whole run (see connect_one_by_one);
        # the others drop an idle one after 4 s, before uvicorn's keep-alive (5 s) could close it
        # under a request being sent.
        direct_http = await sessions.enter_async_context(client_session(keep_seconds=3600))
        key = {"Authorization": f"Bearer {plane.raw_key}"}
        direct = Target("direct", direct_http, plane.server_url, SERVED_NAME,
                        {"Authorization": f"Bearer {SERVER_KEY}"})  # fmt: skip
        paths = [("door", plane.door.url if plane.door else None), ("redirect", plane.web_url),
                 ("stream", plane.stream_url)]  # fmt: skip
        targets = [direct]
        for name, url in paths:
            if url is not None:
                http = await sessions.enter_async_context(client_session(keep_seconds=4))
                targets.append(Target(name, http, url, BASE_MODEL, key))
        # Warm-up, not measured: connections, imports, the processes' first queries.
        await connect_one_by_one(direct, args.concurrency)
        for to in targets[1:]:
            await burst(to, args.concurrency, 1, plane)
        single: dict[str, list[Sample]] = {to.name: [] for to in targets}
        for i in range(args.requests):  # each rotation of the paths in turn
            turn = i % len(targets)
            for to in targets[turn:] + targets[:turn]:
                single[to.name].append(await ask(to, args.max_tokens))
        rounds = []
        for _ in range(args.rounds):
            for to in [*targets, *reversed(targets)]:
                rounds.append(await burst(to, args.concurrency, args.max_tokens, plane))
        # The engine is idle from here on: the client moves to its CPU, beside the paced server
        # (light), so that trainhub's processes have theirs to themselves as on a real host.
        os.sched_setaffinity(0, cpu_split(args.shared_cores)[0])
        paced_http = await sessions.enter_async_context(client_session(keep_seconds=4))
        paced = [Target("direct", paced_http, plane.paced_url, PACED_NAME, {})]
        paced += [Target(to.name, to.http, to.url, PACED_MODEL, key) for to in targets[1:]]
        for to in paced:  # warm-up
            await burst(to, args.concurrency, 1, plane)
        paced_rounds = []
        for to in [*paced, *reversed(paced)]:
            run = steady(to, args.concurrency, args.max_tokens, args.steady_seconds,
                         args.token_ms / 1000, plane)  # fmt: skip
            paced_rounds.append(await run)
    for samples in (
        [*(s for v in single.values() for s in v), *(s for r in rounds for s in r.samples)],
        [s for r in paced_rounds for s in r.samples],
    ):
        expected = samples[0].text
        for sample in samples:
            if sample.text != expected:
                raise BenchError(f"an answer differed: {sample.text!r}, direct {expected!r}")
    return single, rounds, paced_rounds


# --- the 307 and the grant in this process -----------------------------------------------------


def in_process(raw_key: str, n: int = 100) -> dict[str, list[float]]:
    """Seconds per call, ``n`` each after a warm-up: the web's 307 answered by Django and DRF in
    this process (no gunicorn, no TCP), ``grant_for`` and ``granted_key``."""
    from django.test import Client, override_settings

    from api.inference_grant import grant_for, granted_key
    from jobs.models import ApiKey

    key = ApiKey.objects.select_related("project", "user").get()
    body = json.dumps({"model": BASE_MODEL, "messages": QUESTION, "stream": True})
    client = Client(HTTP_AUTHORIZATION=f"Bearer {raw_key}", HTTP_HOST="127.0.0.1")
    out: dict[str, list[float]] = {"307": [], "grant_for": [], "granted_key": []}
    with override_settings(TRAINHUB_STREAM_URL="http://127.0.0.1:8001"):
        for i in range(n + 10):
            t0 = time.perf_counter()
            answer = client.post("/v1/chat/completions", body, content_type="application/json")
            t1 = time.perf_counter()
            token = grant_for(key)
            t2 = time.perf_counter()
            spent = granted_key(token)
            t3 = time.perf_counter()
            if answer.status_code != 307 or spent is None:
                raise BenchError(f"in this process: HTTP {answer.status_code}, grant {spent}")
            if i >= 10:
                out["307"].append(t1 - t0)
                out["grant_for"].append(t2 - t1)
                out["granted_key"].append(t3 - t2)
    return out


# --- the report ---------------------------------------------------------------------------------

GOAL_TEXT = f"goal <= {GOAL_ADDED_P50_MS:g} / {GOAL_ADDED_P95_MS:g} ms"


def q(values: list[float], p: float) -> float:
    """Nearest-rank percentile of seconds, in ms."""
    return percentile(sorted(values), p) * 1000


def added(path: list[float], direct: list[float]) -> tuple[float, float]:
    """The shift of the distribution: p50 minus p50, p95 minus p95 (ms)."""
    return q(path, 50) - q(direct, 50), q(path, 95) - q(direct, 95)


def verdict(shift: tuple[float, float]) -> str:
    ok = shift[0] <= GOAL_ADDED_P50_MS and shift[1] <= GOAL_ADDED_P95_MS
    return "PASS" if ok else "FAIL"


def line(label: str, values: list[float], note: str = "") -> None:
    print(f"  {label:<52}{q(values, 50):8.1f}{q(values, 95):8.1f}  {note}".rstrip())


def report_single(single: dict[str, list[Sample]]) -> dict[str, tuple[float, float]]:
    """Section 1; returns each trainhub path's added TTFT."""
    print(f"\n1. one at a time, {len(single['direct'])} requests on each path, the order rotating"
          f"{'p50':>9}{'p95':>8} (ms)")  # fmt: skip

    def of(path: str, f: Any) -> list[float]:
        return [f(s) for s in single[path]]

    for path in single:
        line(f"TTFT, {path}", of(path, lambda s: s.ttft))
    shifts = {}
    for path in [p for p in single if p != "direct"]:
        shifts[path] = added(of(path, lambda s: s.ttft), of("direct", lambda s: s.ttft))
        print(f"  {'added TTFT, ' + path:<52}{shifts[path][0]:8.1f}{shifts[path][1]:8.1f}  "
              f"{GOAL_TEXT}: {verdict(shifts[path])}")  # fmt: skip
    print("  where the time goes:")
    for label, path, f in (
        ("door: send -> the stream process's headers", "door", lambda s: s.head),
        ("redirect: send -> the web's 307", "redirect", lambda s: s.hop),
        ("redirect: 307 -> the stream process's headers", "redirect", lambda s: s.head - s.hop),
        ("stream: send -> its headers", "stream", lambda s: s.head),
        ("direct: send -> the server's headers", "direct", lambda s: s.head),
        ("door: headers -> first token", "door", lambda s: s.ttft - s.head),
        ("redirect: headers -> first token", "redirect", lambda s: s.ttft - s.head),
        ("stream: headers -> first token", "stream", lambda s: s.ttft - s.head),
        ("direct: headers -> first token", "direct", lambda s: s.ttft - s.head),
        ("direct: headers -> first chunk (written before the engine)", "direct",
         lambda s: s.first_chunk - s.head),
    ):  # fmt: skip
        if path in single:
            line(f"  {label}", of(path, f))
    print(
        "  (a first chunk held tens of ms after the headers: the server's socket waits for "
        "the\n  ACK of its headers (Nagle's algorithm); the client delays it up to 40 ms)"
    )
    return shifts


def report_load(
    rounds: list[Round], concurrency: int
) -> dict[str, tuple[tuple[float, float], float]]:
    """Section 2; returns each trainhub path's added TTFT and throughput ratio."""
    print(f"\n2. {concurrency} at once, rounds in this order (ms; CPU-seconds over the round)")
    print(f"  {'round':<11}{'wall s':>7}{'tok/s':>7}{'TTFT min':>9}{'p50':>7}{'p95':>7}"
          f"{'chunk1 p50':>11}{'p95':>7}{'overflow':>9}{'machine':>8}"
          "  CPU door/web/stream/server/client")  # fmt: skip
    for i, r in enumerate(rounds, 1):
        ttft, first, c = [s.ttft for s in r.samples], [s.first_chunk for s in r.samples], r.cpu
        print(f"  {i:>2} {r.path:<8}{r.wall:7.2f}{r.tokens / r.wall:7.1f}{min(ttft) * 1000:9.0f}"
              f"{q(ttft, 50):7.0f}{q(ttft, 95):7.0f}{q(first, 50):11.0f}{q(first, 95):7.0f}"
              f"{r.overflows:9d}{r.busy:8.0%}  {c['door']:.2f}/{c['web']:.2f}/{c['stream']:.2f}/"
              f"{c['server']:.2f}/{c['client']:.2f}")  # fmt: skip
    by: dict[str, list[Round]] = {}
    for r in rounds:
        by.setdefault(r.path, []).append(r)

    def of(path: str, field: str, which: slice = slice(None)) -> list[float]:
        return [getattr(s, field) for r in by[path][which] for s in r.samples]

    def rate(path: str) -> float:
        return sum(r.tokens for r in by[path]) / sum(r.wall for r in by[path])

    d_ttft = of("direct", "ttft")
    aa = added(of("direct", "ttft", slice(1, None, 2)), of("direct", "ttft", slice(0, None, 2)))
    print(f"  direct: TTFT p50 / p95 {q(d_ttft, 50):.0f} / {q(d_ttft, 95):.0f} ms, "
          f"{rate('direct'):.1f} tokens/s; its later rounds minus its earlier ones (nothing "
          f"added: the noise) {aa[0]:+.0f} / {aa[1]:+.0f} ms")  # fmt: skip
    out = {}
    for path in [p for p in by if p != "direct"]:
        ttft, calls = of(path, "ttft"), sum(r.made for r in by[path])
        shift, ratio = added(ttft, d_ttft), rate(path) / rate("direct")
        cpu = {k: sum(r.cpu[k] for r in by[path]) / calls * 1000
               for k in ("door", "web", "stream")}  # fmt: skip
        print(f"  {path}: TTFT p50 / p95 {q(ttft, 50):.0f} / {q(ttft, 95):.0f} ms, added "
              f"{shift[0]:+.0f} / {shift[1]:+.0f} ms (the queue: see 3); {rate(path):.1f} "
              f"tokens/s = {ratio:.3f}x direct ({'PASS' if ratio >= GOAL_RATIO else 'FAIL'}); "
              f"CPU per request: door {cpu['door']:.1f} ms, web {cpu['web']:.1f} ms, stream "
              f"{cpu['stream']:.1f} ms"
        )  # fmt: skip
        out[path] = (shift, ratio)
    return out


def report_paced(
    rounds: list[Round], concurrency: int, token_ms: float, seconds: float
) -> dict[str, tuple[float, float]]:
    """Section 3; returns each trainhub path's added TTFT at ``concurrency``."""
    print(
        f"\n3. {concurrency} in flight against the paced server (a token every {token_ms:g} ms "
        f"a stream), {len(rounds) // len({r.path for r in rounds})} x {seconds:g} s a path"
    )
    print(f"  {'path':<10}{'answers':>8}{'TTFT p50':>9}{'p95':>7}{'added p50':>10}{'p95':>7}"
          f"{'  token delay p50':>18}{'p95':>7}{'max':>7}{'head p95':>9}{'overflow':>9}{'machine':>8}"
          "  CPU ms/request door/web/stream")  # fmt: skip
    by: dict[str, list[Round]] = {}
    for r in rounds:
        by.setdefault(r.path, []).append(r)
    direct = [s.ttft for r in by["direct"] for s in r.samples]
    out = {}
    for path, runs in by.items():
        samples = [s for r in runs for s in r.samples]
        ttft, delays = [s.ttft for s in samples], [d for s in samples for d in s.delays]
        shift = added(ttft, direct)
        busy = sum(r.busy for r in runs) / len(runs)
        made = sum(r.made for r in runs)
        cpu = [sum(r.cpu[k] for r in runs) / made * 1000 for k in ("door", "web", "stream")]
        verdict_text = "" if path == "direct" else f"  {verdict(shift)}"
        print(f"  {path:<10}{len(samples):8d}{q(ttft, 50):9.1f}{q(ttft, 95):7.1f}{shift[0]:10.1f}"
              f"{shift[1]:7.1f}{q(delays, 50):18.1f}{q(delays, 95):7.1f}{max(delays) * 1000:7.1f}"
              f"{q([s.head for s in samples], 95):9.1f}{sum(r.overflows for r in runs):9d}{busy:8.0%}  {cpu[0]:.1f}/{cpu[1]:.1f}/{cpu[2]:.1f}{verdict_text}")  # fmt: skip
        if path != "direct":
            out[path] = shift
    return out


def report_in_process(took: dict[str, list[float]]) -> None:
    print("\n4. in this process (ms, p50 / p95): the web's 307 by Django alone "
          f"{q(took['307'], 50):.1f} / {q(took['307'], 95):.1f}; grant_for "
          f"{q(took['grant_for'], 50):.2f} / {q(took['grant_for'], 95):.2f}; granted_key "
          f"{q(took['granted_key'], 50):.1f} / {q(took['granted_key'], 95):.1f}")  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--database-url", help="default: see the module docstring")
    ap.add_argument("--redis-url", default=DEFAULT_REDIS)
    ap.add_argument("--concurrency", type=int, default=64, help="requests at once in a round")
    ap.add_argument("--rounds", type=int, default=2, help="times the rounds on every path")
    ap.add_argument("--requests", type=int, default=30, help="one-at-a-time requests per path")
    ap.add_argument("--max-tokens", type=int, default=16, help="tokens per answer")
    ap.add_argument("--token-ms", type=float, default=50.0, help="the paced server's pace")
    ap.add_argument("--steady-seconds", type=float, default=6.0,
                    help="section 3: how long each path is held at --concurrency")  # fmt: skip
    ap.add_argument("--shared-cores", action="store_true", help="the engine not pinned")
    ap.add_argument("--keep-logs", action="store_true", help="print the processes' logs")
    args = ap.parse_args()

    url = bench_database_url(args.database_url, env="BENCH_PROXY_DATABASE_URL", name=DB_NAME)
    if "bench_proxy" not in urlsplit(url).path:
        ap.error(f"refusing to drop {url}: its name must contain 'bench_proxy'")
    # SIGTERM ends the run as Ctrl-C does (even where a shell started it with SIGINT ignored):
    # through the finally blocks that stop the processes.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    pg_version = database_recreate(url)
    with tempfile.TemporaryDirectory(prefix="trainhub-proxy-bench-") as tmpname:
        tmp = Path(tmpname)
        (tmp / "var" / "static").mkdir(parents=True)  # WhiteNoise warns of a missing one
        from cryptography.fernet import Fernet

        os.environ.update(
            DJANGO_SETTINGS_MODULE="trainhub.settings",
            DATABASE_URL=url,
            CELERY_BROKER_URL=args.redis_url,
            TRAINHUB_LIVE_REDIS_URL=args.redis_url,
            TRAINHUB_LIVE_PREFIX=f"trainhub_proxy_bench_{os.getpid()}",
            DJANGO_SECRET_KEY="trainhub-proxy-bench-not-a-secret-" + "x" * 24,
            TRAINHUB_ENCRYPTION_KEYS=Fernet.generate_key().decode(),
            TRAINHUB_VAR_DIR=str(tmp / "var"),
            TRAINHUB_LOG_LEVEL="WARNING",
            TRAINHUB_API_RATE_LIMIT="100000000/minute",
        )
        import django

        django.setup()
        from django.db import connections

        from trainhub.shared_redis import redis_client

        try:
            with plane(args, tmp) as p:
                redis_client().delete("default")  # the place_deployments message: no worker here
                print(f"machine: {machine(ROOT)}; {pg_version}")
                print(f"server: gpu_worker serve, tiny model, one thread, on CPUs "
                      f"{sorted(os.sched_getaffinity(p.server.popen.pid))}; web, stream and this "
                      f"client on CPUs {sorted(os.sched_getaffinity(0))}")  # fmt: skip
                for proc in (p.web, p.stream):
                    print(f"{proc.name}: {shlex.join(cast(list[str], proc.popen.args)[2:])}")
                print(f"each request: greedy chat completion, streamed, max_tokens "
                      f"{args.max_tokens}")  # fmt: skip
                single, rounds, paced_rounds = asyncio.run(measure(args, p))
            took = in_process(p.raw_key)
        except BenchError as exc:
            print(f"FAILED: {exc}")
            return 1
        except KeyboardInterrupt:
            print("interrupted: the processes it started are stopped")
            return 130
        finally:
            connections.close_all()
    single_added = report_single(single)
    load = report_load(rounds, args.concurrency)
    paced = report_paced(paced_rounds, args.concurrency, args.token_ms, args.steady_seconds)
    report_in_process(took)
    print(f"\nRESULT ({GOAL_TEXT} added TTFT; throughput >= {GOAL_RATIO:g}x direct):")
    if "door" not in single:
        print(f"  through trainhub's front door: not measured: {nginx_missing_reason()}")
    for path, what in (("door", "through trainhub's front door (nginx, deploy/nginx.conf)"),
                       ("redirect", "through the web's 307 (no proxy in front, as the demo)"),
                       ("stream", "to the stream process itself")):  # fmt: skip
        if path not in single:
            continue
        one, (_, ratio), many = single_added[path], load[path], paced[path]
        print(f"  {what}: added TTFT one at a time {one[0]:.1f} / {one[1]:.1f} ms "
              f"({verdict(one)}), at {args.concurrency} (paced server) {many[0]:.1f} / "
              f"{many[1]:.1f} ms ({verdict(many)}); throughput {ratio:.3f}x "
              f"({'PASS' if ratio >= GOAL_RATIO else 'FAIL'})")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
