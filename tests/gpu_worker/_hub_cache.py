"""A fake Hugging Face hub cache, laid out as huggingface_hub writes it, and local model folders:
for the model cache scan's tests (tests/gpu_worker/agent/test_model_cache.py), the node client's
(tests/jobs/services/fleet/test_node_client.py) and the fleet's end to end (tests/e2e/test_fleet.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def safetensors(values: int = 1) -> bytes:
    """A minimal, valid safetensors file: one float32 tensor of ``values`` values."""
    header = {"w": {"dtype": "F32", "shape": [values], "data_offsets": [0, 4 * values]}}
    raw = json.dumps(header).encode()
    return len(raw).to_bytes(8, "little") + raw + b"\0" * (4 * values)


WEIGHTS = safetensors().decode("latin-1")  # file contents are written as latin-1 text


def hub_repo(
    cache: Path,
    repo_id: str,
    files: dict[str, str],
    *,
    linked: bool = True,
    missing: tuple[str, ...] = (),
    incomplete: bool = False,
    commit: str = COMMIT,
) -> Path:
    """``models--owner--name`` with one snapshot of ``files`` (name → content). ``missing``:
    files whose link points to a blob not downloaded yet; ``incomplete``: a blob still being
    downloaded (``<etag>.incomplete``), as huggingface_hub leaves them."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    blobs, snapshot = repo / "blobs", repo / "snapshots" / commit
    blobs.mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    for i, (name, content) in enumerate(files.items()):
        blob = blobs / f"etag{i:04d}"
        if name not in missing:
            blob.write_text(content, encoding="latin-1")
        if linked:
            (snapshot / name).symlink_to(os.path.relpath(blob, snapshot))
        elif name not in missing:
            (snapshot / name).write_text(content, encoding="latin-1")
    if incomplete:
        (blobs / "etag9999.incomplete").write_text("partial")
    return repo


CONFIG = {"config.json": "{}"}
SINGLE = {**CONFIG, "model.safetensors": WEIGHTS, "tokenizer.json": "{}"}


def sharded(*shards: str) -> dict[str, str]:
    index = {"weight_map": {f"layer{i}": s for i, s in enumerate(shards)}}
    files = {**CONFIG, "model.safetensors.index.json": json.dumps(index)}
    return files | {s: WEIGHTS for s in shards}


def local_model(path: Path, files: dict[str, str] = SINGLE) -> Path:
    path.mkdir(parents=True)
    for name, content in files.items():
        (path / name).write_text(content, encoding="latin-1")
    return path
