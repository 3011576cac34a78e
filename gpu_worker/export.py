"""A job's adapter merged into its base model: one set of safetensors weights that vLLM, TGI,
transformers or Ollama's safetensors import load as a plain model, with no PEFT at serving time.

The merge runs on CPU in the base's own dtype (bf16 for most models): it is one matrix product
per adapted layer, a few minutes for an 8B model, and it leaves the GPUs to training. An
adapter trained with QLoRA is merged into the 16-bit base, as merging into 4-bit weights would
round the update away. DoRA merges the same way (PEFT folds its magnitude vector in).

The result is a bundle in trainhub's artifact format (trainhub_contract.bundle: a tar with a
manifest of each file's sha256): the model's config, its weights (sharded at 5 GB), its
generation config and the tokenizer (with the chat template the job trained with).
"""

from __future__ import annotations

import shutil
import tarfile
import tempfile
from pathlib import Path
from typing import BinaryIO

from gpu_worker.backends.loading import checked_reference
from gpu_worker.errors import INVALID_MODEL, ExecutorError
from gpu_worker.lineage import unpack_adapter
from trainhub_contract.bundle import write_bundle

MAX_SHARD_SIZE = "5GB"
TOKENIZER_FILES = frozenset({
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
    "vocab.json", "merges.txt", "added_tokens.json", "chat_template.jinja", "chat_template.json",
})  # fmt: skip


def _tokenizer_source(bundle: Path, work: Path, base: str) -> str:
    """The tokenizer the job trained with (the bundle holds it, chat template and all), else
    the base's. Called after unpack_adapter checked the bundle against its manifest."""
    folder = work / "tokenizer"
    with tarfile.open(bundle, mode="r:") as tar:
        names = [m for m in tar.getmembers() if m.isfile() and m.name in TOKENIZER_FILES]
        if not any(m.name == "tokenizer_config.json" for m in names):
            return base
        tar.extractall(folder, members=names, filter="data")  # plain files, inside folder only
    return str(folder)


def merge_adapter(base_model: str, adapter_bundle: Path, out: BinaryIO) -> None:
    """Write the bundle of ``base_model`` with the adapter in ``adapter_bundle`` (checked
    against its manifest first) merged in, to ``out``. Raises ExecutorError naming what is
    wrong (a damaged bundle, a base that cannot be loaded)."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    work = Path(tempfile.mkdtemp(prefix="trainhub-export-"))
    try:
        adapter = unpack_adapter(adapter_bundle, work / "adapter")
        reference = checked_reference(base_model)  # as training loads it
        try:
            base = AutoModelForCausalLM.from_pretrained(
                reference, torch_dtype="auto", low_cpu_mem_usage=True
            )
            tokenizer = AutoTokenizer.from_pretrained(
                _tokenizer_source(adapter_bundle, work, reference)
            )
        except (OSError, ValueError) as exc:
            raise ExecutorError(INVALID_MODEL, f"the base model {base_model!r} did not load: "
                                f"{str(exc).splitlines()[0]}") from exc  # fmt: skip
        with torch.no_grad():
            merged = PeftModel.from_pretrained(base, adapter).merge_and_unload()
        merged.save_pretrained(
            work / "model", safe_serialization=True, max_shard_size=MAX_SHARD_SIZE
        )
        tokenizer.save_pretrained(work / "model")
        write_bundle(work / "model", out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
