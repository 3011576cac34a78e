"""Command line of the executor.

    python -m gpu_worker run SPEC.json [--workdir DIR] [--cancel-file PATH]
                                       [--checkpoint-every-steps N] [--checkpoint-every-seconds S]
    python -m gpu_worker warm
    python -m gpu_worker serve-loader ENGINE_URL [--host H] [--port P] [--api-key KEY]
                                                 [--adapter-cache DIR]
    python -m gpu_worker make-tiny-model DIR [--seed N]
    python -m gpu_worker serve MODEL [--host H] [--port P] [--max-adapters N]
                                     [--served-model-name NAME] [--api-key KEY]
                                     [--adapter-cache DIR]

``run`` trains one attempt (gpu_worker.train.run), reporting through the sinks the spec's
``report`` block names, and exits with 0 succeeded, 1 failed, 2 unusable spec or command line,
3 cancelled, 4 timeout, 5 preempted (trainhub_contract.outcomes.ExitCode). The last stdout line is a JSON summary
(``status, reason, message, sha256, size``) for wrappers that cannot read the events.
``warm`` does the imports first and then runs the one ``run`` ordered on its stdin (a GPU
node's warm executor, gpu_worker.warm). ``serve`` answers vLLM's OpenAI-compatible API with
MODEL and the LoRA adapters loaded into it at run time (gpu_worker.serving); it prints
``serving on http://HOST:PORT`` once it listens (``--port 0``: a free port) and stops on
SIGTERM or SIGINT. ``serve-loader`` runs beside a vLLM server, loading adapter bundles into it
from their signed URLs once checked (gpu_worker.serving.loader).
While training runs, what the process writes to stdout/stderr and what it logs also become
``log`` events (gpu_worker.logcapture: rate-capped, secrets masked), and still reach stdout and
stderr unchanged.

Stopping: SIGTERM or SIGINT, or the appearance of ``--cancel-file``, stops training within one
optimizer step, removes the working files and exits 3. A second signal stops at once. A cancel
file holding "pause" (trainhub_contract.outcomes.StopMode) stops the same way after uploading a
checkpoint of the last finished step, so the job's next attempt resumes there.

Preemption: on a spot machine (the spec's ``preemption_notice``, or
``TRAINHUB_PREEMPTION_NOTICE=aws`` set by the launcher) a watcher checks the provider's
metadata service (``TRAINHUB_IMDS_URL`` overrides its address, ``TRAINHUB_PREEMPTION_POLL_SECONDS``
its 5 s between checks) for the interruption notice;
on one, the run checkpoints the last finished step like a pause and exits 5
(gpu_worker.preemption). A cancel file holding "preempt" asks for the same.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
from http.server import ThreadingHTTPServer
from pathlib import Path
from types import FrameType

from gpu_worker.errors import Cancelled
from trainhub_contract.outcomes import ExitCode, StopMode

log = logging.getLogger("gpu_worker")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m gpu_worker", description=__doc__.split("\n\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run one training attempt from a job spec (JSON file)")
    run.add_argument("spec", type=Path, help="the job spec, a JSON file ('-' reads stdin)")
    run.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="scratch directory (default: a new temporary directory, removed afterwards; "
        "$TRAINHUB_WORKDIR chooses where)",
    )
    run.add_argument("--cancel-file", type=Path, default=None, help="stop when this file appears")
    run.add_argument("--checkpoint-every-steps", type=int, default=None, metavar="N")
    run.add_argument(
        "--checkpoint-every-seconds",
        type=float,
        default=None,
        metavar="S",
        help="also checkpoint after S seconds without one (0: by steps only)",
    )

    sub.add_parser(
        "warm",
        help="import the training stack, then run the one attempt ordered on stdin "
        "(a GPU node's warm executor: gpu_worker.warm)",
    )

    serve = sub.add_parser("serve", help="serve MODEL and its adapters (vLLM's HTTP API)")
    serve.add_argument("model", help="a hub id or a local model directory")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8100, help="0: a free port")
    serve.add_argument("--max-adapters", type=int, default=4,
                       help="adapters held at once; the least recently used goes first")  # fmt: skip
    serve.add_argument("--served-model-name", default=None, help="the base model's name")
    serve.add_argument("--adapter-cache", type=Path, default=None,
                       help="where fetched adapter bundles are unpacked, by sha256")  # fmt: skip
    serve.add_argument("--api-key", default=os.environ.get("TRAINHUB_SERVE_API_KEY"),
                       help="require this bearer token on /v1 (default $TRAINHUB_SERVE_API_KEY)")  # fmt: skip

    loader = sub.add_parser(
        "serve-loader",
        help="beside a vLLM server: load adapter bundles from their signed URLs, checked, by path",
    )
    loader.add_argument("engine_url", help="the vLLM server's base URL, e.g. http://127.0.0.1:8000")
    loader.add_argument("--host", default="127.0.0.1")
    loader.add_argument("--port", type=int, default=8101, help="0: a free port")
    loader.add_argument("--adapter-cache", type=Path, default=None,
                        help="where fetched adapter bundles are unpacked, by sha256")  # fmt: skip
    loader.add_argument("--api-key", default=os.environ.get("VLLM_API_KEY"),
                        help="vLLM's key: required of callers, sent to vLLM (default $VLLM_API_KEY)")  # fmt: skip

    tiny = sub.add_parser("make-tiny-model", help="build the tiny offline test model into DIR")
    tiny.add_argument("dir", type=Path)
    tiny.add_argument("--seed", type=int, default=0)
    return parser


def _load_spec(path: Path):  # type: ignore[no-untyped-def]
    from trainhub_contract.spec import SpecError, parse_job_spec

    try:
        text = sys.stdin.read() if str(path) == "-" else path.read_text(encoding="utf-8")
        return parse_job_spec(json.loads(text))
    except (OSError, ValueError) as exc:  # SpecError and JSONDecodeError are ValueErrors
        detail = exc.message if isinstance(exc, SpecError) else str(exc)
        print(f"error: cannot use the job spec {path}: {detail}", file=sys.stderr)
        return None


class _StopFlag:
    """SIGTERM/SIGINT and the cancel file, as the should_stop() that run() polls: None to go
    on, else how to stop (a signal is a cancel; the cancel file says cancel or pause)."""

    def __init__(self, cancel_file: Path | None) -> None:
        self.cancel_file = cancel_file
        self.event = threading.Event()
        self.mode: StopMode | None = None

    def handle(self, signum: int, frame: FrameType | None) -> None:
        if self.event.is_set():
            raise Cancelled(f"{signal.Signals(signum).name} received again; stopping now.")
        log.warning("%s received: stopping after the current step", signal.Signals(signum).name)
        self.event.set()

    def __call__(self) -> StopMode | None:
        if not self.event.is_set() and self.cancel_file is not None:
            mode = StopMode.of_file(self.cancel_file)
            if mode is not None:
                log.warning(
                    "cancel file %s asks for a %s: stopping after the current step",
                    self.cancel_file,
                    mode,
                )
                self.mode = mode
                self.event.set()
        if not self.event.is_set():
            return None
        return self.mode or StopMode.CANCEL  # a signal is a cancel


def _run(args: argparse.Namespace) -> int:
    spec = _load_spec(args.spec)
    if spec is None:
        return ExitCode.USAGE
    # Before transformers/peft are imported anywhere in this process (Unsloth must come first).
    from gpu_worker import backends

    backends.select_backend()
    from gpu_worker import train
    from gpu_worker.logcapture import LogCapture
    from gpu_worker.redaction import Redactor, secret_values
    from gpu_worker.report import Reporter

    try:
        reporter = Reporter.from_spec(spec)
    except ValueError as exc:
        print(f"error: invalid report settings in the job spec: {exc}", file=sys.stderr)
        return ExitCode.USAGE

    flag = _StopFlag(args.cancel_file)
    previous = {sig: signal.signal(sig, flag.handle) for sig in (signal.SIGTERM, signal.SIGINT)}
    own_workdir = args.workdir is None
    workdir = (
        Path(tempfile.mkdtemp(prefix="trainhub-", dir=os.environ.get("TRAINHUB_WORKDIR")))
        if own_workdir
        else args.workdir
    )
    every_steps = args.checkpoint_every_steps or train.DEFAULT_CHECKPOINT_EVERY_STEPS
    every_seconds = args.checkpoint_every_seconds
    if every_seconds is None:
        every_seconds = train.DEFAULT_CHECKPOINT_EVERY_SECONDS
    try:
        # Training's output becomes log events; the capture ends before the summary below.
        with reporter, LogCapture(reporter, redactor=Redactor(secret_values(spec))):
            result = train.run(
                spec,
                reporter=reporter,
                workdir=workdir,
                should_stop=flag,
                checkpoint_every_steps=every_steps,
                checkpoint_every_seconds=every_seconds if every_seconds > 0 else None,
            )
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if own_workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    summary = {
        "status": result.status.value,
        "reason": result.reason,
        "message": result.message,
        "sha256": result.bundle_sha256,
        "size": result.bundle_size,
    }
    print(json.dumps(summary), flush=True)
    return result.exit_code


def _serve(args: argparse.Namespace) -> int:
    from gpu_worker.serving.engine import Engine
    from gpu_worker.serving.server import make_server

    engine = Engine(args.model, max_adapters=args.max_adapters, served_name=args.served_model_name)
    return _serve_until_signalled(make_server(engine, args.host, args.port, args.api_key,
                                              _adapter_cache(args)))  # fmt: skip


def _serve_loader(args: argparse.Namespace) -> int:
    from gpu_worker.serving.loader import make_loader

    return _serve_until_signalled(
        make_loader(args.engine_url, args.host, args.port, args.api_key, _adapter_cache(args))
    )


def _adapter_cache(args: argparse.Namespace) -> Path:
    return args.adapter_cache or Path(tempfile.gettempdir()) / "trainhub-adapters"


def _serve_until_signalled(server: ThreadingHTTPServer) -> int:
    def stop(signum: int, frame: FrameType | None) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, stop)
    host, port = server.server_address[:2]
    print(f"serving on http://{host!s}:{port}", flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if args.command == "warm":
        from gpu_worker.warm import serve

        return serve(main)
    if args.command == "serve-loader":
        return _serve_loader(args)
    if args.command == "serve":
        return _serve(args)
    if args.command == "make-tiny-model":
        from gpu_worker.tiny_model import build_tiny_model

        out = build_tiny_model(args.dir, seed=args.seed)
        print(out)
        return 0
    return _run(args)


if __name__ == "__main__":
    sys.exit(main())
