"""The S3 backend (AWS S3 and S3-compatible services: MinIO, R2, Ceph…) through boto3.

- Writes from the control plane stream: up to one part in memory, a single PutObject for small
  objects and a multipart upload otherwise, every request carrying its SHA-256 so S3 checks the
  bytes it received. Size and expected sha256 are checked before the object is committed
  (PutObject / CompleteMultipartUpload), and a refused multipart upload is aborted, so what was
  stored at the key is never replaced by a bad object.
- Reads stream ``GetObject`` in 1 MiB chunks.
- Transfer URLs are presigned (SigV4, at most 7 days). A PUT URL signs ``content-length`` and
  ``x-amz-checksum-sha256`` when the object's size and hash are known when it is issued, so S3
  itself refuses any other bytes; URLs issued before the bytes exist (an attempt's adapter and
  checkpoint) are capped by S3's 5 GiB single-PUT limit, and the executor sends ``Content-MD5``
  so S3 refuses a body damaged in transit. Ingest then verifies every member's SHA-256.

Credentials come from boto3's usual chain (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``, a
profile, an instance role). Presigned URLs die with the credentials that signed them: sign with
long-lived keys, not a session token, or URLs expire with the session.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterable, Iterator
from typing import Any

from jobs.storage.base import (
    CHUNK_BYTES,
    MAX_URL_TTL_SECONDS,
    HashMismatch,
    ObjectInfo,
    ObjectMissing,
    StoredObject,
    TooLarge,
    Transfer,
    sha256_b64,
)

# Multipart part size: S3's minimum is 5 MiB; this is also the most a write holds in memory.
PART_BYTES = 8 * 1024 * 1024
_MISSING = {"NoSuchKey", "404", "NotFound"}


class S3Backend:
    name = "s3"

    def __init__(
        self,
        *,
        bucket: str,
        region: str | None = None,
        endpoint_url: str | None = None,
        addressing_style: str = "auto",
    ) -> None:
        self.bucket = bucket
        self._client_args = {
            "region_name": region or None,
            "endpoint_url": endpoint_url or None,
        }
        self._addressing_style = addressing_style
        self._client: Any = None

    @property
    def client(self) -> Any:
        """One boto3 client per backend (they are thread-safe); boto3 is imported lazily."""
        if self._client is None:
            import boto3
            from botocore.config import Config

            config = Config(
                signature_version="s3v4",
                s3={"addressing_style": self._addressing_style},
                # We send SHA-256 checksums ourselves; botocore's default CRC checksums on every
                # request are refused by some S3-compatible services.
                request_checksum_calculation="when_required",
                response_checksum_validation="when_required",
                retries={"mode": "standard", "max_attempts": 5},
                connect_timeout=10,
                read_timeout=120,
            )
            self._client = boto3.client("s3", config=config, **self._client_args)
        return self._client

    # --- writes ----------------------------------------------------------------------------

    def save_stream(
        self,
        key: str,
        chunks: Iterable[bytes],
        *,
        max_bytes: int | None = None,
        expected_sha256: str | None = None,
    ) -> StoredObject:
        digest, size = hashlib.sha256(), 0
        buffer = bytearray()
        upload: _Multipart | None = None
        try:
            for chunk in chunks:
                size += len(chunk)
                if max_bytes is not None and size > max_bytes:
                    raise TooLarge(max_bytes)
                digest.update(chunk)
                buffer += chunk
                while len(buffer) >= PART_BYTES:
                    upload = upload or _Multipart(self.client, self.bucket, key)
                    upload.add(bytes(buffer[:PART_BYTES]))
                    del buffer[:PART_BYTES]
            actual = digest.hexdigest()
            if expected_sha256 is not None and actual != expected_sha256.lower():
                raise HashMismatch(expected_sha256.lower(), actual)
            if upload is None:
                body = bytes(buffer)
                self.client.put_object(
                    Bucket=self.bucket, Key=key, Body=body, ChecksumSHA256=sha256_b64(actual)
                )
            else:
                if buffer:
                    upload.add(bytes(buffer))
                upload.complete()
        except BaseException:
            if upload is not None:
                upload.abort()
            raise
        return StoredObject(key=key, size=size, sha256=actual)

    def delete(self, key: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=key)  # missing is success in S3

    def move(self, src: str, dst: str) -> None:
        # CopyObject is atomic and server-side (no bytes through here); one request copies up
        # to 5 GiB, the most any PUT URL accepts (MAX_PUT_BYTES). A PUT to ``src`` landing
        # between the copy and the delete is deleted with it, never copied.
        from botocore.exceptions import ClientError

        try:
            self.client.copy_object(
                Bucket=self.bucket, Key=dst, CopySource={"Bucket": self.bucket, "Key": src}
            )
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in _MISSING:
                raise ObjectMissing(src) from None
            raise
        self.delete(src)

    # --- reads -----------------------------------------------------------------------------

    def read_chunks(self, key: str) -> Iterator[bytes]:
        response = self._call(self.client.get_object, key)
        with contextlib.closing(response["Body"]) as body:
            yield from body.iter_chunks(CHUNK_BYTES)

    def size(self, key: str) -> int:
        return int(self._call(self.client.head_object, key)["ContentLength"])

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=prefix
        )
        for page in pages:
            for item in page.get("Contents", []):
                yield ObjectInfo(key=item["Key"], size=item["Size"], modified=item["LastModified"])

    def _call(self, operation: Any, key: str) -> Any:
        from botocore.exceptions import ClientError

        try:
            return operation(Bucket=self.bucket, Key=key)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in _MISSING:
                raise ObjectMissing(key) from None
            raise

    # --- presigned URLs --------------------------------------------------------------------

    def transfer_url(self, transfer: Transfer) -> str:
        # S3 is reachable from anywhere, so ``public`` changes nothing; a PUT's cap is S3's own
        # 5 GiB single-request limit.
        params: dict[str, Any] = {"Bucket": self.bucket, "Key": transfer.key}
        if transfer.size is not None:
            params["ContentLength"] = transfer.size  # signed: S3 refuses any other length
        if transfer.sha256 is not None:
            params["ChecksumSHA256"] = sha256_b64(transfer.sha256)  # signed: and other bytes
        operation = "get_object" if transfer.method == "GET" else "put_object"
        return self._presign(operation, params, transfer.ttl_seconds)

    def download_url(self, key: str, *, filename: str, ttl_seconds: int) -> str | None:
        params = {
            "Bucket": self.bucket,
            "Key": key,
            "ResponseContentDisposition": f'attachment; filename="{filename}"',
        }
        return self._presign("get_object", params, ttl_seconds)

    def _presign(self, operation: str, params: dict[str, Any], ttl_seconds: int) -> str:
        url: str = self.client.generate_presigned_url(
            operation, Params=params, ExpiresIn=min(ttl_seconds, MAX_URL_TTL_SECONDS)
        )
        return url


class _Multipart:
    """One multipart upload: parts carry their SHA-256, and nothing is visible at the key until
    ``complete``; ``abort`` throws the parts away."""

    def __init__(self, client: Any, bucket: str, key: str) -> None:
        self._client, self._bucket, self._key = client, bucket, key
        self._id = client.create_multipart_upload(
            Bucket=bucket, Key=key, ChecksumAlgorithm="SHA256"
        )["UploadId"]
        self._parts: list[dict[str, Any]] = []

    def add(self, data: bytes) -> None:
        number = len(self._parts) + 1
        checksum = sha256_b64(hashlib.sha256(data).hexdigest())
        response = self._client.upload_part(
            Bucket=self._bucket,
            Key=self._key,
            UploadId=self._id,
            PartNumber=number,
            Body=data,
            ChecksumSHA256=checksum,
        )
        self._parts.append(
            {"ETag": response["ETag"], "PartNumber": number, "ChecksumSHA256": checksum}
        )

    def complete(self) -> None:
        self._client.complete_multipart_upload(
            Bucket=self._bucket,
            Key=self._key,
            UploadId=self._id,
            MultipartUpload={"Parts": self._parts},
        )

    def abort(self) -> None:
        with contextlib.suppress(Exception):  # best effort: a bucket lifecycle rule cleans up
            self._client.abort_multipart_upload(
                Bucket=self._bucket, Key=self._key, UploadId=self._id
            )
