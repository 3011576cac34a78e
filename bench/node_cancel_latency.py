"""Node cancel latency: ``POST /api/v1/jobs/{id}/cancel/`` to the node's executor signalled.

A node can't be sent anything but its own queue's doorbell, so a cancel is pulled: while an
attempt runs, the supervisor sends a heartbeat naming it every
``TRAINHUB_NODE_CONTROL_POLL_SECONDS`` (default 2 s, used here) and writes the attempt's cancel
file, which the executor watches, when the answer names the attempt. The same real processes as
``dispatch_latency.py`` (gunicorn ``-w 2``, a prefork control-plane worker, a CPU node on Redis
as its own ACL user, no beat). For each job, one at a time: submit it (50 epochs, so it is
still training), wait until its node claimed it, wait a uniform random 0-2 s (so the cancel
lands anywhere in the poll period), then time ``t0`` = just before the cancel POST to the
supervisor's ``cancel requested for <job> attempt 1`` log line (written right after the cancel
file; same machine clock, ms resolution). The job must then end ``cancelled`` and the node be
free before the next one. Prints p50/p95/max/mean over ``--jobs`` jobs, PASS/FAIL against
p95 <= 5 s.

    .venv/bin/python bench/node_cancel_latency.py [--jobs 30] [--keep-logs]

Database and broker as in dispatch_latency.py (``--database-url``, ``--broker-url``; the
database is dropped and created again). About 3 minutes on 2 cores. Figures:
docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _common import bench_database_url
from dispatch_latency import (
    DB_NAME,
    DEFAULT_BROKER,
    JOB_TIMEOUT,
    Bench,
    percentile,
    run_fleet_bench,
    summary,
    wait_for,
)

GOAL_P95_S = 5.0
POLL_SECONDS = 2.0


class CancelBench(Bench):
    def node_env(self, token: str) -> dict[str, str]:
        return {
            **super().node_env(token),
            "TRAINHUB_CONTROL_URL": self.base,
            "TRAINHUB_NODE_CONTROL_POLL_SECONDS": str(POLL_SECONDS),
        }

    def job_body(self) -> dict[str, Any]:
        body = super().job_body()
        body["hyperparameters"]["n_epochs"] = 50  # still training when it is cancelled
        return body

    def cancel_one(self, tasks_done: int) -> float:
        """Seconds from the cancel POST to the supervisor signalling the executor."""
        self.node_log.mark()
        job_id, _, _ = self.submit()
        wait_for(f"{job_id} to be claimed", lambda: self.claimed_attempt(job_id), JOB_TIMEOUT,
                 self.procs)  # fmt: skip
        time.sleep(random.uniform(0, POLL_SECONDS))  # noqa: S311 - a phase, not a secret
        t0 = time.time()
        self.cancel(job_id)
        signalled = wait_for(
            "the supervisor's 'cancel requested' line",
            lambda: self.node_log.first(f"cancel requested for {job_id} attempt 1"),
            30,
            self.procs,
        )
        self.wait_cancelled(job_id, tasks_done)
        return float(signalled) - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=30, help="timed cancels (default 30)")
    ap.add_argument("--database-url", help=f"default: as dispatch_latency.py ({DB_NAME})")
    ap.add_argument("--broker-url", default=DEFAULT_BROKER)
    ap.add_argument("--keep-logs", action="store_true", help="keep the temp dir with the logs")
    args = ap.parse_args()
    args.control_pool = "prefork"
    args.url = bench_database_url(
        args.database_url, env="BENCH_DISPATCH_DATABASE_URL", name=DB_NAME
    )
    if "dispatch_bench" not in urlsplit(args.url).path:
        ap.error(f"refusing to drop {args.url}: the database's name must contain 'dispatch_bench'")

    def measure(bench: CancelBench, started: float) -> None:
        print(f"ready after {time.monotonic() - started:.0f} s; timing {args.jobs} cancels...")
        seconds = [bench.cancel_one(tasks) for tasks in range(1, args.jobs + 1)]
        p95 = percentile(seconds, 95)
        print(f"\ncancel POST -> executor signalled (ms), poll every {POLL_SECONDS:.0f} s: "
              f"{summary([s * 1000 for s in seconds])}")  # fmt: skip
        verdict = "PASS" if p95 <= GOAL_P95_S else "FAIL"
        print(f"goal p95 <= {GOAL_P95_S:.0f} s: {verdict} (p95 {p95:.2f} s)")

    return run_fleet_bench(CancelBench, args, "trainhub-cancel-", measure)


if __name__ == "__main__":
    sys.exit(main())
