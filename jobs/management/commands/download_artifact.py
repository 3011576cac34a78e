"""`manage.py download_artifact ID DIR`: the stored adapter bundle, re-verified and unpacked."""

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from gpu_worker.extract import UnsafeArchive, safe_extract
from jobs import storage
from jobs.models import Artifact
from trainhub_contract.bundle import BundleError, verify_bundle


def _tee(chunks: Iterable[bytes], out: IO[bytes]) -> Iterator[bytes]:
    for chunk in chunks:
        out.write(chunk)
        yield chunk


class Command(BaseCommand):
    help = (
        "Download artifact ID into DIR: the bundle is re-verified (every file against its "
        "manifest, the whole against the stored sha256) and extracted safely into DIR/<job>-adapter."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("artifact_id")
        parser.add_argument("dir", type=Path)
        parser.add_argument("--no-extract", action="store_true", help="keep only the .tar")

    def handle(
        self, *args: Any, artifact_id: str, dir: Path, no_extract: bool, **options: Any
    ) -> None:
        artifact = Artifact.objects.select_related("job").filter(public_id=artifact_id).first()
        if artifact is None:
            raise CommandError(f"No artifact '{artifact_id}'.")
        if not artifact.verified:
            raise CommandError(f"Artifact '{artifact_id}' failed verification; it is not served.")
        dir.mkdir(parents=True, exist_ok=True)
        tar = dir / artifact.filename
        try:
            with tar.open("wb") as out:  # memory stays flat: hashed while it is written
                verified = verify_bundle(_tee(storage.read_chunks(artifact.storage_key), out))
            if verified.sha256 != artifact.sha256:
                raise BundleError(
                    f"sha256 {verified.sha256} differs from the stored {artifact.sha256}"
                )
        except (BundleError, FileNotFoundError) as exc:
            tar.unlink(missing_ok=True)
            raise CommandError(f"Artifact '{artifact_id}' is damaged in storage: {exc}") from None
        self.stdout.write(f"{tar} ({verified.size} bytes, sha256 {verified.sha256}): verified")
        if no_extract:
            return
        target = dir / f"{artifact.job.public_id}-adapter"
        try:
            files = safe_extract(tar, target)
        except (UnsafeArchive, FileExistsError) as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"extracted {len(files)} files into {target}")
