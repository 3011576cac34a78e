"""Training throughput of the executor: the real ``gpu_worker.train.run``, end to end.

1. CPU, tiny model (built offline with gpu_worker.tiny_model): lora, dora and qlora (and, named
   with a ``-no-gc`` suffix in --configs, each without gradient checkpointing) on the
   bundled demo chat data (file:// URLs in a temporary directory), batch 4, max_seq_length 128,
   3 epochs. Each configuration runs in a fresh subprocess, so its peak RSS is its own. Figures:
   trained tokens/s over the train() wall time, steady-state tokens/s (after the first steps),
   the whole run() time (download, load, tokenize, train, package, upload), peak RSS, loss.
2. Reporter overhead in the training loop: every run goes through a wrapper around the normal
   reporter (``Reporter.from_spec`` with a JSON-lines sink, fsync per batch) that times each call
   the executor makes to it while ``Trainer.train`` runs; that time per optimizer step is
   compared with the mean step time (goal <= 2%).
3. Packing (``hyperparameters.packing``), CPU, tiny model: the same run packed and padded, on
   the demo chat data and on a skewed-length chat dataset the bench generates (most examples one
   short exchange, one in ten a long multi-turn conversation), batch 8, max_seq_length 512, one
   epoch, gradient checkpointing off. Figures: useful tokens/s (tokens that carry loss, over the
   train() wall time), padding share, and the loss after the same examples (same examples per
   optimizer step in both: packing is per batch); goal >= 1.8x useful tokens/s on the skewed set
   with the mean training loss within 2 %.
4. CUDA only: a random-init ~1B Llama (hidden 2048, 16 layers, 32 heads, 8 KV heads,
   intermediate 8192, vocab 32000) built locally, the same short LoRA training (30 steps,
   batch 8, sequence 1024) in separate processes with TRAINHUB_BACKEND=unsloth and =peft, each
   with gradient checkpointing on (the spec's default) and off (``-no-gc``): tokens/s, peak GPU
   memory (torch.cuda.max_memory_allocated) and the Unsloth/PEFT ratio at the same setting
   (goal >= 1.6x). ``--gpu-data skewed`` trains skewed-length chats instead (packing on, as
   by default), for the whole-run useful tokens/s of packed Unsloth vs packed PEFT (issue 20,
   goal >= 1.6x). Without CUDA it says so and measures nothing. Unsloth
   must be installed (requirements/gpu.txt); set UNSLOTH_DISABLE_STATISTICS=1 offline.

    .venv/bin/python bench/train_throughput.py [--threads N] [--configs lora,dora,qlora]
        [--no-cpu] [--no-packing] [--no-gpu] [--gpu-backends unsloth,peft,unsloth-no-gc,peft-no-gc] [--gpu-steps 30]
        [--gpu-batch 8] [--gpu-seq 1024] [--gpu-data text|skewed] [--json PATH]

Also ``--epochs``, ``--batch``, ``--seq`` (the CPU part), ``--pack-batch``, ``--pack-seq``,
``--skewed-examples`` (the packing part) and ``--gpu-vocab``.

Every tokens/s figure comes in two kinds (gpu_worker.token_counts): tokens/s counts input tokens
that are not padding (prompt included), useful tokens/s only those that carry loss (label
!= -100 after the causal shift); padding is the share of all computed positions that were
padding. All three are counted per micro-batch at loss time and summed per optimizer step.

How it measures:

- Every figure comes from the real ``gpu_worker.train.run``: download from a ``file://`` URL
  with its sha256 check, load, tokenize, ``transformers.Trainer``, packaging the bundle and the
  ``file://`` upload.
- Each configuration runs in a fresh subprocess (``--child``), so peak RSS
  (``resource.getrusage(RUSAGE_SELF).ru_maxrss``) and the backend choice belong to it alone.
  "RSS before run()" is the peak after the imports and the backend choice.
- A ``TrainerCallback`` passed in ``run(callbacks=[...])`` takes timestamps at
  ``on_train_begin`` and ``on_train_end`` (with ``torch.cuda.synchronize()`` on GPU) and at
  every ``on_step_end`` with ``state.num_input_tokens_seen``. From those: tokens/s = trained
  tokens / train wall time; steady tokens/s = the same after the first 2 (CPU) or 5 (GPU)
  steps; step ms = the step-end-to-step-end interval (it includes the logging callbacks).
  Loss is the first and last logged loss (``metrics.json``); run() s is the whole call.
- Reporter overhead: the proxy times every call while ``Trainer.train`` runs (one
  ``metrics()`` per step; metrics are throttled to 1 event/s). Work on the reporter's
  background thread (batched writes) is not in the figure. bench/reporter_overhead.py times
  the same calls in isolation.
- CPU part: the tiny model (3M params) on the 60 ``messages`` examples of the demo chats,
  assistant-only loss; batch 4, max_seq_length 128 (nothing truncated), 3 epochs = 45 steps,
  r=8, alpha 16, dropout 0, lr 2e-3, seed 7. One torch thread by default, as in the test
  fixture; ``--threads 0`` keeps torch's default.
- Packing part: ``TRAINHUB_BACKEND=peft``, LoRA r=8 / alpha 16 / dropout 0, lr 2e-3, batch 8,
  max_seq_length 512, gradient checkpointing off, seed 7, one torch thread; each dataset
  trained with ``packing`` true, then false. Packing works per batch (the batch's 8 examples
  share rows, position ids restarting per example; on the CPU path, where sdpa builds a
  block-diagonal mask from the position ids, no row is wider than the batch's longest
  example), so both runs train the same examples in every optimizer step. Data: ``demo_chat``,
  the 60 demo chats of about 45 tokens each, 3 epochs = 24 steps; ``skewed``, 240 generated
  chats, nine in ten one short demo exchange and one in ten a conversation of 10-13 exchanges
  (about 450 tokens) with loss on every reply, 1 epoch = 30 steps. Train loss is the Trainer's
  mean over the run; last loss is the final step's.
- GPU part: the model is a random-init Llama built on the GPU and saved in bf16 with the tiny
  tokenizer (untied, 1.10B params). The data is ``steps x 8`` ``text`` examples of shuffled
  demo conversations, each over 12,000 characters, so every example is truncated to exactly
  1024 tokens (8,192 tokens per step). LoRA r=16, alpha 32, dropout 0 on
  q/k/v/o/gate/up/down, batch 8, 1 epoch, lr 2e-4, bf16. One process per configuration:
  ``unsloth``, ``peft``, ``unsloth-no-gc``, ``peft-no-gc`` (``-no-gc``:
  ``hyperparameters.gradient_checkpointing: false``). Peak GPU memory is
  ``torch.cuda.max_memory_allocated()`` after ``reset_peak_memory_stats()``.

Offline, Django-free. About 50 s on 2 CPU cores (the packing part about 40 s more); the GPU part
about 3.5 minutes on an H100.
Exits 1 if a run fails. Figures: docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import os
import platform
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CPU_ADAPTERS = ("lora", "dora", "qlora")
# A "-no-gc" config is the same one with hyperparameters.gradient_checkpointing = false.
NO_GC = "-no-gc"
GPU_BACKENDS = ("unsloth", "peft", "unsloth-no-gc", "peft-no-gc")
OVERHEAD_GOAL_PCT = 2.0
SPEEDUP_GOAL = 1.6
PACKING_GOAL = 1.8  # packed / padded useful tokens/s on the skewed set
PACKING_LOSS_GOAL_PCT = 2.0
# ~1B Llama for the GPU comparison: 16 x (attention 10.5M + MLP 50.3M) = 0.97B + embeddings.
GPU_MODEL = {
    "hidden_size": 2048,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 8192,
    "max_position_embeddings": 2048,
}


# --- child processes ------------------------------------------------------------------------


class TimedReporter:
    """Forwards every call to the real reporter and, while ``active``, adds up the time spent
    in it (the training thread's cost of reporting; the background flush thread is not in it)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.active = False
        self.seconds = 0.0
        self.calls: dict[str, int] = {}

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if not callable(attr):
            return attr

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return attr(*args, **kwargs)
            finally:
                if self.active:
                    self.seconds += time.perf_counter() - started
                    self.calls[name] = self.calls.get(name, 0) + 1

        return timed


def _spec(cfg: dict[str, Any], tmp: Path) -> dict[str, Any]:
    out = tmp / "out"
    out.mkdir(parents=True, exist_ok=True)
    return {
        "version": 1,
        "job_id": f"ftjob-bench-{cfg['name']}",
        "attempt": 1,
        "model": cfg["model"],
        "dataset": {
            "url": Path(cfg["dataset"]).as_uri(),
            "sha256": cfg["sha256"],
            "format": cfg["format"],
        },
        "outputs": {
            "artifact_url": (out / "adapter.tar").as_uri(),
            "checkpoint_url": (out / "checkpoint.tar").as_uri(),
        },
        "adapter": cfg["adapter"],
        "hyperparameters": cfg["hyperparameters"],
        "seed": 7,
        "report": {"sinks": [{"type": "jsonl", "path": str(tmp / "events.jsonl")}]},
        **cfg.get("spec", {}),  # more spec fields (bench/dpo_throughput.py: method, parent)
    }


def child_train(cfg: dict[str, Any]) -> dict[str, Any]:
    """One run() in this (fresh) process; returns the figures as a dict."""
    import torch

    if cfg.get("threads"):
        torch.set_num_threads(int(cfg["threads"]))
    from gpu_worker import backends

    try:
        backend = backends.select_backend()  # what run() does first; Unsloth before transformers
    except RuntimeError as exc:
        return {"ok": False, "unavailable": True, "error": str(exc)}
    from transformers import TrainerCallback

    from gpu_worker import train
    from gpu_worker.report import Reporter
    from trainhub_contract.spec import parse_job_spec

    cuda = torch.cuda.is_available()

    class Timing(TrainerCallback):  # type: ignore[misc]
        def __init__(self, reporter: TimedReporter) -> None:
            self.reporter = reporter
            self.marks: list[tuple[float, int]] = []  # (perf_counter, tokens seen) per step end
            self.begin = self.end = 0.0
            self.tokens0 = self.tokens1 = 0

        def on_train_begin(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
            if cuda:
                torch.cuda.synchronize()
            self.begin, self.tokens0 = time.perf_counter(), state.num_input_tokens_seen
            self.reporter.active = True

        def on_step_end(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
            self.marks.append((time.perf_counter(), state.num_input_tokens_seen))

        def on_train_end(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
            if cuda:
                torch.cuda.synchronize()
            self.end, self.tokens1 = time.perf_counter(), state.num_input_tokens_seen
            self.reporter.active = False

    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    with tempfile.TemporaryDirectory(prefix="trainhub-bench-") as tmpname:
        tmp = Path(tmpname)
        spec = parse_job_spec(_spec(cfg, tmp))
        real = Reporter.from_spec(spec)
        reporter = TimedReporter(real)
        timing = Timing(reporter)
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        with real:
            started = time.perf_counter()
            result = train.run(
                spec,
                reporter=reporter,  # type: ignore[arg-type]
                workdir=tmp / "work",
                callbacks=[timing],
            )
            run_seconds = time.perf_counter() - started
        lines = [json.loads(line) for line in (tmp / "events.jsonl").open()]
        events = len(lines)
        if cfg.get("keep_artifact") and result.status == "succeeded":
            shutil.copyfile(tmp / "out" / "adapter.tar", cfg["keep_artifact"])
    if result.status != "succeeded":
        return {"ok": False, "error": f"{result.status} ({result.reason}): {result.message}"}

    m = result.metrics
    steps = m["global_step"]
    train_seconds = timing.end - timing.begin
    tokens = timing.tokens1 - timing.tokens0
    times = [timing.begin] + [t for t, _ in timing.marks]
    step_times = [b - a for a, b in itertools.pairwise(times)]
    skip = min(int(cfg.get("warmup_steps", 2)), max(0, len(timing.marks) - 2))
    t_a, tok_a = timing.marks[skip - 1] if skip else (timing.begin, timing.tokens0)
    t_b, tok_b = timing.marks[-1]
    out: dict[str, Any] = {
        "ok": True,
        "name": cfg["name"],
        "backend": backend,
        "device": m["device"],
        "threads": torch.get_num_threads(),
        "steps": steps,
        "trained_tokens": tokens,
        "tokens_per_step": tokens / steps if steps else 0.0,
        "train_seconds": train_seconds,
        "tokens_per_second": tokens / train_seconds if train_seconds else 0.0,
        "steady_skip": skip,
        "steady_tokens_per_second": (tok_b - tok_a) / (t_b - t_a) if t_b > t_a else 0.0,
        "trainer_tokens_per_second": m["tokens_per_second"],
        "useful_tokens": m["useful_tokens"],
        "useful_tokens_per_second": m["useful_tokens"] / train_seconds if train_seconds else 0.0,
        "padding_share": m["padding_share"],
        "batching": m["batching"],
        "examples": m["examples"],
        "first_step_ms": step_times[0] * 1000,
        "mean_step_ms": statistics.fmean(step_times) * 1000,
        "steady_step_ms": statistics.fmean(step_times[skip:]) * 1000,
        "run_seconds": run_seconds,
        "rss_before_run": rss_before,
        "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "first_loss": m["first_loss"],
        "last_loss": m["last_loss"],
        "train_loss": m["train_loss"],
        "reporter_seconds": reporter.seconds,
        "reporter_calls": reporter.calls,
        "events_written": events,
        "versions": m["versions"],
        "bundle_sha256": result.bundle_sha256,
        "metrics": m,
        "logs": [e["message"] for e in lines if e.get("type") == "log"][-60:],
    }
    out["reporter_us_per_step"] = reporter.seconds / steps * 1e6 if steps else 0.0
    out["reporter_pct"] = reporter.seconds / train_seconds * 100 if train_seconds else 0.0
    if cuda:
        out["peak_gpu_allocated"] = torch.cuda.max_memory_allocated()
        out["peak_gpu_reserved"] = torch.cuda.max_memory_reserved()
    return out


def child_build_gpu_model(cfg: dict[str, Any]) -> dict[str, Any]:
    """The random-init ~1B Llama, saved (bf16) with the tiny model's tokenizer."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(cfg["tokenizer"])
    tok.model_max_length = GPU_MODEL["max_position_embeddings"]
    config = LlamaConfig(
        vocab_size=max(int(cfg["vocab"]), len(tok)),
        tie_word_embeddings=False,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        **GPU_MODEL,
    )
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = LlamaForCausalLM(config)
    model = model.to(torch.bfloat16)
    params = sum(p.numel() for p in model.parameters())
    model.save_pretrained(cfg["out"])
    tok.save_pretrained(cfg["out"])
    return {"ok": True, "parameters": params, "vocab": config.vocab_size}


# --- the parent -----------------------------------------------------------------------------


def _spawn(
    cfg: dict[str, Any], *, env: dict[str, str] | None = None, timeout: float = 900
) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile("r", suffix=".json", delete=False) as fh:
        result_path = Path(fh.name)
    try:
        proc = subprocess.run(  # noqa: S603 - this script with its own arguments
            [sys.executable, __file__, "--child", json.dumps(cfg), "--child-out", str(result_path)],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", **(env or {})},
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        text = result_path.read_text()
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"timed out after {timeout:.0f} s"}
    finally:
        result_path.unlink(missing_ok=True)
    if proc.returncode != 0 or not text:
        return {"ok": False, "error": f"exit {proc.returncode}: {proc.stderr[-3000:]}"}
    return json.loads(text)


def _write_dataset(path: Path, lines: list[str]) -> str:
    data = ("\n".join(lines) + "\n").encode()
    path.write_bytes(data)
    return hashlib.sha256(data).hexdigest()


def _long_texts(count: int, chars: int, seed: int = 0) -> list[str]:
    """``count`` "text" records of at least ``chars`` characters, shuffled demo conversations."""
    from gpu_worker.tiny_model import DEMO_DATASET_PATH

    turns = []
    for line in DEMO_DATASET_PATH.read_text(encoding="utf-8").splitlines():
        if line.strip():
            msgs = json.loads(line)["messages"]
            turns.append(" ".join(m["content"] for m in msgs if m["role"] != "system"))
    rng = random.Random(seed)  # noqa: S311 - sample text, not security
    records = []
    for _ in range(count):
        parts: list[str] = []
        while sum(len(p) + 1 for p in parts) < chars:
            parts.append(rng.choice(turns))
        records.append(json.dumps({"text": "\n".join(parts)}))
    return records


def _cpu_run(
    name: str,
    model_dir: Path,
    dataset: tuple[Path, str],
    adapter: str,
    hyperparameters: dict[str, Any],
    threads: int | None,
) -> dict[str, Any] | None:
    """One CPU training run of the tiny model in a fresh process (PEFT); its row, or None
    (and the failure printed)."""
    cfg = {
        "name": name,
        "model": str(model_dir),
        "dataset": str(dataset[0]),
        "sha256": dataset[1],
        "format": "messages",
        "adapter": {"type": adapter, "r": 8, "alpha": 16, "dropout": 0.0},
        "hyperparameters": hyperparameters,
        "threads": threads,
        "warmup_steps": 2,
    }
    res = _spawn(cfg, env={"TRAINHUB_BACKEND": "peft"}, timeout=600)
    if not res.get("ok"):
        print(f"  {name}: FAILED: {res.get('error')}")
        return None
    return res


def _skewed_chats(count: int, long_every: int = 10, seed: int = 0) -> list[str]:
    """``count`` "messages" records: most one short demo exchange, every ``long_every``-th a
    conversation of 10 to 13 demo exchanges (about 450 tokens on the tiny model's tokenizer)."""
    from gpu_worker.tiny_model import DEMO_DATASET_PATH

    demos = [
        json.loads(line)["messages"]
        for line in DEMO_DATASET_PATH.read_text(encoding="utf-8").splitlines()
        if line.strip()
    ]
    rng = random.Random(seed)  # noqa: S311 - sample data, not security
    records = []
    for i in range(count):
        if i % long_every:
            messages = rng.choice(demos)
        else:
            turns = [m for d in rng.sample(demos, rng.randint(10, 13)) for m in d[1:]]
            messages = [demos[0][0], *turns]  # one system prompt, then the exchanges
        records.append(json.dumps({"messages": messages}))
    rng.shuffle(records)
    return records


def _mib(n: float) -> str:
    return f"{n / 2**20:,.0f} MiB"


def _pct(share: float | None) -> str:
    return "-" if share is None else f"{share * 100:.1f} %"


def _machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} CPUs ({cpu}), Python {platform.python_version()}"


def run_cpu(args: argparse.Namespace, tmp: Path) -> tuple[list[dict[str, Any]], bool]:
    from gpu_worker.tiny_model import DEMO_DATASET_PATH, build_tiny_model

    model_dir = build_tiny_model(tmp / "tiny-llama")
    data = tmp / "demo_chat.jsonl"
    sha = _write_dataset(
        data, [ln for ln in DEMO_DATASET_PATH.read_text().splitlines() if ln.strip()]
    )
    hp = {"n_epochs": args.epochs, "batch_size": args.batch, "learning_rate": 2e-3,
          "max_seq_length": args.seq, "warmup_ratio": 0.0}  # fmt: skip
    print(
        f"CPU: tiny model (gpu_worker.tiny_model), demo_chat.jsonl (60 examples, messages), "
        f"batch {args.batch}, max_seq_length {args.seq}, {args.epochs} epochs, r=8, lr 2e-3; "
        f"torch threads: {args.threads or 'default'}; one fresh process per config"
    )
    rows, ok = [], True
    for name in args.configs:
        res = _cpu_run(
            name, model_dir, (data, sha), name.removesuffix(NO_GC),
            {**hp, "gradient_checkpointing": not name.endswith(NO_GC)}, args.threads,
        )  # fmt: skip
        ok = ok and res is not None
        rows += [res] if res is not None else []

    if rows:
        r0 = rows[0]
        v = r0["versions"]
        print(
            f"device: {r0['device']}, torch.get_num_threads() = {r0['threads']}, torch "
            f"{v['torch']}, transformers {v['transformers']}, peft {v['peft']}, backend "
            f"{r0['backend']}"
        )
        print(
            "| config | batching | steps | tokens/step | train s | tokens/s | useful tokens/s "
            "| padding | steady tokens/s | first step ms | steady step ms | run() s "
            "| RSS before run() | peak RSS | loss first -> last |"
        )
        print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
        for r in rows:
            print(
                f"| {r['name']} | {r['batching']} | {r['steps']} | {r['tokens_per_step']:.0f} | "
                f"{r['train_seconds']:.2f} | {r['tokens_per_second']:,.0f} | "
                f"{r['useful_tokens_per_second']:,.0f} | {_pct(r['padding_share'])} | "
                f"{r['steady_tokens_per_second']:,.0f} | {r['first_step_ms']:.0f} | "
                f"{r['steady_step_ms']:.1f} | {r['run_seconds']:.2f} | {_mib(r['rss_before_run'])} | "
                f"{_mib(r['peak_rss'])} | "
                f"{r['first_loss']:.3f} -> {r['last_loss']:.3f} |"
            )
    return rows, ok


def run_packing(args: argparse.Namespace, tmp: Path) -> tuple[list[dict[str, Any]], bool]:
    """The same LoRA run packed and padded, on the demo chat data and the skewed set."""
    from gpu_worker.tiny_model import DEMO_DATASET_PATH, build_tiny_model

    model_dir = tmp / "tiny-llama"
    if not model_dir.exists():
        build_tiny_model(model_dir)
    demo = [ln for ln in DEMO_DATASET_PATH.read_text().splitlines() if ln.strip()]
    # name -> (records, epochs): about as many examples each, so timings are not all warm-up.
    datasets = {"demo_chat": (demo, 3), "skewed": (_skewed_chats(args.skewed_examples), 1)}
    print(
        f"Packing: tiny model, LoRA r=8, batch {args.pack_batch}, max_seq_length "
        f"{args.pack_seq}, lr 2e-3, gradient checkpointing off; demo_chat.jsonl ({len(demo)} "
        f"short chats, 3 epochs) and a generated skewed set ({args.skewed_examples} chats, one "
        "in ten a 10-13 exchange conversation, 1 epoch); packed vs padded (packing: false), "
        "same examples per optimizer step; one fresh process per run"
    )
    rows, ok = [], True
    for data_name, (lines, epochs) in datasets.items():
        path = tmp / f"{data_name}.jsonl"
        sha = _write_dataset(path, lines)
        for packing in (False, True):
            name = f"{data_name}-{'packed' if packing else 'padded'}"
            hp = {"n_epochs": epochs, "batch_size": args.pack_batch, "learning_rate": 2e-3,
                  "max_seq_length": args.pack_seq, "warmup_ratio": 0.0,
                  "gradient_checkpointing": False, "packing": packing}  # fmt: skip
            res = _cpu_run(name, model_dir, (path, sha), "lora", hp, args.threads)
            ok = ok and res is not None
            rows += [res] if res is not None else []
    if not rows:
        return rows, ok
    print(
        "| data / batching | examples / epoch | steps | tokens | useful tokens | padding | train s "
        "| tokens/s | useful tokens/s | train loss | last loss |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['name']} ({r['batching']}) | {r['examples']} | {r['steps']} | "
            f"{r['trained_tokens']:,} | {r['useful_tokens']:,} | {_pct(r['padding_share'])} | "
            f"{r['train_seconds']:.2f} | {r['tokens_per_second']:,.0f} | "
            f"{r['useful_tokens_per_second']:,.0f} | {r['train_loss']:.4f} | "
            f"{r['last_loss']:.4f} |"
        )
    by = {r["name"]: r for r in rows}
    for data_name in datasets:
        padded, packed = by.get(f"{data_name}-padded"), by.get(f"{data_name}-packed")
        if padded is None or packed is None:
            continue
        ratio = packed["useful_tokens_per_second"] / padded["useful_tokens_per_second"]
        loss_pct = abs(packed["train_loss"] / padded["train_loss"] - 1) * 100
        goal = ""
        if data_name == "skewed":
            met = ratio >= PACKING_GOAL and loss_pct <= PACKING_LOSS_GOAL_PCT
            goal = f" (goal >= {PACKING_GOAL:g}x, loss within {PACKING_LOSS_GOAL_PCT:g} %): " + (
                "PASS" if met else "FAIL"
            )
        print(
            f"{data_name}: packed / padded useful tokens/s {ratio:.2f}x, padding "
            f"{_pct(padded['padding_share'])} -> {_pct(packed['padding_share'])}, mean training "
            f"loss {padded['train_loss']:.4f} vs {packed['train_loss']:.4f} ({loss_pct:.2f} % "
            f"apart){goal}"
        )
    return rows, ok


def print_overhead(rows: list[dict[str, Any]], where: str) -> None:
    print(f"Reporter overhead in the training loop ({where}; time inside reporter calls while "
          f"Trainer.train runs / train wall time):")  # fmt: skip
    for r in rows:
        calls = ", ".join(f"{k} x{v}" for k, v in sorted(r["reporter_calls"].items()))
        verdict = "PASS" if r["reporter_pct"] <= OVERHEAD_GOAL_PCT else "FAIL"
        print(
            f"  {r['name']}: {r['reporter_us_per_step']:.0f} us per step over a mean step of "
            f"{r['mean_step_ms']:.1f} ms = {r['reporter_pct']:.3f}% (goal <= "
            f"{OVERHEAD_GOAL_PCT:g}%): {verdict}  [calls: {calls}; {r['events_written']} events "
            f"written]"
        )


def run_gpu(args: argparse.Namespace, tmp: Path) -> tuple[list[dict[str, Any]], bool]:
    import torch

    if args.no_gpu:
        print("GPU: skipped (--no-gpu): Unsloth vs PEFT comparison not run")
        return [], True
    if not torch.cuda.is_available():
        print("GPU: no CUDA GPU: Unsloth vs PEFT comparison not run (no figures measured)")
        return [], True
    from gpu_worker.tiny_model import build_tiny_model

    tok_dir = tmp / "tiny-llama"
    if not tok_dir.exists():
        build_tiny_model(tok_dir)
    model_dir = tmp / "llama-1b"
    built = _spawn(
        {
            "mode": "build",
            "tokenizer": str(tok_dir),
            "vocab": args.gpu_vocab,
            "out": str(model_dir),
        },
        timeout=600,
    )
    if not built.get("ok"):
        print(f"GPU: building the ~1B model FAILED: {built.get('error')}")
        return [], False
    count = args.gpu_steps * args.gpu_batch
    if args.gpu_data == "skewed":  # uneven chats: packing (on by default) has padding to remove
        data, fmt, what = tmp / "skewed_gpu.jsonl", "messages", "skewed-length 'messages' chats"
        sha = _write_dataset(data, _skewed_chats(count))
    else:
        data, fmt, what = tmp / "long_text.jsonl", "text", "'text' examples"
        sha = _write_dataset(data, _long_texts(count, chars=args.gpu_seq * 12))
    print(
        f"GPU: {torch.cuda.get_device_name(0)}; random-init Llama {built['parameters'] / 1e9:.2f}B "
        f"params (hidden 2048, 16 layers, 32 heads, 8 KV heads, intermediate 8192, vocab "
        f"{built['vocab']}), bf16; LoRA r=16 alpha 32 on q/k/v/o/gate/up/down; {count} "
        f"{what} truncated to {args.gpu_seq} tokens, batch {args.gpu_batch}, 1 epoch = "
        f"{args.gpu_steps} steps; steady state skips the first 5 steps"
    )
    rows, ok = [], True
    for name in args.gpu_backends:
        backend = name.removesuffix(NO_GC)
        cfg = {
            "name": name,
            "model": str(model_dir),
            "dataset": str(data),
            "sha256": sha,
            "format": fmt,
            "adapter": {"type": "lora", "r": 16, "alpha": 32, "dropout": 0.0},
            "hyperparameters": {
                "n_epochs": 1,
                "batch_size": args.gpu_batch,
                "learning_rate": 2e-4,
                "max_seq_length": args.gpu_seq,
                "warmup_ratio": 0.0,
                "gradient_checkpointing": not name.endswith(NO_GC),
            },
            "warmup_steps": 5,
        }
        res = _spawn(cfg, env={"TRAINHUB_BACKEND": backend}, timeout=900)
        if not res.get("ok"):
            what = "not available" if res.get("unavailable") else "FAILED"
            print(f"  {name}: {what}: {res.get('error')}")
            ok = ok and bool(res.get("unavailable"))
            continue
        rows.append(res)
    if rows:
        print(
            "| backend | batching | steps | tokens/step | train s | tokens/s | useful tokens/s "
            "| steady tokens/s | first step ms | steady step ms | run() s | peak GPU allocated "
            "| peak GPU reserved | loss first -> last |"
        )
        print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
        for r in rows:
            print(
                f"| {r['name']} | {r['batching']} | {r['steps']} | {r['tokens_per_step']:.0f} | "
                f"{r['train_seconds']:.2f} | {r['tokens_per_second']:,.0f} | "
                f"{r['useful_tokens_per_second']:,.0f} | "
                f"{r['steady_tokens_per_second']:,.0f} | {r['first_step_ms']:.0f} | "
                f"{r['steady_step_ms']:.1f} | {r['run_seconds']:.1f} | {_mib(r['peak_gpu_allocated'])} | "
                f"{_mib(r['peak_gpu_reserved'])} | {r['first_loss']:.3f} -> {r['last_loss']:.3f} |"
            )
        by = {r["name"]: r for r in rows}
        pairs = [(u, p) for u, p in (("unsloth", "peft"), ("unsloth-no-gc", "peft-no-gc"))
                 if u in by and p in by]  # fmt: skip
        for unsloth, peft in pairs:
            for key, label in (
                ("tokens_per_second", "whole train"),
                ("useful_tokens_per_second", "whole train, useful tokens"),
                ("steady_tokens_per_second", "steady state"),
            ):
                ratio = by[unsloth][key] / by[peft][key]
                verdict = "PASS" if ratio >= SPEEDUP_GOAL else "FAIL"
                print(
                    f"{unsloth} / {peft} tokens/s ({label}): {ratio:.2f}x "
                    f"(goal >= {SPEEDUP_GOAL:g}x): {verdict}"
                )
            mem = by[unsloth]["peak_gpu_allocated"] / by[peft]["peak_gpu_allocated"]
            print(f"{unsloth} / {peft} peak GPU memory allocated: {mem:.2f}x")
        if not pairs:
            print("Unsloth vs PEFT ratio: not measured (both backends of a pair must run)")
        print_overhead(rows, "GPU")
    return rows, ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads for the CPU runs (0: torch's default)")  # fmt: skip
    parser.add_argument("--configs", default=",".join(CPU_ADAPTERS))
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--no-cpu", action="store_true", help="skip the CPU tiny-model runs")
    parser.add_argument("--no-packing", action="store_true", help="skip packed vs padded")
    parser.add_argument("--gpu-data", choices=("text", "skewed"), default="text",
                        help="GPU data: equal-length text (the established comparison) or "
                        "skewed-length chats, which packing (on) makes padding-free")  # fmt: skip
    parser.add_argument("--pack-batch", type=int, default=8)
    parser.add_argument("--pack-seq", type=int, default=512)
    parser.add_argument("--skewed-examples", type=int, default=240)
    parser.add_argument("--no-gpu", action="store_true", help="skip the GPU comparison")
    parser.add_argument("--gpu-backends", default=",".join(GPU_BACKENDS))
    parser.add_argument("--gpu-steps", type=int, default=30)
    parser.add_argument("--gpu-batch", type=int, default=8)
    parser.add_argument("--gpu-seq", type=int, default=1024)
    parser.add_argument("--gpu-vocab", type=int, default=32000)
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--child-out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.child is not None:
        cfg = json.loads(args.child)
        out = child_build_gpu_model(cfg) if cfg.get("mode") == "build" else child_train(cfg)
        args.child_out.write_text(json.dumps(out))
        return 0

    args.configs = [c for c in args.configs.split(",") if c]
    args.gpu_backends = [b for b in args.gpu_backends.split(",") if b]
    started = time.perf_counter()
    print(f"machine: {_machine()}")
    results: dict[str, Any] = {"machine": _machine()}
    ok = True
    with tempfile.TemporaryDirectory(prefix="trainhub-throughput-") as tmpname:
        tmp = Path(tmpname)
        if not args.no_cpu:
            cpu_rows, cpu_ok = run_cpu(args, tmp)
            results["cpu"] = cpu_rows
            ok = ok and cpu_ok
            if cpu_rows:
                print_overhead(cpu_rows, "CPU")
        if not args.no_packing:
            packing_rows, packing_ok = run_packing(args, tmp)
            results["packing"] = packing_rows
            ok = ok and packing_ok
        gpu_rows, gpu_ok = run_gpu(args, tmp)
        results["gpu"] = gpu_rows
        ok = ok and gpu_ok
    print(f"total: {time.perf_counter() - started:.0f} s")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
