"""The documents domain service: uploads, records, state watching, downloads and links.

It owns its sessions, its S3 calls and the tasks it sends; the gRPC servicer and the HTTP
download endpoint only convert to and from it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta

from services.db.session import Database
from services.documents import domain
from services.documents.domain import DocumentRecord, DocumentState
from services.documents.links import MAX_TTL, Link, LinkSigner
from services.documents.uploads import UploadMetadata, spool, store_upload, validate_metadata
from services.errors import InvalidArgument, NotFound
from services.storage import Storage
from services.tasks import TaskClient

log = logging.getLogger(__name__)
DEFAULT_LINK_TTL = timedelta(hours=1)
WATCH_POLL_SECONDS = 0.25


async def iterate_in_thread(items: Iterator[bytes]) -> AsyncIterator[bytes]:
    """Drives a blocking iterator from a worker thread, one item at a time."""
    done = object()
    while True:
        item = await asyncio.to_thread(next, items, done)
        if item is done:
            return
        yield item  # type: ignore[misc]


class DocumentService:
    def __init__(
        self,
        db: Database,
        storage: Storage,
        tasks: TaskClient,
        signer: LinkSigner,
        max_upload_bytes: int,
    ) -> None:
        self.db = db
        self.storage = storage
        self.tasks = tasks
        self.signer = signer
        self.max_upload_bytes = max_upload_bytes

    async def upload(
        self, tenant_id: str, metadata: UploadMetadata, chunks: AsyncIterator[bytes]
    ) -> DocumentRecord:
        """Stores the bytes, then the row (PENDING), then sends the ingest task."""
        meta = validate_metadata(metadata)
        # The assistant is checked before the bytes flow, so a typo fails fast.
        await self.db.run(lambda s: domain.check_assistant(s, tenant_id, meta.assistant_id))
        upload = await spool(chunks, self.max_upload_bytes)
        with upload.file:
            return await store_upload(
                self.db, self.storage, self.tasks.ingest, tenant_id, meta, upload
            )

    async def get(self, tenant_id: str, document_id: str, field: str = "id") -> DocumentRecord:
        return await self.db.run(lambda s: domain.get_document(s, tenant_id, document_id, field))

    async def list(
        self,
        tenant_id: str,
        page_size: int,
        page_token: str,
        assistant_id: str = "",
        state: DocumentState | None = None,
    ) -> tuple[list[DocumentRecord], str]:
        return await self.db.run(
            lambda s: domain.list_documents(
                s, tenant_id, page_size, page_token, assistant_id=assistant_id, state=state
            )
        )

    async def delete(self, tenant_id: str, document_id: str) -> None:
        record = await self.db.run(lambda s: domain.mark_deleted(s, tenant_id, document_id))
        # The chunks are already gone; if the broker is down, the reconciler sends the purge.
        with contextlib.suppress(Exception):
            await asyncio.to_thread(self.tasks.purge, record.id)

    async def watch(self, tenant_id: str, document_id: str) -> AsyncIterator[DocumentRecord]:
        """The document now and on every change of state or error, until READY or FAILED."""
        last: DocumentRecord | None = None
        while True:
            record = await self.get(tenant_id, document_id)
            if last is None or (record.state, record.error) != (last.state, last.error):
                yield record
                last = record
            if record.state.final:
                return
            await asyncio.sleep(WATCH_POLL_SECONDS)

    def open_object(self, record: DocumentRecord) -> Iterator[bytes]:
        """The original bytes, as a blocking iterator; the first read opens the object."""
        return self.storage.stream(record.object_key)

    async def object_exists(self, record: DocumentRecord) -> bool:
        return await asyncio.to_thread(self.storage.exists, record.object_key)

    async def download(self, tenant_id: str, document_id: str) -> AsyncIterator[bytes]:
        record = await self.get(tenant_id, document_id)
        async for piece in iterate_in_thread(self.open_object(record)):
            yield piece

    async def download_url(self, tenant_id: str, document_id: str, ttl: timedelta | None) -> Link:
        """A presigned URL valid for ttl (default one hour, at most seven days)."""
        ttl = DEFAULT_LINK_TTL if ttl is None else ttl
        if not timedelta(seconds=1) <= ttl <= MAX_TTL:
            raise InvalidArgument("ttl", "ttl must be between 1 second and 7 days")
        record = await self.get(tenant_id, document_id, field="document_id")
        link = (await self.signer.presign([record.id], ttl)).get(record.id)
        if link is None:  # deleted between the lookup and the signing
            raise NotFound("document", document_id)
        return link
