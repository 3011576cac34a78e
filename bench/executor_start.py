"""Executor start -> first training step on a node, warm (gpu_worker.warm) vs cold.

A cold start is what a node did before warm starts, and still does as a fallback: spawn
``python -m gpu_worker run SPEC`` and let it import torch, transformers and peft, load the model
and train. A warm start hands the same arguments to a ``python -m gpu_worker warm`` process the
node started ahead (it waits until that one says ready first: on a node it has been ready since
the previous attempt ended, so that wait is not part of an attempt's start). Both run the tiny
model on the demo chat data (CPU, one torch thread) with a JSON-lines event sink.

For each run: t0 = just before the spawn (cold) or the hand-over (warm); the first training
step = the ``ts`` of the executor's first ``metrics`` event (it reports step 1 at once); the
model loaded = the ``ts`` of its ``running`` status event, sent right before training starts.
Runs alternate cold and warm. Prints median / p90 / min / max of start -> first step for each
and of start -> running, and the ratio of the medians (goal: warm <= 2 s median).

    .venv/bin/python bench/executor_start.py [--runs 10]

How it measures:

- Both kinds run the real executor (``python -m gpu_worker``) on a spec with ``file://`` URLs:
  the tiny model (built once, offline), the 60 demo chats, one epoch, LoRA r 8, batch 4,
  max_seq_length 128, a JSON-lines event sink; ``TRAINHUB_*`` cleared, ``OMP_NUM_THREADS=1``.
- Cold: t0 = just before ``subprocess.Popen([python, -m, gpu_worker, run, spec, --workdir
  ...])``, as the supervisor's cold fallback does.
- Warm: ``WarmExecutor.spawn`` (``python -m gpu_worker warm``), then ``ready()`` waits for the
  "ready" line on its pipe (not timed); t0 = just before ``hand()`` writes the order to its
  stdin.
- The first step's ``ts`` is the executor's own clock; the bench checks that the event is
  step 1. Every run must succeed.
- ``--runs`` of each, alternating cold/warm and warm/cold so drifting load hits both alike.
- A warm process runs one attempt and exits (that is what frees an attempt's GPU memory), so
  each warm run spawns a fresh one, as the node does after every attempt.

About 4 minutes on 2 cores. Figures: docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _common import machine

from gpu_worker.checkpoints import file_sha256
from gpu_worker.warm import WarmExecutor

ROOT = Path(__file__).resolve().parent.parent
DATASET = ROOT / "gpu_worker" / "data" / "demo_chat.jsonl"
GOAL_WARM_MEDIAN_S = 2.0


def executor_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINHUB_")}
    return {**env, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


def write_spec(tmp: Path, model: Path, n: int) -> tuple[Path, Path]:
    out = tmp / f"run{n}"
    out.mkdir()
    spec = {
        "version": 1,
        "job_id": "ftjob-bench",
        "attempt": n,
        "model": str(model),
        "dataset": {"url": DATASET.as_uri(), "sha256": file_sha256(DATASET), "format": "messages"},
        "outputs": {
            "artifact_url": (out / "adapter.tar").as_uri(),
            "checkpoint_url": (out / "checkpoint.tar").as_uri(),
            "resume_url": None,
        },
        "adapter": {"type": "lora", "r": 8, "alpha": 16, "dropout": 0.0},
        "hyperparameters": {"n_epochs": 1, "batch_size": 4, "learning_rate": 2e-3,
                            "max_seq_length": 128, "warmup_ratio": 0.0},
        "seed": 7,
        "report": {"sinks": [{"type": "jsonl", "path": str(out / "events.jsonl")}]},
    }  # fmt: skip
    path = out / "spec.json"
    path.write_text(json.dumps(spec))
    return path, out


def timings(out: Path, t0: float) -> tuple[float, float]:
    """(start -> running, start -> first step) in seconds, from the executor's own event ts."""
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    running = next(e["ts"] for e in events if e["type"] == "status" and
                   e["data"].get("status") == "running")  # fmt: skip
    first = next(e for e in events if e["type"] == "metrics")
    if first["data"].get("step") != 1:
        raise RuntimeError(f"the first metrics event is step {first['data'].get('step')}, not 1")
    if events[-1]["data"].get("status") != "succeeded":
        raise RuntimeError(f"the run did not succeed: {events[-1]}")
    return running - t0, first["ts"] - t0


def run_cold(spec: Path, out: Path) -> tuple[float, float]:
    args = [sys.executable, "-m", "gpu_worker", "run", str(spec), "--workdir", str(out / "w")]
    t0 = time.time()
    proc = subprocess.Popen(args, env=executor_env(), stdout=subprocess.DEVNULL,  # noqa: S603
                            stderr=subprocess.DEVNULL)  # fmt: skip
    if proc.wait(timeout=600) != 0:
        raise RuntimeError(f"the cold executor exited {proc.returncode}")
    return timings(out, t0)


def run_warm(spec: Path, out: Path) -> tuple[float, float]:
    with open(os.devnull, "wb") as quiet:
        saved = os.dup(1), os.dup(2)
        os.dup2(quiet.fileno(), 1), os.dup2(quiet.fileno(), 2)  # the child's output, not ours
        try:
            warm = WarmExecutor.spawn(executor_env())
        finally:
            os.dup2(saved[0], 1), os.dup2(saved[1], 2)
            os.close(saved[0]), os.close(saved[1])
    if not warm.ready(timeout=300):
        raise RuntimeError("the warm executor never became ready")
    t0 = time.time()
    proc = warm.hand(["run", str(spec), "--workdir", str(out / "w")], {})
    if proc is None or proc.wait(timeout=600) != 0:
        raise RuntimeError("the warm executor did not run the attempt")
    return timings(out, t0)


def summary(name: str, values: list[float]) -> str:
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]
    return (f"{name}: median {statistics.median(values):.2f} s, p90 {p90:.2f} s, "
            f"min {ordered[0]:.2f} s, max {ordered[-1]:.2f} s")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10, help="runs of each kind")
    args = parser.parse_args()
    print(machine(ROOT))
    from gpu_worker.tiny_model import build_tiny_model

    with tempfile.TemporaryDirectory(prefix="executor-start-") as name:
        tmp = Path(name)
        model = build_tiny_model(tmp / "tiny-llama")
        results: dict[str, list[tuple[float, float]]] = {"cold": [], "warm": []}
        n = 0
        for i in range(args.runs):
            for kind in ("cold", "warm") if i % 2 == 0 else ("warm", "cold"):
                n += 1
                spec, out = write_spec(tmp, model, n)
                got = (run_cold if kind == "cold" else run_warm)(spec, out)
                results[kind].append(got)
                print(f"  {kind} run {len(results[kind])}: running at {got[0]:.2f} s, "
                      f"first step at {got[1]:.2f} s", flush=True)  # fmt: skip
    print()
    for kind, pairs in results.items():
        print(summary(f"{kind} start -> running (model loaded)", [p[0] for p in pairs]))
        print(summary(f"{kind} start -> first step", [p[1] for p in pairs]))
    cold = statistics.median(p[1] for p in results["cold"])
    warm = statistics.median(p[1] for p in results["warm"])
    verdict = "PASS" if warm <= GOAL_WARM_MEDIAN_S else "FAIL"
    print(f"\nwarm start -> first step median <= {GOAL_WARM_MEDIAN_S:.0f} s: {verdict} "
          f"({warm:.2f} s; cold {cold:.2f} s, {cold / warm:.1f}x)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
