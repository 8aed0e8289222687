"""DocumentsService: converts proto messages to the document service's calls and back."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc

from footnote.v1 import documents_service_pb2 as pb
from footnote.v1 import documents_service_pb2_grpc as pb_grpc
from services.documents.domain import DocumentRecord, DocumentState
from services.documents.service import DocumentService
from services.documents.uploads import UploadMetadata
from services.errors import InvalidArgument
from services.rpc import principal, to_timedelta, to_timestamp

STATE_TO_PROTO = {
    DocumentState.PENDING: pb.DOCUMENT_STATE_PENDING,
    DocumentState.PROCESSING: pb.DOCUMENT_STATE_PROCESSING,
    DocumentState.READY: pb.DOCUMENT_STATE_READY,
    DocumentState.FAILED: pb.DOCUMENT_STATE_FAILED,
}
STATE_FROM_PROTO = {v: k for k, v in STATE_TO_PROTO.items()}


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


class DocumentsServicer(pb_grpc.DocumentsServiceServicer):
    def __init__(self, documents: DocumentService) -> None:
        self.documents = documents

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
        meta = UploadMetadata(m.assistant_id, m.display_name, m.content_type, m.request_id)
        record = await self.documents.upload(principal().tenant_id, meta, upload_chunks(stream))
        return document_to_proto(record)

    async def GetDocument(
        self, request: pb.GetDocumentRequest, context: grpc.aio.ServicerContext
    ) -> pb.Document:
        return document_to_proto(await self.documents.get(principal().tenant_id, request.id))

    async def ListDocuments(
        self, request: pb.ListDocumentsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListDocumentsResponse:
        state = None
        if request.state != pb.DOCUMENT_STATE_UNSPECIFIED:
            state = STATE_FROM_PROTO.get(request.state)
            if state is None:
                raise InvalidArgument("state", f"unknown document state {request.state}")
        records, token = await self.documents.list(
            principal().tenant_id,
            request.page_size,
            request.page_token,
            assistant_id=request.assistant_id,
            state=state,
        )
        return pb.ListDocumentsResponse(
            documents=[document_to_proto(r) for r in records], next_page_token=token
        )

    async def DeleteDocument(
        self, request: pb.DeleteDocumentRequest, context: grpc.aio.ServicerContext
    ) -> pb.DeleteDocumentResponse:
        await self.documents.delete(principal().tenant_id, request.id)
        return pb.DeleteDocumentResponse()

    async def WatchDocument(
        self, request: pb.WatchDocumentRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.Document]:
        async for record in self.documents.watch(principal().tenant_id, request.id):
            yield document_to_proto(record)

    async def DownloadDocument(
        self, request: pb.DownloadDocumentRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.DownloadDocumentResponse]:
        async for piece in self.documents.download(principal().tenant_id, request.id):
            yield pb.DownloadDocumentResponse(chunk=piece)

    async def GetDownloadUrl(
        self, request: pb.GetDownloadUrlRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetDownloadUrlResponse:
        ttl = to_timedelta(request.ttl, "ttl") if request.HasField("ttl") else None
        link = await self.documents.download_url(principal().tenant_id, request.document_id, ttl)
        return pb.GetDownloadUrlResponse(url=link.url, expire_time=to_timestamp(link.expire_time))
