"""The backend ``TRAINHUB_STORAGE`` names, built once per configuration."""

from __future__ import annotations

import functools
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from jobs.storage.base import Backend
from jobs.storage.local import LocalBackend
from jobs.storage.s3 import S3Backend


def backend() -> Backend:
    """The configured backend (cached per configuration, so tests can switch settings)."""
    kind = settings.TRAINHUB_STORAGE
    if kind == "local":
        return _local(str(settings.TRAINHUB_STORAGE_DIR))
    if kind == "s3":
        if not settings.TRAINHUB_S3_BUCKET:
            raise ImproperlyConfigured("TRAINHUB_STORAGE=s3 needs TRAINHUB_S3_BUCKET.")
        return _s3(
            settings.TRAINHUB_S3_BUCKET,
            settings.TRAINHUB_S3_REGION,
            settings.TRAINHUB_S3_ENDPOINT_URL,
            settings.TRAINHUB_S3_ADDRESSING_STYLE,
        )
    raise ImproperlyConfigured(f"TRAINHUB_STORAGE must be 'local' or 's3', not {kind!r}.")


@functools.lru_cache(maxsize=8)
def _local(root: str) -> LocalBackend:
    return LocalBackend(Path(root))


@functools.lru_cache(maxsize=8)
def _s3(bucket: str, region: str, endpoint_url: str, addressing_style: str) -> S3Backend:
    return S3Backend(
        bucket=bucket, region=region, endpoint_url=endpoint_url, addressing_style=addressing_style
    )
