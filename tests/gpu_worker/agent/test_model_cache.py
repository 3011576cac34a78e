"""gpu_worker.agent.model_cache: which base models a node reports as cached. A fake Hugging Face hub
cache laid out as huggingface_hub writes it (``models--owner--name/{blobs,refs,snapshots}``,
snapshot files linked to blobs, ``<blob>.incomplete`` while downloading), local model folders,
the cache location as huggingface_hub resolves it, the bounds, and the rescan cadence."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpu_worker.agent import model_cache as mc
from gpu_worker.agent import node as node_settings
from tests.gpu_worker._hub_cache import (
    COMMIT,
    CONFIG,
    SINGLE,
    WEIGHTS,
    hub_repo,
    local_model,
    safetensors,
    sharded,
)

# --- what counts as cached ----------------------------------------------------------------


def test_a_complete_hub_snapshot_counts_by_its_hub_id(tmp_path: Path) -> None:
    hub_repo(tmp_path, "acme/tiny-llama", SINGLE)
    hub_repo(tmp_path, "Qwen/Qwen2.5-0.5B", sharded("a.safetensors", "b.safetensors"))
    assert mc.scan(tmp_path, ()) == ["Qwen/Qwen2.5-0.5B", "acme/tiny-llama"]


def test_copied_snapshot_files_count_too(tmp_path: Path) -> None:
    """Where symlinks are unsupported, huggingface_hub copies the files into the snapshot."""
    hub_repo(tmp_path, "acme/copied", SINGLE, linked=False)
    assert mc.scan(tmp_path, ()) == ["acme/copied"]


@pytest.mark.parametrize(
    ("files", "kwargs"),
    [
        # a download under way: a blob still .incomplete, though config and weights are linked
        (SINGLE, {"incomplete": True}),
        # the weights' link points to a blob that never arrived
        (SINGLE, {"missing": ("model.safetensors",)}),
        # a sharded model with one shard not downloaded
        (sharded("a.safetensors", "b.safetensors"), {"missing": ("b.safetensors",)}),
        # no config.json
        ({"model.safetensors": WEIGHTS}, {}),
        # no weights at all (tokenizer and config only)
        ({**CONFIG, "tokenizer.json": "{}"}, {}),
        # an index that names no shard
        ({**CONFIG, "model.safetensors.index.json": "{}", "x.safetensors": WEIGHTS}, {}),
        # an index that is no JSON
        ({**CONFIG, "model.safetensors.index.json": "{", "x.safetensors": WEIGHTS}, {}),
    ],
    ids=[
        "incomplete-blob",
        "dangling-weights",
        "missing-shard",
        "no-config",
        "no-weights",
        "empty-index",
        "bad-index",
    ],
)
def test_a_partial_download_does_not_count(tmp_path: Path, files: dict, kwargs: dict) -> None:
    hub_repo(tmp_path, "acme/partial", files, **kwargs)
    assert mc.scan(tmp_path, ()) == []


def test_one_complete_snapshot_is_enough(tmp_path: Path) -> None:
    hub_repo(tmp_path, "acme/two", SINGLE, missing=("model.safetensors",), commit="a" * 40)
    hub_repo(tmp_path, "acme/two", SINGLE, commit="b" * 40)
    assert mc.scan(tmp_path, ()) == ["acme/two"]


def test_what_is_no_model_repo_is_left_out(tmp_path: Path) -> None:
    hub_repo(tmp_path, "acme/ok", SINGLE)
    data = tmp_path / "datasets--acme--data" / "snapshots" / COMMIT
    local_model(data)  # a dataset repo, even one that looks like a model
    (tmp_path / "models--no-owner").mkdir()
    (tmp_path / "models--a--b--c").mkdir()
    (tmp_path / "version.txt").write_text("1")
    (tmp_path / ".locks").mkdir()
    assert mc.scan(tmp_path, ()) == ["acme/ok"]


def test_local_model_folders_count_by_absolute_path(tmp_path: Path) -> None:
    models = tmp_path / "models"
    local_model(models / "llama-8b")
    local_model(models / "qwen", sharded("a.safetensors"))
    local_model(models / "half", {**CONFIG})  # no weights yet
    (models / "notes.txt").write_text("x")
    single = local_model(tmp_path / "mistral")
    dirs = mc.parse_model_dirs(f"{models},{single}:{tmp_path / 'absent'}")
    assert mc.scan(tmp_path / "no-hub-cache", dirs) == sorted(
        [str(models / "llama-8b"), str(models / "qwen"), str(single)]
    )


def test_a_local_model_still_being_copied_does_not_count(tmp_path: Path) -> None:
    whole = safetensors(values=16)
    copying = local_model(tmp_path / "copying", {**CONFIG})
    (copying / "model.safetensors").write_bytes(whole[:-10])
    garbage = local_model(tmp_path / "garbage", {**CONFIG})
    (garbage / "model.safetensors").write_bytes(b"\xff" * 64)
    legacy = local_model(tmp_path / "legacy", {**CONFIG, "pytorch_model.bin": "pickle"})
    assert mc.local_models([copying, garbage, legacy]) == [str(legacy)]

    (copying / "model.safetensors").write_bytes(whole)
    assert mc.local_models([copying]) == [str(copying)]


def test_a_real_safetensors_file_is_whole_and_a_truncated_one_is_not(tmp_path: Path) -> None:
    numpy = pytest.importorskip("numpy")
    save_file = pytest.importorskip("safetensors.numpy").save_file
    model = local_model(tmp_path / "real", {**CONFIG})
    tensors = {"a": numpy.zeros((3, 5), "float32"), "b": numpy.ones(7, "int64")}
    save_file(tensors, str(model / "model.safetensors"), metadata={"format": "pt"})
    assert mc.local_models([model]) == [str(model)]
    data = (model / "model.safetensors").read_bytes()
    (model / "model.safetensors").write_bytes(data[:-1])
    assert mc.local_models([model]) == []


def test_model_dirs_must_be_absolute() -> None:
    assert mc.parse_model_dirs("") == ()
    assert mc.parse_model_dirs(" /a/ , /b/../c ") == (Path("/a"), Path("/c"))
    with pytest.raises(ValueError, match="TRAINHUB_NODE_MODEL_DIRS: 'models' is not an absolute"):
        mc.parse_model_dirs("/ok,models")


def test_the_fake_layout_is_the_one_huggingface_hub_reads(tmp_path: Path) -> None:
    """huggingface_hub's own cache scan sees the fake repos as it sees real ones."""
    scan_cache_dir = pytest.importorskip("huggingface_hub").scan_cache_dir
    hub_repo(tmp_path, "acme/tiny-llama", SINGLE)
    info = scan_cache_dir(tmp_path)
    assert [(r.repo_id, r.repo_type) for r in info.repos] == [("acme/tiny-llama", "model")]
    [revision] = next(iter(info.repos)).revisions
    assert revision.commit_hash == COMMIT and "main" in revision.refs


# --- where the hub cache is ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"HF_HUB_CACHE": "/c/hub", "HF_HOME": "/h", "HUGGINGFACE_HUB_CACHE": "/old"}, "/c/hub"),
        ({"HUGGINGFACE_HUB_CACHE": "/old", "HF_HOME": "/h"}, "/old"),
        ({"HF_HOME": "/h", "XDG_CACHE_HOME": "/x"}, "/h/hub"),
        ({"XDG_CACHE_HOME": "/x"}, "/x/huggingface/hub"),
        ({}, "~/.cache/huggingface/hub"),
    ],
)
def test_the_hub_cache_is_found_as_huggingface_hub_finds_it(env: dict, expected: str) -> None:
    assert mc.hub_cache_dir(env) == Path(os.path.expanduser(expected))


def test_the_node_config_reads_the_cache_settings(tmp_path: Path) -> None:
    base = {
        "TRAINHUB_NODE_NAME": "n",
        "TRAINHUB_NODE_TOKEN": "thn-x",
        "TRAINHUB_CONTROL_URL": "http://127.0.0.1:1",
        "CELERY_BROKER_URL": "redis://127.0.0.1:6379/0",
    }
    node = node_settings.config_from(
        base
        | {
            "HF_HUB_CACHE": str(tmp_path / "hub"),
            "TRAINHUB_NODE_MODEL_DIRS": "/models,/srv/llama",
            "TRAINHUB_NODE_MODEL_SCAN_SECONDS": "60",
        }
    )
    assert node.hub_cache == tmp_path / "hub"
    assert node.model_dirs == (Path("/models"), Path("/srv/llama"))
    assert node.model_scan_seconds == 60
    assert node_settings.config_from(base).model_scan_seconds == mc.DEFAULT_SCAN_SECONDS
    with pytest.raises(ValueError, match="TRAINHUB_NODE_MODEL_DIRS"):
        node_settings.config_from(base | {"TRAINHUB_NODE_MODEL_DIRS": "relative"})


# --- bounds -------------------------------------------------------------------------------


def test_the_report_holds_only_names_a_job_can_name_and_is_bounded(tmp_path: Path) -> None:
    names = [f"acme/m{i:04d}" for i in range(mc.MAX_MODELS + 10)]
    too_long = "/" + "x" * mc.MAX_NAME
    odd = ["/models/with space", "/models/../etc", "relative/dir/x", "acme/m0001"]
    report = mc.reportable([*names, too_long, *odd])
    assert report == names[: mc.MAX_MODELS]
    assert mc.reportable(["/m/b", "acme/a", "/m/b"]) == ["/m/b", "acme/a"]


def test_a_huge_cache_is_listed_up_to_a_bound(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(mc, "MAX_ENTRIES", 5)
    for i in range(8):
        hub_repo(tmp_path, f"acme/m{i}", SINGLE)
    assert mc.scan(tmp_path, ()) == [f"acme/m{i}" for i in range(5)]


# --- when it rescans ----------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_cache_rescans_when_due_or_changed_not_on_every_call(tmp_path: Path) -> None:
    clock = Clock()
    models = tmp_path / "models"
    models.mkdir()
    cache = mc.ModelCache(tmp_path / "hub", (models,), every=300, clock=clock)

    assert cache.models() == [] and cache.scans == 1
    clock.now += 30
    assert cache.models() == [] and cache.scans == 1  # nothing changed, not due

    hub_repo(tmp_path / "hub", "acme/new", SINGLE)  # an attempt downloaded its model
    assert cache.models() == ["acme/new"] and cache.scans == 2
    assert cache.models() == ["acme/new"] and cache.scans == 2

    local_model(models / "llama")  # an operator copied a model in
    assert cache.models() == [str(models / "llama"), "acme/new"] and cache.scans == 3

    clock.now += 300  # due anyway: a change a stat cannot see (a file replaced in place)
    cache.models()
    assert cache.scans == 4


def test_a_download_finishing_is_seen_at_the_next_call(tmp_path: Path) -> None:
    hub = tmp_path / "hub"
    repo = hub_repo(hub, "acme/big", SINGLE, incomplete=True)
    cache = mc.ModelCache(hub, (), every=3600, clock=Clock())
    assert cache.models() == []
    (repo / "blobs" / "etag9999.incomplete").rename(repo / "blobs" / "etag9999")
    assert cache.models() == ["acme/big"]


def test_a_failing_scan_keeps_the_last_list(tmp_path: Path, monkeypatch) -> None:
    hub_repo(tmp_path, "acme/ok", SINGLE)
    clock = Clock()
    cache = mc.ModelCache(tmp_path, (), every=10, clock=clock)
    assert cache.models() == ["acme/ok"]

    def broken(*_: object) -> list[str]:
        raise PermissionError("denied")

    monkeypatch.setattr(mc, "scan", broken)
    clock.now += 10
    assert cache.models() == ["acme/ok"]


def test_the_list_goes_with_each_registration_and_when_it_changed(tmp_path: Path) -> None:
    cache = mc.ModelCache(tmp_path, (), every=3600, clock=Clock())
    first = cache.to_send(registering=True)
    assert first == []
    assert cache.to_send(registering=False) == []  # never delivered: sent again
    cache.delivered(first)
    assert cache.to_send(registering=False) is None
    assert cache.to_send(registering=True) == []

    hub_repo(tmp_path, "acme/new", SINGLE)
    changed = cache.to_send(registering=False)
    assert changed == ["acme/new"]
    assert cache.to_send(registering=False) == ["acme/new"]  # the beat failed: try again
    cache.delivered(changed)
    assert cache.to_send(registering=False) is None


def test_a_file_linked_into_its_snapshot_after_its_blob_is_seen(tmp_path: Path) -> None:
    """huggingface_hub renames the finished blob, then links it into the snapshot: a scan in
    between must not leave the model unreported until the next periodic rescan."""
    repo = hub_repo(tmp_path, "acme/late", {**CONFIG, "tokenizer.json": "{}"})
    cache = mc.ModelCache(tmp_path, (), every=3600, clock=Clock())
    (repo / "blobs" / "etag-weights").write_bytes(safetensors())
    assert cache.models() == []  # the blob is there, its link not yet
    snapshot = repo / "snapshots" / COMMIT
    (snapshot / "model.safetensors").symlink_to("../../blobs/etag-weights")
    assert cache.models() == ["acme/late"]
