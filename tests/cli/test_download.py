"""``jobs download`` and the bundle check: a good bundle is verified and unpacked; a tampered,
traversing or linking one is refused with exit 6 and leaves nothing behind."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest

from tests.cli._fake_api import Reply, fake_api
from trainhub_cli.archive import extract_bundle
from trainhub_cli.errors import CliError, ExitCode

KEY = "th-cli-download-test-key"
JOB = "ftjob-d"


def bundle(files: dict[str, bytes], manifest: list[dict] | None = None, extra=None) -> bytes:
    """An adapter bundle as the executor writes it (manifest first), optionally lying."""
    listed = manifest if manifest is not None else [
        {"path": name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        for name, data in files.items()
    ]  # fmt: skip
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        doc = json.dumps({"format": 1, "files": listed}).encode()
        info = tarfile.TarInfo("manifest.json")
        info.size = len(doc)
        tar.addfile(info, io.BytesIO(doc))
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        if extra:
            extra(tar)
    return raw.getvalue()


FILES = {"adapter_config.json": b'{"r": 8}', "adapter_model.safetensors": b"\x00" * 4096}


def serve(api, body: bytes, listed_sha: str | None = None) -> None:
    sha = listed_sha or hashlib.sha256(body).hexdigest()
    api.on("GET", f"/api/v1/fine_tuning/jobs/{JOB}", Reply.json({"id": JOB, "status": "succeeded"}))
    api.on("GET", f"/api/v1/jobs/{JOB}/artifacts", Reply.json({"object": "list", "has_more": False, "data": [
        {"id": "artifact-1", "kind": "adapter", "filename": f"{JOB}-adapter.tar",
         "bytes": len(body), "sha256": sha, "verified": True}]}))  # fmt: skip
    api.on("GET", "/api/v1/artifacts/artifact-1/download", Reply(
        200, body, {"Content-Type": "application/x-tar", "X-Checksum-SHA256": sha}))  # fmt: skip


def download(run_cli, body: bytes, out: Path, listed_sha: str | None = None):
    with fake_api() as api:
        serve(api, body, listed_sha)
        env = {"TRAINHUB_URL": api.url, "TRAINHUB_API_KEY": KEY}
        return run_cli("--json", "jobs", "download", JOB, str(out), env=env)


def test_a_good_bundle_is_verified_and_unpacked(run_cli, tmp_path: Path) -> None:
    body = bundle(FILES)
    result = download(run_cli, body, tmp_path / "out")
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)["artifacts"][0]
    assert record["sha256_verified"] == hashlib.sha256(body).hexdigest()
    folder = Path(record["extracted_to"])
    assert folder == tmp_path / "out" / f"{JOB}-adapter"
    for name, data in FILES.items():
        assert (folder / name).read_bytes() == data
    assert (tmp_path / "out" / f"{JOB}-adapter.tar").read_bytes() == body


def test_bytes_that_differ_from_the_listed_sha256_are_refused(run_cli, tmp_path: Path) -> None:
    result = download(run_cli, bundle(FILES), tmp_path / "out", listed_sha="0" * 64)
    assert result.exit_code == ExitCode.INTEGRITY, result.output
    assert "differs" in json.loads(result.stdout)["error"]["message"]
    assert list((tmp_path / "out").iterdir()) == []  # neither the .tar nor its .part


@pytest.mark.parametrize(
    ("files", "manifest", "extra", "named"),
    [
        # a member outside the folder, listed with its true hash
        ({"../evil.txt": b"x"}, None, None, "../evil.txt"),
        ({"/etc/evil": b"x"}, None, None, "/etc/evil"),
        # a file whose bytes differ from its manifest entry
        (FILES, [{"path": "adapter_config.json", "size": 8, "sha256": "0" * 64},
                 {"path": "adapter_model.safetensors", "size": 4096,
                  "sha256": hashlib.sha256(b"\x00" * 4096).hexdigest()}], None,
         "adapter_config.json"),
        # a member the manifest does not list
        ({"extra.txt": b"x"}, [], None, "extra.txt"),
        # a symlink pointing out of the folder
        ({}, [], lambda tar: tar.addfile(_link("evil", "/etc/passwd")), "evil"),
    ],
    ids=["dotdot", "absolute", "tampered", "unlisted", "symlink"],
)  # fmt: skip
def test_an_unsafe_or_tampered_bundle_is_refused_and_nothing_is_left(
    run_cli, tmp_path: Path, files, manifest, extra, named
) -> None:
    out = tmp_path / "deep" / "out"
    result = download(run_cli, bundle(files, manifest, extra), out)
    assert result.exit_code == ExitCode.INTEGRITY, result.output
    error = json.loads(result.stdout)["error"]
    assert named in error["message"]
    assert sorted(p.name for p in out.iterdir()) == []  # no folder, no temp dir, no .tar
    assert not (tmp_path / "deep" / "evil.txt").exists()


def _link(name: str, target: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = tarfile.SYMTYPE
    info.linkname = target
    return info


def test_extract_refuses_an_existing_folder_and_a_compressed_archive(tmp_path: Path) -> None:
    tar = tmp_path / "b.tar"
    tar.write_bytes(bundle(FILES))
    (tmp_path / "there").mkdir()
    with pytest.raises(CliError) as exists:
        extract_bundle(tar, tmp_path / "there")
    assert exists.value.exit_code == ExitCode.USAGE
    gz = tmp_path / "b.tar.gz"
    with tarfile.open(gz, "w:gz") as out:
        out.add(tar, "manifest.json")
    with pytest.raises(CliError) as compressed:
        extract_bundle(gz, tmp_path / "gz")
    assert compressed.value.exit_code == ExitCode.INTEGRITY
    assert not (tmp_path / "gz").exists()
