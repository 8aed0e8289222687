"""Storing an upload: the bytes go to S3 first, then the row, then the ingest task."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import tempfile
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import BinaryIO

from sqlalchemy.exc import IntegrityError

from services.db.session import Database
from services.documents import domain
from services.documents.domain import DocumentRecord
from services.errors import AlreadyExists, InvalidArgument, ResourceExhausted
from services.fields import check_content_type, has_control
from services.ids import parse_id
from services.storage import Storage, object_key

log = logging.getLogger(__name__)
SPOOL_IN_MEMORY_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class UploadMetadata:
    assistant_id: str
    display_name: str
    content_type: str
    request_id: str


@dataclass
class SpooledUpload:
    file: BinaryIO
    size: int
    sha256: str


async def spool(chunks: AsyncIterator[bytes], max_bytes: int) -> SpooledUpload:
    """Copies the stream to a temporary file, hashing it and stopping at the size limit."""
    digest = hashlib.sha256()
    size = 0
    file = tempfile.SpooledTemporaryFile(max_size=SPOOL_IN_MEMORY_BYTES)  # noqa: SIM115
    try:
        async for piece in chunks:
            size += len(piece)
            if size > max_bytes:
                raise ResourceExhausted(
                    f"the document is larger than the limit of {max_bytes} bytes",
                    reason="DOCUMENT_TOO_LARGE",
                    metadata={"limit_bytes": str(max_bytes)},
                )
            digest.update(piece)
            file.write(piece)
    except BaseException:
        file.close()
        raise
    file.seek(0)
    return SpooledUpload(file=file, size=size, sha256=digest.hexdigest())


def validate_metadata(meta: UploadMetadata) -> UploadMetadata:
    if not meta.assistant_id:
        raise InvalidArgument("metadata.assistant_id", "assistant_id is required")
    if len(meta.request_id) > 128:
        raise InvalidArgument("metadata.request_id", "request_id must be at most 128 characters")
    for field in ("assistant_id", "request_id"):
        if has_control(getattr(meta, field)):
            raise InvalidArgument(
                f"metadata.{field}", f"{field} must not contain control characters"
            )
    parse_id(meta.assistant_id, "metadata.assistant_id")
    return UploadMetadata(
        assistant_id=meta.assistant_id,
        display_name=domain.validate_display_name(meta.display_name),
        content_type=check_content_type(meta.content_type, "metadata.content_type"),
        request_id=meta.request_id,
    )


def deduplicated(
    previous: DocumentRecord, meta: UploadMetadata, upload: SpooledUpload
) -> DocumentRecord:
    """AIP-155: the first document for the same upload, an error for a different one."""
    differs = [
        what
        for what, same in (
            ("assistant_id", previous.assistant_id == meta.assistant_id),
            ("display_name", previous.display_name == meta.display_name),
            ("bytes", previous.sha256 == upload.sha256),
        )
        if not same
    ]
    if differs:
        raise AlreadyExists(
            f"request_id was already used for a different upload ({', '.join(differs)} "
            "differ); use a new request_id",
            reason="REQUEST_ID_REUSED",
            metadata={"document_id": previous.id},
        )
    return previous


async def store_upload(
    db: Database,
    storage: Storage,
    send_ingest: Callable[[str], None],
    tenant_id: str,
    meta: UploadMetadata,
    upload: SpooledUpload,
) -> DocumentRecord:
    """Stores bytes and row; the task is sent only once the row is committed.

    The assistant is checked again inside the insert's transaction, so one deleted while the
    bytes streamed in leaves no row, and the stored object is removed.
    """
    if meta.request_id:
        previous = await db.run(lambda s: domain.find_by_request_id(s, tenant_id, meta.request_id))
        if previous is not None:
            return deduplicated(previous, meta, upload)
    if upload.size == 0:
        raise InvalidArgument("chunk", "the document is empty", reason="DOCUMENT_EMPTY")
    document_id = uuid.uuid4()
    key = object_key(str(document_id), upload.sha256)
    await asyncio.to_thread(storage.put, key, upload.file, upload.size, meta.content_type)
    try:
        record = await db.run(
            lambda s: domain.insert_document(
                s,
                document_id=document_id,
                tenant_id=tenant_id,
                assistant_id=meta.assistant_id,
                display_name=meta.display_name,
                content_type=meta.content_type or "application/octet-stream",
                size_bytes=upload.size,
                sha256=upload.sha256,
                object_key=key,
                request_id=meta.request_id,
            )
        )
    except BaseException as err:
        # No row points at the object, so nothing would ever remove it.
        await asyncio.to_thread(storage.delete, key)
        if isinstance(err, IntegrityError) and meta.request_id:
            winner = await db.run(
                lambda s: domain.find_by_request_id(s, tenant_id, meta.request_id)
            )
            if winner is not None:
                return deduplicated(winner, meta, upload)
        raise
    try:
        await asyncio.to_thread(send_ingest, record.id)
    except Exception:  # the row is PENDING; the reconciler sends the task later
        log.warning("could not send the ingest task for %s; the reconciler will", record.id)
    return record
