"""``trainhub jobs download``: a succeeded job's artifacts, each checked against the SHA-256
the API lists for it (and sends as X-Checksum-SHA256), bundles checked member by member
against their manifest and unpacked safely (trainhub_cli.archive)."""

from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path, PurePosixPath
from typing import Any

from trainhub_cli.archive import extract_bundle
from trainhub_cli.client import Api
from trainhub_cli.errors import CliError, ExitCode
from trainhub_cli.render import Output, transfer_progress

CHUNK = 1 << 20


def _filename(artifact: dict[str, Any]) -> str:
    """The server's filename, as a plain name in DIR (never a path)."""
    name = PurePosixPath(str(artifact.get("filename") or "")).name
    if not name or name in (".", "..") or "\\" in name or "\x00" in name:
        name = f"{artifact['id']}.bin"
    return name


def fetch(api: Api, out: Output, artifact: dict[str, Any], target: Path) -> str:
    """Stream one artifact into ``target`` (through a .part file), verified; its sha256."""
    expected = str(artifact.get("sha256") or "").lower()
    part = target.with_name(target.name + ".part")
    digest = hashlib.sha256()
    try:
        with (
            api.download(f"/artifacts/{artifact['id']}/download") as (resp, header),
            transfer_progress(out) as progress,
        ):
            task = progress.add_task(f"downloading {target.name}", total=artifact.get("bytes"))
            with part.open("wb") as fh:
                for chunk in resp.iter_bytes(CHUNK):
                    digest.update(chunk)
                    fh.write(chunk)
                    progress.advance(task, len(chunk))
        actual = digest.hexdigest()
        for source, want in (("the artifact list", expected), ("X-Checksum-SHA256", header)):
            if want and actual != want.lower():
                raise CliError(
                    f"{target.name}: downloaded sha256 {actual} differs from {source} ({want}); "
                    "the file was removed. Try again; if it persists, tell the operator.",
                    ExitCode.INTEGRITY,
                )
        if not expected and not header:
            raise CliError(f"{target.name}: the API gave no sha256 to check.", ExitCode.INTEGRITY)
        os.replace(part, target)
    except BaseException:
        with contextlib.suppress(OSError):
            part.unlink()
        raise
    return actual


def download_job(
    api: Api, out: Output, job_id: str, directory: Path, *, extract: bool = True
) -> dict[str, Any]:
    """Every verified artifact of the job into ``directory``; what was written, per artifact."""
    job = api.get(f"/fine_tuning/jobs/{job_id}")
    artifacts = [  # an export (a whole merged model) only when asked: trainhub jobs export
        a
        for a in api.get(f"/jobs/{job_id}/artifacts").get("data") or []
        if a.get("verified", True) and a.get("kind") != "merged"
    ]
    if not artifacts:
        raise CliError(
            f"{job_id} has no verified artifact to download (status {job.get('status')}; "
            "artifacts exist once a job has succeeded).",
            ExitCode.API,
            param="job_id",
            code="no_artifact",
        )
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for artifact in artifacts:
        target = directory / _filename(artifact)
        if target.exists():
            raise CliError(
                f"{target} already exists: remove it or choose another DIR.",
                ExitCode.USAGE,
                param="DIR",
            )
        sha = fetch(api, out, artifact, target)
        record: dict[str, Any] = {**artifact, "path": str(target), "sha256_verified": sha}
        if extract and target.suffix == ".tar":
            folder = directory / target.stem
            try:
                files = extract_bundle(target, folder)
            except CliError:
                target.unlink(missing_ok=True)  # a refused bundle is not left to be used
                raise
            record["extracted_to"] = str(folder)
            record["files"] = [f.__dict__ for f in files]
        out.say(
            f"{artifact['id']}: {target} sha256 {sha} verified"
            + (
                f", {len(record['files'])} files extracted to {record['extracted_to']}"
                if "files" in record
                else ""
            )
        )
        written.append(record)
    return {"job": job_id, "directory": str(directory), "artifacts": written}
