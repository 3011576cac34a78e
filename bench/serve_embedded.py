"""The embedded inference server (``python -m gpu_worker serve``): generated tokens/s and time to
first token through its HTTP API, with a LoRA adapter loaded at run time.

1. CPU: the tiny model (gpu_worker.tiny_model) with a random LoRA adapter (r=8 on the
   attention and MLP projections, B not zero so the adapter changes the answers).
2. CUDA only (issue 30's GPU check when no vLLM can be carried to the machine): the random-init
   ~1B Llama of bench/train_throughput.py in bf16 with a random r=16 adapter.

For each: the server is started as its own process (``--port 0``), the adapter is loaded from
its bundle's ``file://`` URL with its sha256 (the path the control plane will use), then
--requests greedy chat completions of at most --max-tokens tokens, one after another, half of
them streamed. Figures: completion tokens/s over the requests' wall time (the server generates
one request at a time), time to first streamed token p50/p95, and the load time of the adapter.

    .venv/bin/python bench/serve_embedded.py [--requests 20] [--max-tokens 64] [--no-gpu]

About 40 s on CPU; on an H100 about 3 minutes (the 1B model build, its load, the requests).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import train_throughput as tt  # the ~1B model builder and the machine line

ROOT = Path(__file__).resolve().parent.parent
QUESTION = [
    {"role": "user", "content": "What colour is owl number 3, and on which day does ferry 2 sail?"}
]


def _random_adapter(model_dir: Path, out: Path, r: int) -> tuple[Path, str]:
    """A LoRA adapter with random weights on ``model_dir``, as an adapter bundle."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from trainhub_contract.bundle import write_bundle

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    config = LoraConfig(r=r, lora_alpha=2 * r, target_modules="all-linear", init_lora_weights=False)
    get_peft_model(model, config).save_pretrained(str(out / "adapter"))
    tar = out / "adapter.tar"
    with tar.open("wb") as fh:
        write_bundle(out / "adapter", fh)
    return tar, hashlib.sha256(tar.read_bytes()).hexdigest()


def _serve(model_dir: Path, cache: Path) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(  # noqa: S603 - this interpreter with fixed arguments
        [sys.executable, "-m", "gpu_worker", "serve", str(model_dir), "--port", "0",
         "--served-model-name", "base", "--adapter-cache", str(cache)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"},
    )  # fmt: skip
    line = proc.stdout.readline() if proc.stdout is not None else ""
    if not line.startswith("serving on "):
        proc.kill()
        raise RuntimeError(f"the server did not start (exit {proc.poll()})")
    return proc, line.removeprefix("serving on ").strip()


def measure(
    label: str, model_dir: Path, tmp: Path, args: argparse.Namespace, r: int
) -> dict[str, Any]:
    tar, sha256 = _random_adapter(model_dir, tmp / f"{label}-adapter", r)
    proc, url = _serve(model_dir, tmp / f"{label}-cache")
    try:
        with httpx.Client(base_url=url, timeout=600) as client:
            started = time.perf_counter()
            loaded = client.post("/v1/load_lora_adapter", json={
                "lora_name": "bench", "lora_path": tar.as_uri(), "sha256": sha256})  # fmt: skip
            load_s = time.perf_counter() - started
            loaded.raise_for_status()
            body = {"model": "bench", "messages": QUESTION, "temperature": 0,
                    "max_tokens": args.max_tokens}  # fmt: skip
            tokens, first_token, wall = 0, [], 0.0
            for i in range(args.requests):
                started = time.perf_counter()
                if i % 2:
                    got_first = None
                    with client.stream("POST", "/v1/chat/completions", json={
                            **body, "stream": True, "stream_options": {"include_usage": True}}) as resp:  # fmt: skip
                        for line in resp.iter_lines():
                            if not line.startswith("data: ") or line == "data: [DONE]":
                                continue
                            chunk = json.loads(line.removeprefix("data: "))
                            content = (
                                chunk["choices"][0]["delta"].get("content")
                                if chunk["choices"]
                                else None
                            )
                            if content and got_first is None:
                                got_first = time.perf_counter() - started
                            if chunk.get("usage"):
                                tokens += chunk["usage"]["completion_tokens"]
                    if got_first is not None:
                        first_token.append(got_first)
                else:
                    answer = client.post("/v1/chat/completions", json=body).json()
                    tokens += answer["usage"]["completion_tokens"]
                wall += time.perf_counter() - started
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    ttft = sorted(first_token)
    return {
        "label": label,
        "requests": args.requests,
        "completion_tokens": tokens,
        "tokens_per_second": tokens / wall if wall else 0.0,
        "ttft_p50_ms": statistics.median(ttft) * 1000 if ttft else None,
        "ttft_p95_ms": ttft[max(0, int(len(ttft) * 0.95) - 1)] * 1000 if ttft else None,
        "adapter_load_s": load_s,
    }


def _print(row: dict[str, Any]) -> None:
    ttft = f"{row['ttft_p50_ms']:.0f} / {row['ttft_p95_ms']:.0f} ms" if row["ttft_p50_ms"] else "-"
    print(f"{row['label']}: {row['requests']} requests, {row['completion_tokens']} tokens, "
          f"{row['tokens_per_second']:,.1f} tokens/s; time to first token p50 / p95 {ttft}; "
          f"adapter fetched, checked and loaded in {row['adapter_load_s']:.2f} s")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--no-gpu", action="store_true")
    args = parser.parse_args()
    import torch

    from gpu_worker.tiny_model import build_tiny_model

    print(f"machine: {tt._machine()}")
    with tempfile.TemporaryDirectory(prefix="trainhub-serve-") as tmpname:
        tmp = Path(tmpname)
        tiny = build_tiny_model(tmp / "tiny")
        if not torch.cuda.is_available():
            _print(measure("CPU, tiny model", tiny, tmp, args, r=8))
            if not args.no_gpu:
                print("GPU: no CUDA GPU: the 1B run was not made (no figures measured)")
            return 0
        if args.no_gpu:
            print("GPU: skipped (--no-gpu)")
            return 0
        built = tt._spawn({"mode": "build", "tokenizer": str(tiny), "vocab": 32000,
                           "out": str(tmp / "llama-1b")}, timeout=600)  # fmt: skip
        if not built.get("ok"):
            print(f"GPU: building the ~1B model FAILED: {built.get('error')}")
            return 1
        print(f"GPU: {torch.cuda.get_device_name(0)}, Llama {built['parameters'] / 1e9:.2f}B bf16")
        _print(measure("GPU, 1B model", tmp / "llama-1b", tmp, args, r=16))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
