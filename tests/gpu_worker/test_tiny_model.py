"""The tiny offline model: loads through the normal from_pretrained path, is deterministic, and
its chat template marks the assistant's tokens."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_loads_with_auto_classes_and_has_the_documented_shape(tiny_model_dir: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    cfg = model.config
    assert cfg.model_type == "llama"
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads) == (256, 4, 4)
    assert cfg.num_key_value_heads == 2 and cfg.tie_word_embeddings
    assert 2_000_000 < sum(p.numel() for p in model.parameters()) < 5_000_000
    assert cfg.vocab_size == len(tok) <= 512
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|pad|>"
    text = "Ünïcödé text and emoji 🦉 survive: byte-level BPE"
    assert tok.decode(tok(text)["input_ids"]) == text
    assert (tiny_model_dir / "chat_template.jinja").is_file()


def test_chat_template_masks_exactly_the_assistant_reply(tiny_model_dir: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Colour of owl 3?"},
        {"role": "assistant", "content": "Owl 3 is grey."},
    ]
    enc = tok.apply_chat_template(
        messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    trained = [t for t, m in zip(enc["input_ids"], enc["assistant_masks"], strict=True) if m]
    assert tok.decode(trained) == "Owl 3 is grey.<|im_end|>"


def test_building_is_deterministic(tiny_model_dir: Path, tmp_path: Path) -> None:
    from gpu_worker.tiny_model import build_tiny_model

    again = build_tiny_model(tmp_path / "again")
    names = sorted(p.name for p in tiny_model_dir.iterdir())
    assert names == sorted(p.name for p in again.iterdir())
    for name in names:
        assert (again / name).read_bytes() == (tiny_model_dir / name).read_bytes(), name


@pytest.mark.slow
def test_cli_builds_it(tmp_path: Path) -> None:
    out = tmp_path / "cli-model"
    proc = subprocess.run(
        [sys.executable, "-m", "gpu_worker", "make-tiny-model", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={
            "PATH": "/usr/bin:/bin",
            "PYTHONPATH": str(ROOT),
            "OMP_NUM_THREADS": "1",
            "HF_HUB_OFFLINE": "1",
        },
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == str(out)
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in out.iterdir()}
