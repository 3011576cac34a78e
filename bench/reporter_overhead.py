"""What the executor's reporter costs the training loop, per optimizer step.

Times what the training callback does each step: one ``reporter.metrics(...)`` and one
``reporter.log(...)``, on a real ``Reporter`` (heartbeat thread running) with a ``JsonlSink``
on local disk, so the amortised cost of the batch sends (a write + fsync every 50 events) is in
the mean. Compares the mean with a typical CPU tiny-model step (~50 ms; goal <= 2%).

    .venv/bin/python bench/reporter_overhead.py [--steps 20000] [--step-ms 50] [--goal-pct 2]

Django-free and offline; about 2 s. The same calls measured inside real training runs are part
of bench/train_throughput.py. Figures: docs/BENCHMARKS.md (training throughput).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpu_worker.report import JsonlSink, Reporter


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20000)
    parser.add_argument("--step-ms", type=float, default=50.0, help="reference step time")
    parser.add_argument("--goal-pct", type=float, default=2.0)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "events.jsonl"
        reporter = Reporter(job_id="ftjob-bench", attempt=1, sinks=[JsonlSink(path)])
        costs: list[float] = []
        with reporter:
            for step in range(1, args.steps + 1):
                started = time.perf_counter()
                reporter.metrics(
                    step=step,
                    total_steps=args.steps,
                    epoch=step / args.steps,
                    loss=2.0 / step,
                    lr=2e-4,
                    tokens_per_second=12345.6,
                    grad_norm=0.9,
                )
                reporter.log(f"step {step} done", step=step)
                costs.append(time.perf_counter() - started)
        lines = sum(1 for _ in path.open())

    costs_us = sorted(c * 1e6 for c in costs)
    mean = statistics.fmean(costs_us)
    pct = mean / (args.step_ms * 1000) * 100
    q = statistics.quantiles(costs_us, n=100)
    print(f"steps: {args.steps}  events written: {lines}  sink: JsonlSink (fsync per batch)")
    print(
        f"per step (metrics + log): mean {mean:.1f} us  p50 {q[49]:.1f} us  "
        f"p99 {q[98]:.1f} us  max {costs_us[-1]:.0f} us"
    )
    verdict = "PASS" if pct <= args.goal_pct else "FAIL"
    print(
        f"overhead vs a {args.step_ms:g} ms step: {pct:.3f}% "
        f"(goal <= {args.goal_pct:g}%): {verdict}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
