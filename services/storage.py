"""Object storage through the minio SDK: put, stream, delete and presign document bytes."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import BinaryIO, TypeVar
from urllib.parse import urlsplit

import urllib3
from minio import Minio
from minio.error import MinioException, S3Error, ServerError

from services.errors import FailedPrecondition, Unavailable

T = TypeVar("T")
READ_CHUNK_BYTES = 256 * 1024


class StorageUnavailable(Unavailable):
    """The object store did not answer or answered with a server error; worth retrying."""

    reason = "STORAGE_UNAVAILABLE"


class ObjectMissing(FailedPrecondition):
    """The object does not exist."""

    reason = "OBJECT_MISSING"


def object_key(document_id: str, sha256: str) -> str:
    return f"documents/{document_id}/{sha256}"


class Storage:
    """One bucket of an S3-compatible store, with a timeout on every call."""

    def __init__(
        self,
        endpoint: str,
        access_key: str,
        secret_key: str,
        bucket: str,
        *,
        region: str = "us-east-1",
        timeout_seconds: float = 15.0,
        retries: int = 2,
    ) -> None:
        parts = urlsplit(endpoint if "://" in endpoint else f"http://{endpoint}")
        if not parts.hostname:
            raise ValueError(f"not an S3 endpoint URL: {endpoint!r}")
        http = urllib3.PoolManager(
            timeout=urllib3.Timeout(connect=min(5.0, timeout_seconds), read=timeout_seconds),
            retries=urllib3.Retry(
                total=retries, backoff_factor=0.2, status_forcelist=(502, 503, 504)
            ),
            maxsize=10,
        )
        self.bucket = bucket
        # The region is fixed so presigning never needs a round trip to ask for it.
        self.client = Minio(
            parts.netloc,
            access_key=access_key,
            secret_key=secret_key,
            secure=parts.scheme == "https",
            region=region,
            http_client=http,
        )

    def _call(self, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except S3Error as err:
            if err.code in ("NoSuchKey", "NoSuchObject"):
                raise ObjectMissing(err.message) from err
            raise
        except (ServerError, urllib3.exceptions.HTTPError, OSError) as err:
            raise StorageUnavailable(
                f"object storage is unavailable: {type(err).__name__}"
            ) from err
        except MinioException as err:
            raise StorageUnavailable(f"object storage failed: {type(err).__name__}") from err

    def ping(self) -> None:
        """Raises StorageUnavailable unless the store answers and the bucket exists."""
        if not self._call(lambda: self.client.bucket_exists(self.bucket)):
            raise StorageUnavailable(f"the bucket {self.bucket!r} does not exist")

    def ensure_bucket(self) -> None:
        if not self._call(lambda: self.client.bucket_exists(self.bucket)):
            self._call(lambda: self.client.make_bucket(self.bucket))

    def put(self, key: str, data: BinaryIO, length: int, content_type: str) -> None:
        self._call(
            lambda: self.client.put_object(
                self.bucket,
                key,
                data,
                length,
                content_type=content_type or "application/octet-stream",
            )
        )

    def read(self, key: str, limit: int) -> bytes:
        """The whole object, refusing objects larger than limit bytes."""
        stat = self._call(lambda: self.client.stat_object(self.bucket, key))
        if stat.size is not None and stat.size > limit:
            raise ValueError(f"object {key} has {stat.size} bytes, more than {limit}")
        return b"".join(self.stream(key))

    def stream(self, key: str, chunk_bytes: int = READ_CHUNK_BYTES) -> Iterator[bytes]:
        response = self._call(lambda: self.client.get_object(self.bucket, key))
        try:
            while True:
                piece = self._call(lambda: response.read(chunk_bytes))
                if not piece:
                    return
                yield piece
        finally:
            response.close()
            response.release_conn()

    def exists(self, key: str) -> bool:
        try:
            self._call(lambda: self.client.stat_object(self.bucket, key))
        except ObjectMissing:
            return False
        return True

    def delete(self, key: str) -> None:
        self._call(lambda: self.client.remove_object(self.bucket, key))

    def presign_get(self, key: str, ttl: timedelta) -> tuple[str, datetime]:
        now = datetime.now(UTC)
        url = self._call(
            lambda: self.client.presigned_get_object(
                self.bucket, key, expires=ttl, request_date=now
            )
        )
        return url, now + ttl
