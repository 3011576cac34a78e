"""Which base models a GPU node holds on disk, so placement can prefer it (no Django, no hub
client: a few directory listings and ``stat`` calls).

Two places count:

- the Hugging Face hub cache (``HF_HUB_CACHE``, else ``HUGGINGFACE_HUB_CACHE``, else
  ``$HF_HOME/hub``, else ``$XDG_CACHE_HOME/huggingface/hub``, else
  ``~/.cache/huggingface/hub``, as huggingface_hub resolves it): ``models--owner--name``
  counts as ``owner/name`` when one of its snapshots is complete and no download of the repo
  is under way or abandoned (a ``*.incomplete`` blob);
- ``TRAINHUB_NODE_MODEL_DIRS`` (absolute directories, separated by ``,`` or ``:``): each one
  that is a complete model directory, and each complete model directory directly inside one,
  counts by its absolute path, which is how a job names a local model.

Complete means what ``from_pretrained`` can load without a download: ``config.json`` and the
weights, i.e. every shard a ``*.index.json`` names, or else one weights file, each whole (a
safetensors file as long as its header says); a snapshot's files are links into ``blobs/``,
and a dangling link is a file not downloaded yet.

The report is bounded (:data:`MAX_MODELS` names, each a valid model reference of at most
:data:`MAX_NAME` characters: what the control plane accepts). The heartbeat thread rescans
every ``TRAINHUB_NODE_MODEL_SCAN_SECONDS`` and, between those, only when a cheap look at the
directories shows a change (a download into the cache, as an attempt's model load does; a
model copied in): :class:`ModelCache`.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from trainhub_contract.spec import SpecError, validate_model_name

log = logging.getLogger(__name__)

# The control plane refuses a longer list or name (jobs.services.fleet.nodes): a job's model is at
# most 300 characters (TrainingJob.model), so a longer name could never match one.
MAX_MODELS = 256
MAX_NAME = 300
# Entries looked into per directory: a cache or model folder of thousands is listed, and only
# the first of them (by name) are examined.
MAX_ENTRIES = 2_000
HUB_PREFIX = "models--"
# What the executor loads (torch weights); Flax/TF-only repos would download anyway.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
DEFAULT_SCAN_SECONDS = 300.0
SAFETENSORS_MAX_HEADER = 100_000_000  # the format's own limit


def hub_cache_dir(env: Mapping[str, str]) -> Path:
    """The hub cache directory, resolved as huggingface_hub does (``constants.HF_HUB_CACHE``)."""

    def expand(value: str) -> str:
        return os.path.expandvars(os.path.expanduser(value))

    explicit = env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE")
    if explicit:
        return Path(expand(explicit))
    home = env.get("HF_HOME") or os.path.join(
        env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
        "huggingface",
    )
    return Path(expand(home)) / "hub"


def parse_model_dirs(text: str) -> tuple[Path, ...]:
    """``TRAINHUB_NODE_MODEL_DIRS``; ValueError for a relative path (jobs name absolute ones)."""
    dirs = []
    for part in filter(None, (p.strip() for p in text.replace(",", os.pathsep).split(os.pathsep))):
        if not os.path.isabs(part):
            raise ValueError(
                f"TRAINHUB_NODE_MODEL_DIRS: {part!r} is not an absolute path; jobs name local "
                "models by absolute path"
            )
        dirs.append(Path(os.path.normpath(part)))
    return tuple(dirs)


def _entries(path: Path) -> list[os.DirEntry[str]]:
    """The first MAX_ENTRIES entries by name (listing is cheap; looking into each is not)."""
    try:
        with os.scandir(path) as it:
            return sorted(it, key=lambda e: e.name)[:MAX_ENTRIES]
    except OSError:
        return []


def _present(path: Path) -> bool:
    return path.is_file()  # follows the link: False for a dangling one


def _whole(path: Path) -> bool:
    """A weights file is there, and a safetensors file is as long as its header says: a local
    copy still being written is shorter (the hub's blobs appear only whole)."""
    if not path.name.endswith(".safetensors"):
        return _present(path)
    try:
        with path.open("rb") as fh:
            head = fh.read(8)
            length = int.from_bytes(head, "little")
            if len(head) != 8 or length > SAFETENSORS_MAX_HEADER:
                return False
            header = json.loads(fh.read(length))
            size = os.fstat(fh.fileno()).st_size
        ends = [
            int(tensor["data_offsets"][1])
            for key, tensor in header.items()
            if key != "__metadata__"
        ]
    except (OSError, ValueError, TypeError, KeyError, IndexError, AttributeError):
        return False
    return size == 8 + length + max(ends, default=0)


def is_complete_model(path: Path) -> bool:
    """``config.json`` and all the weights are there (see the module docstring)."""
    if not _present(path / "config.json"):
        return False
    names = [e.name for e in _entries(path)]
    indexes = [n for n in names if n.endswith(".index.json")]
    for index in indexes:
        try:
            weight_map = json.loads((path / index).read_text()).get("weight_map") or {}
        except (OSError, ValueError, AttributeError):
            return False
        shards = set(weight_map.values()) if isinstance(weight_map, dict) else set()
        if shards and all(isinstance(s, str) and _whole(path / s) for s in shards):
            return True
    if indexes:
        return False
    return any(n.endswith(WEIGHT_SUFFIXES) and _whole(path / n) for n in names)


def hub_models(cache: Path) -> list[str]:
    """``owner/name`` of every hub repo in ``cache`` with a complete snapshot."""
    found = []
    for entry in _entries(cache):
        if not entry.name.startswith(HUB_PREFIX) or not entry.is_dir():
            continue
        parts = entry.name.removeprefix(HUB_PREFIX).split("--")
        if len(parts) != 2:  # hub names hold no "--": anything else is not a model repo of ours
            continue
        repo = Path(entry.path)
        if any(b.name.endswith(".incomplete") for b in _entries(repo / "blobs")):
            continue  # a download under way (or abandoned): not proof of a loadable snapshot
        snapshots = _entries(repo / "snapshots")
        if any(s.is_dir() and is_complete_model(Path(s.path)) for s in snapshots):
            found.append("/".join(parts))
    return found


def local_models(dirs: Iterable[Path]) -> list[str]:
    """Absolute paths of the complete model directories in (or named by) ``dirs``."""
    found = []
    for root in dirs:
        if is_complete_model(root):
            found.append(str(root))
            continue
        found.extend(
            os.path.join(root, e.name)
            for e in _entries(root)
            if e.is_dir() and is_complete_model(Path(e.path))
        )
    return found


def reportable(names: Iterable[str]) -> list[str]:
    """The names the control plane accepts, sorted, unique, at most :data:`MAX_MODELS`."""
    kept = set()
    for name in names:
        try:
            if len(name) <= MAX_NAME and validate_model_name(name) == name:
                kept.add(name)
        except SpecError:
            log.info("model cache: %r is not a model reference a job can name; left out", name)
    ordered = sorted(kept)
    if len(ordered) > MAX_MODELS:
        log.warning(
            "model cache: %d models found, reporting the first %d", len(ordered), MAX_MODELS
        )
    return ordered[:MAX_MODELS]


def scan(cache: Path, dirs: Iterable[Path]) -> list[str]:
    """Every cached model this node can report (hub ids and local paths)."""
    return reportable([*hub_models(cache), *local_models(dirs)])


class ModelCache:
    """The node's model list, rescanned when due: never scanned, ``every`` seconds since the
    last scan, or the directories changed (a cheap listing and ``stat`` of the cache, each
    repo's ``blobs``, ``snapshots`` and snapshot folders, and each model directory, on every
    call). A file growing in place changes no directory: ``every`` covers it."""

    def __init__(
        self,
        cache: Path,
        dirs: tuple[Path, ...],
        every: float = DEFAULT_SCAN_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cache, self.dirs, self.every, self._clock = cache, dirs, every, clock
        self._models: list[str] | None = None
        self._scanned_at = 0.0
        self._signature: tuple[tuple[str, int, int], ...] = ()
        self._delivered: list[str] | None = None  # what the control plane has from us
        self.scans = 0

    def _stamp(self) -> tuple[tuple[str, int, int], ...]:
        """Each watched directory's modification time and the hash of its entry names (file
        times tick coarsely: two changes within a few ms may share one)."""
        paths = [self.cache]
        for repo in _entries(self.cache):
            if repo.name.startswith(HUB_PREFIX):
                snapshots = Path(repo.path) / "snapshots"
                # A file is linked into its snapshot after its blob is complete: both count.
                paths += [Path(repo.path) / "blobs", snapshots]
                paths += [Path(s.path) for s in _entries(snapshots)]
        for root in self.dirs:
            paths += [root, *(Path(e.path) for e in _entries(root) if e.is_dir())]
        stamps = []
        for path in paths:
            try:
                names = hash(tuple(e.name for e in _entries(path)))
                stamps.append((str(path), path.stat().st_mtime_ns, names))
            except OSError:
                continue
        return tuple(stamps)

    def models(self) -> list[str]:
        """The current list (rescanned if due); never raises: a failing scan reports nothing
        new and is logged."""
        signature = self._stamp()
        due = (
            self._models is None
            or self._clock() - self._scanned_at >= self.every
            or signature != self._signature
        )
        if due:
            try:
                self._models = scan(self.cache, self.dirs)
            except Exception:  # a scan must never cost the node its heartbeat
                log.exception("model cache scan failed")
                self._models = self._models or []
            self._scanned_at, self._signature = self._clock(), signature
            self.scans += 1
        return list(self._models or [])

    def to_send(self, *, registering: bool) -> list[str] | None:
        """The list to send with this heartbeat: always with a registration (a restarted
        control plane or node starts from it), else only when it changed since the last one
        delivered; None: send nothing."""
        models = self.models()
        return models if registering or models != self._delivered else None

    def delivered(self, models: list[str] | None) -> None:
        """The control plane accepted the heartbeat that carried ``models``."""
        if models is not None:
            self._delivered = models
