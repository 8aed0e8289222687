"""DocumentsService: converts proto messages to domain calls and back."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import timedelta
from functools import partial

import grpc

from footnote.v1 import documents_service_pb2 as pb
from footnote.v1 import documents_service_pb2_grpc as pb_grpc
from services.db.session import Database
from services.documents import domain
from services.documents.domain import DocumentRecord, DocumentState
from services.documents.links import LinkSigner
from services.documents.uploads import UploadMetadata, spool, store_upload, validate_metadata
from services.errors import InvalidArgument, NotFound
from services.rpc import principal, to_timestamp
from services.storage import Storage

STATE_TO_PROTO = {
    DocumentState.PENDING: pb.DOCUMENT_STATE_PENDING,
    DocumentState.PROCESSING: pb.DOCUMENT_STATE_PROCESSING,
    DocumentState.READY: pb.DOCUMENT_STATE_READY,
    DocumentState.FAILED: pb.DOCUMENT_STATE_FAILED,
}
STATE_FROM_PROTO = {v: k for k, v in STATE_TO_PROTO.items()}
DEFAULT_LINK_TTL = timedelta(hours=1)
MAX_LINK_TTL = timedelta(days=7)
WATCH_POLL_SECONDS = 0.25


def document_to_proto(record: DocumentRecord) -> pb.Document:
    return pb.Document(
        id=record.id,
        assistant_id=record.assistant_id,
        display_name=record.display_name,
        content_type=record.content_type,
        size_bytes=record.size_bytes,
        sha256=record.sha256,
        state=STATE_TO_PROTO[record.state],
        error=record.error,
        chunk_count=record.chunk_count,
        page_count=record.page_count,
        create_time=to_timestamp(record.create_time),
        update_time=to_timestamp(record.update_time),
        indexed_time=to_timestamp(record.indexed_time),
    )


async def upload_chunks(rest: AsyncIterator[pb.UploadDocumentRequest]) -> AsyncIterator[bytes]:
    """The bytes of the messages after the metadata one."""
    async for message in rest:
        if message.WhichOneof("payload") != "chunk":
            raise InvalidArgument("metadata", "only the first upload message may carry metadata")
        yield message.chunk


async def iterate_in_thread(items: Iterator[bytes]) -> AsyncIterator[bytes]:
    """Drives a blocking iterator from a worker thread, one item at a time."""
    done = object()
    while True:
        item = await asyncio.to_thread(next, items, done)
        if item is done:
            return
        yield item  # type: ignore[misc]


class DocumentsServicer(pb_grpc.DocumentsServiceServicer):
    def __init__(
        self,
        db: Database,
        storage: Storage,
        links: LinkSigner,
        send_ingest: Callable[[str], None],
        send_purge: Callable[[str], None],
        max_upload_bytes: int,
    ) -> None:
        self.db = db
        self.storage = storage
        self.links = links
        self.send_ingest = send_ingest
        self.send_purge = send_purge
        self.max_upload_bytes = max_upload_bytes

    async def UploadDocument(
        self,
        request_iterator: AsyncIterator[pb.UploadDocumentRequest],
        context: grpc.aio.ServicerContext,
    ) -> pb.Document:
        stream = aiter(request_iterator)
        first = await anext(stream, None)
        if first is None or first.WhichOneof("payload") != "metadata":
            raise InvalidArgument("metadata", "the first upload message must carry metadata")
        m = first.metadata
        meta = validate_metadata(
            UploadMetadata(m.assistant_id, m.display_name, m.content_type, m.request_id)
        )
        tenant = principal().tenant_id
        # The assistant is checked before the bytes flow, so a typo fails fast.
        await self.db.run(lambda s: domain.check_assistant(s, tenant, meta.assistant_id))
        upload = await spool(upload_chunks(stream), self.max_upload_bytes)
        with upload.file:
            record = await store_upload(
                self.db, self.storage, self.send_ingest, tenant, meta, upload
            )
        return document_to_proto(record)

    async def GetDocument(
        self, request: pb.GetDocumentRequest, context: grpc.aio.ServicerContext
    ) -> pb.Document:
        record = await self.db.run(
            partial(domain.get_document, tenant_id=principal().tenant_id, document_id=request.id)
        )
        return document_to_proto(record)

    async def ListDocuments(
        self, request: pb.ListDocumentsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListDocumentsResponse:
        state = None
        if request.state != pb.DOCUMENT_STATE_UNSPECIFIED:
            state = STATE_FROM_PROTO.get(request.state)
            if state is None:
                raise InvalidArgument("state", f"unknown document state {request.state}")
        records, token = await self.db.run(
            partial(
                domain.list_documents,
                tenant_id=principal().tenant_id,
                requested_size=request.page_size,
                token=request.page_token,
                assistant_id=request.assistant_id,
                state=state,
            )
        )
        return pb.ListDocumentsResponse(
            documents=[document_to_proto(r) for r in records], next_page_token=token
        )

    async def DeleteDocument(
        self, request: pb.DeleteDocumentRequest, context: grpc.aio.ServicerContext
    ) -> pb.DeleteDocumentResponse:
        record = await self.db.run(
            partial(domain.mark_deleted, tenant_id=principal().tenant_id, document_id=request.id)
        )
        # The chunks are already gone; if the broker is down, the reconciler sends the purge.
        with contextlib.suppress(Exception):
            await asyncio.to_thread(self.send_purge, record.id)
        return pb.DeleteDocumentResponse()

    async def WatchDocument(
        self, request: pb.WatchDocumentRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.Document]:
        tenant = principal().tenant_id
        last: pb.Document | None = None
        while True:
            record = await self.db.run(
                partial(domain.get_document, tenant_id=tenant, document_id=request.id)
            )
            current = document_to_proto(record)
            if last is None or current.state != last.state or current.error != last.error:
                yield current
                last = current
            if record.state.final:
                return
            await asyncio.sleep(WATCH_POLL_SECONDS)

    async def DownloadDocument(
        self, request: pb.DownloadDocumentRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.DownloadDocumentResponse]:
        record = await self.db.run(
            partial(domain.get_document, tenant_id=principal().tenant_id, document_id=request.id)
        )
        async for piece in iterate_in_thread(self.storage.stream(record.object_key)):
            yield pb.DownloadDocumentResponse(chunk=piece)

    async def GetDownloadUrl(
        self, request: pb.GetDownloadUrlRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetDownloadUrlResponse:
        ttl = request.ttl.ToTimedelta() if request.HasField("ttl") else DEFAULT_LINK_TTL
        if not timedelta(seconds=1) <= ttl <= MAX_LINK_TTL:
            raise InvalidArgument("ttl", "ttl must be between 1 second and 7 days")
        record = await self.db.run(
            partial(
                domain.get_document,
                tenant_id=principal().tenant_id,
                document_id=request.document_id,
                field="document_id",
            )
        )
        links = await self.links.presign([record.id], ttl)
        link = links.get(record.id)
        if link is None:  # deleted between the lookup and the signing
            raise NotFound("document", request.document_id)
        return pb.GetDownloadUrlResponse(url=link.url, expire_time=to_timestamp(link.expire_time))
