"""Artifact ingest throughput and memory: a 1 GiB adapter bundle verified on both backends.

Ingest is ``verify_bundle(storage.read_chunks(key))``, the whole data path of
``jobs.services.core.artifacts.artifact_ingest`` (the rest is two small database writes): read the
bundle back from storage, recompute every member's SHA-256 against the manifest and the
SHA-256 of the whole bundle. For each backend it prints

- throughput, and its ratio to ``sha256sum`` on the same file (page cache warm; goal >= 0.9),
- peak RSS growth of this process during the ingest (goal <= 64 MB; /proc/self/clear_refs
  resets the peak, VmHWM reads it),
- for S3, the raw download throughput of the same object from the server, since moto (a Python
  HTTP server on the same 2 cores) is slower than real S3.

    .venv/bin/python bench/artifact_ingest.py [--size-mib 1024] [--repeat 3] [--backends local,s3]
        [--goal-ratio 0.9] [--goal-rss-mb 64]

How it measures:

- The bundle is written as the executor writes it (``write_bundle``: manifest first, then a
  ``--size-mib`` ``adapter_model.safetensors`` of a repeated random MiB, and a config file).
- Baselines on the same file, best of ``--repeat``: ``sha256sum FILE`` (a process), and one
  hashlib SHA-256 pass in this process (1 MiB reads). The second is the stricter: a
  ``sha256sum`` build that does not use the CPU's SHA instructions is several times slower
  than OpenSSL behind hashlib.
- Ingest, best of ``--repeat``. Local: the bundle stored with ``storage.save_stream`` into a
  folder backend. S3: moto's server as a process on loopback, the bundle stored through the S3
  backend (multipart, 8 MiB parts); also timed, a plain drain of ``read_chunks`` (the download
  alone).
- Peak RSS growth of the benchmarking process: ``/proc/self/clear_refs`` (5) resets VmHWM
  before each run; the figure is VmHWM minus VmRSS before it. moto's own memory is its
  process's, not counted.

Needs no database or broker; S3 is moto's server on loopback. About 1-2 min on 2 cores.
Figures: docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MiB = 1024 * 1024
KEY = "projects/1/jobs/ftjob-bench/a1/adapter.tar"


def rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def reset_peak_rss() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # Linux >= 4.0: VmHWM := VmRSS


def make_bundle(folder: Path, size: int) -> Path:
    """An adapter folder of ``size`` bytes (weights + config), packed as the executor packs it."""
    from trainhub_contract.bundle import write_bundle

    adapter = folder / "adapter"
    adapter.mkdir()
    block = os.urandom(MiB)
    with (adapter / "adapter_model.safetensors").open("wb") as out:
        for _ in range(size // MiB):
            out.write(block)
    (adapter / "adapter_config.json").write_text('{"base_model_name_or_path": "bench/model"}')
    bundle = folder / "adapter.tar"
    with bundle.open("wb") as out:
        write_bundle(adapter, out)
    return bundle


def best_of(repeat: int, run: Callable[[], object]) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return min(times)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    for chunk in file_chunks(path):
        digest.update(chunk)
    return digest.hexdigest()


def file_chunks(path: Path) -> Iterator[bytes]:
    with path.open("rb") as fh:
        while chunk := fh.read(MiB):
            yield chunk


def measure_ingest(repeat: int, expected_sha: str) -> tuple[float, float]:
    """Best ingest time (s) and the largest peak-RSS growth (MB) over ``repeat`` runs."""
    from jobs import storage
    from trainhub_contract.bundle import verify_bundle

    times, growth = [], []
    for _ in range(repeat):
        reset_peak_rss()
        before = rss_kib("VmRSS")
        started = time.perf_counter()
        verified = verify_bundle(storage.read_chunks(KEY))
        times.append(time.perf_counter() - started)
        growth.append((rss_kib("VmHWM") - before) / 1024)
        if verified.sha256 != expected_sha:
            raise SystemExit(f"ingest computed {verified.sha256}, expected {expected_sha}")
    return min(times), max(growth)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--backends", default="local,s3")
    parser.add_argument("--goal-ratio", type=float, default=0.9)
    parser.add_argument("--goal-rss-mb", type=float, default=64.0)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="trainhub-bench-") as tmp:
        work = Path(tmp)
        os.environ.update(
            DJANGO_SETTINGS_MODULE="trainhub.settings",
            TRAINHUB_VAR_DIR=str(work / "var"),
            CELERY_BROKER_URL="redis://127.0.0.1:6379/15",  # unused: no task is sent
        )
        import django

        django.setup()
        from django.conf import settings

        from jobs import storage

        bundle = make_bundle(work, args.size_mib * MiB)
        size = bundle.stat().st_size
        sha256sum = [shutil.which("sha256sum") or "/usr/bin/sha256sum", str(bundle)]
        printed = subprocess.run(sha256sum, check=True, capture_output=True, text=True)  # noqa: S603
        sha = printed.stdout.split()[0]
        baseline = best_of(
            args.repeat,
            lambda: subprocess.run(sha256sum, check=True, capture_output=True),  # noqa: S603
        )
        # A stricter floor than sha256sum (whose build may not use the CPU's SHA instructions):
        # one pass of OpenSSL's SHA-256 over the same file, as hashlib runs it.
        one_pass = best_of(args.repeat, lambda: sha256_file(bundle))
        mb = size / 1e6
        print(f"bundle: {size / MiB:.0f} MiB, sha256 {sha[:16]}…  cores: {os.cpu_count()}")
        print(f"sha256sum: {baseline:.3f} s  {mb / baseline:.0f} MB/s (best of {args.repeat})")
        print(f"one hashlib SHA-256 pass: {one_pass:.3f} s  {mb / one_pass:.0f} MB/s")

        failed = False
        for backend in args.backends.split(","):
            extra = ""
            if backend == "local":
                settings.TRAINHUB_STORAGE = "local"
                settings.TRAINHUB_STORAGE_DIR = work / "storage"
                storage.save_stream(KEY, file_chunks(bundle))
                took, grew = measure_ingest(args.repeat, sha)
            else:
                from devsupport.processes import moto_s3_server

                for name, value in (
                    ("AWS_ACCESS_KEY_ID", "bench"),
                    ("AWS_SECRET_ACCESS_KEY", "bench"),
                ):
                    os.environ.setdefault(name, value)
                with moto_s3_server(work / "moto.log") as endpoint:
                    settings.TRAINHUB_STORAGE = "s3"
                    settings.TRAINHUB_S3_BUCKET = "trainhub-bench"
                    settings.TRAINHUB_S3_ENDPOINT_URL = endpoint
                    settings.TRAINHUB_S3_REGION = "us-east-1"
                    settings.TRAINHUB_S3_ADDRESSING_STYLE = "path"
                    storage.backend().client.create_bucket(Bucket="trainhub-bench")
                    storage.save_stream(KEY, file_chunks(bundle))
                    raw = best_of(
                        args.repeat, lambda: sum(len(c) for c in storage.read_chunks(KEY))
                    )
                    took, grew = measure_ingest(args.repeat, sha)
                extra = f"  (plain download from moto: {mb / raw:.0f} MB/s; ingest/download {raw / took:.2f})"
            ratio = baseline / took
            extra += f"  [vs one hashlib pass: {one_pass / took:.2f}]"
            ok = ratio >= args.goal_ratio and grew <= args.goal_rss_mb
            failed |= not ok
            print(
                f"{backend:5s} ingest: {took:.3f} s  {mb / took:.0f} MB/s  "
                f"ratio to sha256sum {ratio:.2f} (goal >= {args.goal_ratio:g})  "
                f"peak RSS growth {grew:.1f} MB (goal <= {args.goal_rss_mb:g}): "
                f"{'PASS' if ok else 'FAIL'}{extra}"
            )
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
