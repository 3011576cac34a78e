"""DPO in the executor (issue 29): what it learns on the tiny model, and on a GPU Unsloth vs PEFT.

1. CPU, tiny model (gpu_worker.tiny_model): SFT on the demo chats (3 epochs, lr 2e-3), then a
   DPO job on top of that adapter (``parent_adapter``) on the bundled demo pairs
   (gpu_worker/data/demo_preference.jsonl: the preferred reply ends in "!", the SFT data's in
   "."), 48 pairs to train on and 12 held out as the validation file; 4 epochs, lr 5e-3, beta
   0.5. Figures: tokens/s (both replies of a pair count), peak RSS, the reference pass, and on
   the held-out pairs the share whose policy log-probability favours the preferred reply,
   after SFT and after DPO (goal >= 90 % after DPO), with trl's rewards/accuracies.
2. CUDA only: the random-init ~1B Llama of bench/train_throughput.py, DPO from a fresh adapter
   on generated pairs (a long prompt of demo conversations, two long replies; every row
   truncated to --gpu-seq tokens), --gpu-batch pairs a step (2x rows), --gpu-steps steps, in a
   process per backend (TRAINHUB_BACKEND=unsloth, =peft), gradient checkpointing on: tokens/s,
   peak GPU memory, the reference pass, and the Unsloth/PEFT ratios. Without CUDA it says so
   and measures nothing. About 4 minutes on an H100 (the model build, two loads, 2 x 30 steps);
   the CPU part about 40 s.

    .venv/bin/python bench/dpo_throughput.py [--no-cpu] [--no-gpu] [--gpu-steps 30]
        [--gpu-batch 4] [--gpu-seq 1024] [--gpu-backends unsloth,peft] [--json PATH]

Every run is the real ``gpu_worker.train.run`` in a fresh subprocess (bench/train_throughput.py's
child: file:// URLs, its timing callback, peak RSS and GPU memory of its own).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import train_throughput as tt  # the child process, the ~1B model, the formatting

HELD_OUT = 12
PREFERRED_GOAL = 0.9
TINY_ADAPTER = {"type": "lora", "r": 8, "alpha": 16, "dropout": 0.0}


def _tiny_runs(tmp: Path) -> dict[str, Any]:
    from gpu_worker.tiny_model import DEMO_DATASET_PATH, DEMO_PREFERENCE_PATH, build_tiny_model

    model = tmp / "tiny-llama"
    build_tiny_model(model)
    chats = tmp / "chats.jsonl"
    sft_sha = tt._write_dataset(chats, DEMO_DATASET_PATH.read_text().splitlines())
    lines = DEMO_PREFERENCE_PATH.read_text().splitlines()
    pairs, held = tmp / "pairs.jsonl", tmp / "held.jsonl"
    pairs_sha = tt._write_dataset(pairs, lines[HELD_OUT:])
    held_sha = tt._write_dataset(held, lines[:HELD_OUT])
    hyper = {"batch_size": 4, "max_seq_length": 128, "warmup_ratio": 0.0, "n_epochs": 3,
             "learning_rate": 2e-3}  # fmt: skip
    sft_tar = tmp / "sft.tar"
    sft = tt._spawn({"name": "sft", "model": str(model), "dataset": str(chats), "sha256": sft_sha,
                     "format": "messages", "adapter": TINY_ADAPTER, "hyperparameters": hyper,
                     "threads": 1, "keep_artifact": str(sft_tar)})  # fmt: skip
    if not sft.get("ok"):
        return {"ok": False, "error": f"SFT: {sft.get('error')}"}
    dpo_tar = tmp / "dpo.tar"
    dpo = tt._spawn({
        "name": "dpo", "model": str(model), "dataset": str(pairs), "sha256": pairs_sha,
        "format": "preference", "adapter": TINY_ADAPTER, "threads": 1,
        "hyperparameters": {**hyper, "n_epochs": 4, "learning_rate": 5e-3, "beta": 0.5},
        "keep_artifact": str(dpo_tar),
        "spec": {
            "method": "dpo",
            "parent_adapter": {"url": sft_tar.as_uri(), "sha256": sft["bundle_sha256"]},
            "validation_dataset": {"url": held.as_uri(), "sha256": held_sha, "format": "preference"},
        },
    })  # fmt: skip
    if not dpo.get("ok"):
        return {"ok": False, "error": f"DPO: {dpo.get('error')}"}
    held_pairs = [json.loads(line) for line in lines[:HELD_OUT]]
    dpo["preferred_share_sft"] = _preferred_share(model, sft_tar, held_pairs, tmp / "a")
    dpo["preferred_share_dpo"] = _preferred_share(model, dpo_tar, held_pairs, tmp / "b")
    return dpo


def _preferred_share(model: Path, bundle: Path, pairs: list[dict[str, Any]], where: Path) -> float:
    """The share of ``pairs`` whose preferred reply the adapter in ``bundle`` finds likelier."""
    import tarfile

    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from gpu_worker.preference import PairCollator, encode_preference, sequence_logps

    with tarfile.open(bundle) as tar:
        tar.extractall(where, filter="data")
    tok = AutoTokenizer.from_pretrained(model)
    policy = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32), where
    ).eval()
    encoded, _ = encode_preference(pairs, tok, 128)
    with torch.no_grad():
        logps = sequence_logps(policy, PairCollator(tok.pad_token_id)(encoded))
    n = len(encoded)
    return float((logps[:n] > logps[n:]).float().mean())


def run_cpu(tmp: Path) -> tuple[dict[str, Any], bool]:
    res = _tiny_runs(tmp)
    if not res.get("ok"):
        print(f"CPU: FAILED: {res.get('error')}")
        return res, False
    m = res["metrics"]
    reference = next((line for line in res["logs"] if line.startswith("Reference")), "-")
    print(
        f"CPU (tiny model, {res['threads']} thread): DPO on 48 pairs from the SFT adapter, "
        f"{res['steps']} steps: {res['tokens_per_second']:,.0f} tokens/s, "
        f"{res['useful_tokens_per_second']:,.0f} useful tokens/s, run() {res['run_seconds']:.1f} s, "
        f"peak RSS {tt._mib(res['peak_rss'])}; {reference}"
    )
    print(
        f"  rewards/accuracies (last step) {m.get('rewards/accuracies')}, margins "
        f"{m.get('rewards/margins')}; valid (DPO) loss {m.get('full_valid_loss')}"
    )
    share = res["preferred_share_dpo"]
    verdict = "PASS" if share >= PREFERRED_GOAL else "FAIL"
    print(
        f"  held-out pairs favouring the preferred reply: SFT {res['preferred_share_sft']:.0%} "
        f"-> DPO {share:.0%} (goal >= {PREFERRED_GOAL:.0%}): {verdict}"
    )
    return res, share >= PREFERRED_GOAL


def _long_pairs(count: int, seq: int) -> list[str]:
    """A prompt of about half a row and two replies long enough that every row is cut at
    ``seq`` tokens (the tiny tokenizer makes about 3 characters a token of this text)."""
    prompts = tt._long_texts(count, chars=seq * 3 // 2)
    replies = tt._long_texts(2 * count, chars=seq * 3, seed=1)
    return [
        json.dumps(
            {
                "input": {"messages": [{"role": "user", "content": prompts[i]}]},
                "preferred_output": [{"role": "assistant", "content": replies[2 * i]}],
                "non_preferred_output": [{"role": "assistant", "content": replies[2 * i + 1]}],
            }
        )
        for i in range(count)
    ]


def run_gpu(args: argparse.Namespace, tmp: Path) -> tuple[list[dict[str, Any]], bool]:
    import torch

    if args.no_gpu or not torch.cuda.is_available():
        why = "--no-gpu" if args.no_gpu else "no CUDA GPU"
        print(f"GPU: {why}: Unsloth vs PEFT DPO not run (no figures measured)")
        return [], True
    from gpu_worker.tiny_model import build_tiny_model

    build_tiny_model(tmp / "tok")
    model = tmp / "llama-1b"
    built = tt._spawn({"mode": "build", "tokenizer": str(tmp / "tok"), "vocab": 32000,
                       "out": str(model)}, timeout=600)  # fmt: skip
    if not built.get("ok"):
        print(f"GPU: building the ~1B model FAILED: {built.get('error')}")
        return [], False
    count = args.gpu_steps * args.gpu_batch
    data = tmp / "pairs.jsonl"
    sha = tt._write_dataset(data, _long_pairs(count, args.gpu_seq))
    print(
        f"GPU: {torch.cuda.get_device_name(0)}; Llama {built['parameters'] / 1e9:.2f}B bf16, "
        f"LoRA r=16; DPO, {count} pairs, {args.gpu_batch} a step ({2 * args.gpu_batch} rows of "
        f"{args.gpu_seq} tokens), {args.gpu_steps} steps, gradient checkpointing on"
    )
    rows, ok = [], True
    for backend in args.gpu_backends:
        res = tt._spawn({
            "name": backend, "model": str(model), "dataset": str(data), "sha256": sha,
            "format": "preference", "warmup_steps": 5, "spec": {"method": "dpo"},
            "adapter": {"type": "lora", "r": 16, "alpha": 32, "dropout": 0.0},
            "hyperparameters": {"n_epochs": 1, "batch_size": args.gpu_batch,
                                "learning_rate": 5e-5, "max_seq_length": args.gpu_seq,
                                "warmup_ratio": 0.0, "gradient_checkpointing": True},
        }, env={"TRAINHUB_BACKEND": backend}, timeout=900)  # fmt: skip
        if not res.get("ok"):
            print(f"  {backend}: {'not available' if res.get('unavailable') else 'FAILED'}: "
                  f"{res.get('error')}")  # fmt: skip
            ok = ok and bool(res.get("unavailable"))
            continue
        reference = next((line for line in res["logs"] if line.startswith("Reference")), "-")
        print(
            f"  {backend}: {res['tokens_per_second']:,.0f} tokens/s, steady "
            f"{res['steady_tokens_per_second']:,.0f}, peak GPU allocated "
            f"{tt._mib(res['peak_gpu_allocated'])}, run() {res['run_seconds']:.0f} s, loss "
            f"{res['first_loss']:.3f} -> {res['last_loss']:.3f}; {reference}"
        )
        rows.append(res)
    by = {r["name"]: r for r in rows}
    if "unsloth" in by and "peft" in by:
        speed = by["unsloth"]["tokens_per_second"] / by["peft"]["tokens_per_second"]
        memory = by["unsloth"]["peak_gpu_allocated"] / by["peft"]["peak_gpu_allocated"]
        print(f"  unsloth / peft: tokens/s {speed:.2f}x, peak GPU memory {memory:.2f}x")
    return rows, ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-cpu", action="store_true")
    parser.add_argument("--no-gpu", action="store_true")
    parser.add_argument("--gpu-steps", type=int, default=30)
    parser.add_argument("--gpu-batch", type=int, default=4, help="pairs per step")
    parser.add_argument("--gpu-seq", type=int, default=1024)
    parser.add_argument("--gpu-backends", default="unsloth,peft")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    args.gpu_backends = [b for b in args.gpu_backends.split(",") if b]
    started = time.perf_counter()
    print(f"machine: {tt._machine()}")
    results: dict[str, Any] = {"machine": tt._machine()}
    ok = True
    with tempfile.TemporaryDirectory(prefix="trainhub-dpo-") as tmpname:
        tmp = Path(tmpname)
        if not args.no_cpu:
            results["cpu"], ok = run_cpu(tmp)
        results["gpu"], gpu_ok = run_gpu(args, tmp)
        ok = ok and gpu_ok
    print(f"total: {time.perf_counter() - started:.0f} s")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=str) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
