"""An adapter bundle fetched for serving: downloaded from its signed URL, checked against the
sha256 the control plane recorded and against its own manifest, and its adapter unpacked
(gpu_worker.lineage.unpack_adapter, as a job continuing a parent does) into a cache folder
named by that sha256 (a second load of the same bytes reuses it). Nothing that fails a
check is ever handed to the engine.

This is trainhub's one addition to vLLM's ``load_lora_adapter`` body: ``lora_path`` may be an
``http(s)://`` or ``file://`` URL when ``sha256`` comes with it; a plain path is loaded as vLLM
loads it.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from pathlib import Path

from gpu_worker import transfer
from gpu_worker.errors import ExecutorError
from gpu_worker.lineage import unpack_adapter
from gpu_worker.serving.engine import EngineError

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_URL = re.compile(r"^(https?|file)://")


def is_url(value: str) -> bool:
    return bool(_URL.match(value))


def fetch_adapter(url: str, sha256: object, cache: Path) -> Path:
    """The folder holding the adapter bundle at ``url`` whose sha256 is ``sha256``."""
    if not isinstance(sha256, str) or not _SHA256.match(sha256):
        raise EngineError(
            "a lora_path URL needs the bundle's sha256 (64 lowercase hex characters)",
            param="sha256",
        )
    folder = cache / sha256
    if (folder / "adapter_config.json").is_file():
        return folder
    cache.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".fetch-", dir=cache))
    try:
        tar = work / "adapter.tar"
        try:
            transfer.download(url, tar, sha256=sha256, what="adapter bundle")
            unpack_adapter(tar, work / "adapter")  # manifest checked; config and weights only
        except ExecutorError as exc:
            raise EngineError(
                f"the adapter bundle was not loaded: {exc.message}", param="lora_path"
            ) from exc
        try:
            (work / "adapter").rename(folder)  # whole or not at all: a crash leaves .fetch-*
        except OSError:
            if not folder.is_dir():  # not a concurrent fetch of the same bytes that won
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return folder
