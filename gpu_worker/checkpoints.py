"""Training checkpoints as single files: the Trainer's checkpoint directory in a bundle tar.

Also :class:`Checkpointer`, which decides when the running job checkpoints and ships each
checkpoint to the attempt's own checkpoint URL (overwritten: latest only). A later attempt
resumes from the control plane's sealed copy of it, which no URL can write (jobs.storage.seal):
once a later attempt started, this one's uploads are refused (409) or never read.

A checkpoint is what ``transformers.Trainer`` writes for ``resume_from_checkpoint``: adapter
weights, optimizer, scheduler, RNG states and ``trainer_state.json`` (global step, log
history). It travels in the same manifest-first tar as the adapter bundle
(:mod:`trainhub_contract.bundle`), so a truncated or corrupted checkpoint is detected by its hashes
before anything is extracted, and extraction writes only the plain files the manifest lists.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tarfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from gpu_worker import transfer
from gpu_worker.errors import ExecutorError
from trainhub_contract.bundle import MANIFEST, BundleError, verify_bundle, write_bundle

if TYPE_CHECKING:
    from gpu_worker.report import Reporter

_CHUNK = 1024 * 1024
TRAINER_STATE = "trainer_state.json"


def file_chunks(path: Path) -> Iterator[bytes]:
    with path.open("rb") as fh:
        while chunk := fh.read(_CHUNK):
            yield chunk


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    for chunk in file_chunks(path):
        digest.update(chunk)
    return digest.hexdigest()


def pack(checkpoint_dir: Path, out: Path) -> tuple[int, str]:
    """Write ``checkpoint_dir`` as a bundle tar at ``out``; returns (size, sha256)."""
    with out.open("wb") as fh:
        write_bundle(checkpoint_dir, fh)
    return out.stat().st_size, file_sha256(out)


def unpack(tar_path: Path, dest: Path) -> int:
    """Verify the tar against its manifest, then extract it into ``dest``.

    Returns the checkpoint's global step. Raises BundleError when the file is not an intact
    checkpoint (bad hashes, not a tar, no trainer state).
    """
    verified = verify_bundle(file_chunks(tar_path))
    names = {f.path for f in verified.files}
    if TRAINER_STATE not in names:
        raise BundleError(f"not a training checkpoint: no {TRAINER_STATE}", TRAINER_STATE)
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(tar_path, mode="r:") as tar:
        members = [m for m in tar.getmembers() if m.name != MANIFEST and m.name in names]
        # The "data" filter refuses links, absolute paths and escapes (verify_bundle did too).
        tar.extractall(dest, members=members, filter="data")
    state = json.loads((dest / TRAINER_STATE).read_text())
    return int(state.get("global_step", 0))


class Checkpointer:
    """When to checkpoint (every ``every_steps`` optimizer steps, or after ``every_seconds``
    without one, or at the next step once ``asked()`` says so: a provider's early warning such
    as a rebalance recommendation), and shipping the Trainer's checkpoint directory to the
    attempt's ``url``. ``asked`` answers True once per request."""

    def __init__(
        self,
        *,
        url: str,
        scratch: Path,
        reporter: Reporter,
        every_steps: int,
        every_seconds: float | None,
        start_step: int = 0,
        asked: Callable[[], bool] | None = None,
    ) -> None:
        self.url = url
        self.scratch = scratch
        self.reporter = reporter
        self.every_steps = max(1, int(every_steps))
        self.every_seconds = every_seconds
        self.last_step = start_step
        self.last_time = time.monotonic()
        self.asked = asked

    def due(self, step: int, max_steps: int) -> bool:
        if step >= max_steps:  # the final adapter goes out as the artifact instead
            return False
        if step - self.last_step >= self.every_steps:
            return True
        if step > self.last_step and self.asked is not None and self.asked():
            return True
        return (
            self.every_seconds is not None
            and step > self.last_step
            and time.monotonic() - self.last_time >= self.every_seconds
        )

    def ship(self, checkpoint_dir: Path, step: int) -> None:
        """Pack, upload and report the checkpoint, then delete it locally. A failure is
        reported as a warning: it costs redone work on a retry, not this run."""
        tar = self.scratch / "checkpoint.tar"
        try:
            size, sha256 = pack(checkpoint_dir, tar)
            transfer.upload(tar, self.url, what="checkpoint", content_type="application/x-tar")
        except (ExecutorError, OSError) as exc:
            detail = exc.message if isinstance(exc, ExecutorError) else str(exc)
            self.reporter.log(f"Checkpoint at step {step} not saved: {detail}", "warning")
        else:
            self.reporter.checkpoint(step, size=size, sha256=sha256)
        finally:
            tar.unlink(missing_ok=True)
            shutil.rmtree(checkpoint_dir, ignore_errors=True)
        self.last_step = step
        self.last_time = time.monotonic()
