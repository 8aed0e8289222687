"""Helpers for tests that talk gRPC."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc
from aiohttp import web
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from footnote.v1 import documents_service_pb2 as pb
from services.assistants.domain import create_assistant
from services.documents import domain
from services.storage import object_key

FINAL = {pb.DOCUMENT_STATE_READY, pb.DOCUMENT_STATE_FAILED}


def bearer(key: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {key}"),)


def error_info(err: grpc.aio.AioRpcError | grpc.RpcError) -> error_details_pb2.ErrorInfo:
    """The ErrorInfo detail of a failed call; fails the test if there is none."""
    status = rpc_status.from_call(err)
    assert status is not None, "the error carries no google.rpc.Status"
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            return info
    raise AssertionError("the status carries no ErrorInfo")


async def requests(
    assistant_id: str,
    name: str,
    data: bytes,
    content_type: str = "",
    request_id: str = "",
    piece: int = 64 * 1024,
) -> AsyncIterator[pb.UploadDocumentRequest]:
    yield pb.UploadDocumentRequest(
        metadata=pb.UploadDocumentMetadata(
            assistant_id=assistant_id,
            display_name=name,
            content_type=content_type,
            request_id=request_id,
        )
    )
    for start in range(0, len(data), piece):
        yield pb.UploadDocumentRequest(chunk=data[start : start + piece])


async def upload(docs, key, assistant_id, name, data, **kw) -> pb.Document:
    return await docs.UploadDocument(requests(assistant_id, name, data, **kw), metadata=bearer(key))


async def watch(docs, key, document_id: str, timeout: float = 120) -> list[pb.Document]:
    seen = []
    async with asyncio.timeout(timeout):
        async for doc in docs.WatchDocument(
            pb.WatchDocumentRequest(id=document_id), metadata=bearer(key)
        ):
            seen.append(doc)
    assert seen[-1].state in FINAL
    return seen


async def ingest(docs, key, assistant_id, name, data, **kw) -> pb.Document:
    doc = await upload(docs, key, assistant_id, name, data, **kw)
    return (await watch(docs, key, doc.id))[-1]


def stored_document(db, storage, tenant: str, data: bytes, name: str) -> str:
    """A PENDING document with its bytes in S3, made without sending any task."""
    assistant = db.transact(lambda s: create_assistant(s, tenant, "ingest", {}))
    doc_id = uuid.uuid4()
    sha = hashlib.sha256(data).hexdigest()
    key = object_key(str(doc_id), sha)
    storage.put(key, io.BytesIO(data), len(data), "text/markdown")
    db.transact(
        lambda s: domain.insert_document(
            s,
            document_id=doc_id,
            tenant_id=tenant,
            assistant_id=assistant.id,
            display_name=name,
            content_type="text/markdown",
            size_bytes=len(data),
            sha256=sha,
            object_key=key,
            request_id="",
        )
    )
    return str(doc_id)


def sse(payload: dict) -> bytes:
    """One server-sent event of an OpenAI-compatible stream."""
    return f"data: {json.dumps(payload)}\n\n".encode()


@contextlib.asynccontextmanager
async def scripted_upstream(
    completions: Callable[[web.Request], Awaitable[web.StreamResponse]],
) -> AsyncIterator[str]:
    """A real HTTP server answering /v1/chat/completions with `completions`; yields its base URL."""
    app = web.Application()
    app.router.add_post("/v1/chat/completions", completions)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        await runner.cleanup()
