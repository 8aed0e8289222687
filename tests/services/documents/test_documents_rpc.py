"""DocumentsService end to end: real server, real worker, real Postgres, Redis and S3."""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
import uuid
from pathlib import Path

import grpc
import httpx
import pytest
from google.protobuf import duration_pb2
from sqlalchemy import func, select

from footnote.v1 import assistants_service_pb2 as apb
from footnote.v1 import assistants_service_pb2_grpc as apb_grpc
from footnote.v1 import documents_service_pb2 as pb
from services.db.models import Chunk
from services.db.models import Document as DocumentRow
from tests.fixtures.documents import samples
from tests.support import bearer, error_info, ingest, upload, watch

FIXTURES = Path(__file__).parents[2] / "fixtures" / "documents"
pytestmark = pytest.mark.usefixtures("worker")


def chunks_of(db, document_id: str) -> list[Chunk]:
    return db.transact(
        lambda s: list(
            s.scalars(
                select(Chunk)
                .where(Chunk.document_id == uuid.UUID(document_id))
                .order_by(Chunk.chunk_index)
            )
        )
    )


async def test_markdown_reaches_ready_with_heading_chunks(docs, api_key, assistant_id, db):
    data = (FIXTURES / "handbook.md").read_bytes()
    doc = await upload(
        docs, api_key, assistant_id, "handbook.md", data, content_type="text/markdown"
    )
    assert doc.state == pb.DOCUMENT_STATE_PENDING
    assert doc.sha256 == hashlib.sha256(data).hexdigest() and doc.size_bytes == len(data)
    states = [d.state for d in await watch(docs, api_key, doc.id)]
    assert states[-1] == pb.DOCUMENT_STATE_READY, states
    assert len(states) == len(set(states)), "each state change is sent once"

    ready = await docs.GetDocument(pb.GetDocumentRequest(id=doc.id), metadata=bearer(api_key))
    assert ready.chunk_count > 0 and ready.indexed_time.seconds > 0
    assert ready.content_type == "text/markdown"
    chunks = chunks_of(db, doc.id)
    assert len(chunks) == ready.chunk_count
    assert any(c.heading_path[-1:] == ["Install"] for c in chunks)
    text = data.decode()
    for c in chunks:
        assert text[c.start_offset : c.end_offset] == c.text
        assert c.page_start is None


async def test_pdf_chunks_carry_pages(docs, api_key, assistant_id, db):
    ready = await ingest(docs, api_key, assistant_id, "rollout.pdf", samples.multipage_pdf(3))
    assert ready.state == pb.DOCUMENT_STATE_READY, ready.error
    assert ready.page_count == 3 and ready.content_type == "application/pdf"
    pages = {(c.page_start, c.page_end) for c in chunks_of(db, ready.id)}
    assert {p for span in pages for p in span} == {1, 2, 3}


async def test_docx_and_html_keep_headings(docs, api_key, assistant_id, db):
    # Declared types are wrong on purpose: the content decides.
    docx = await ingest(
        docs,
        api_key,
        assistant_id,
        "handbook",
        samples.handbook_docx(),
        content_type="application/octet-stream",
    )
    assert docx.state == pb.DOCUMENT_STATE_READY, docx.error
    assert any("Leave" in c.heading_path for c in chunks_of(db, docx.id))
    html = await ingest(
        docs,
        api_key,
        assistant_id,
        "article.html",
        (FIXTURES / "article.html").read_bytes(),
        content_type="text/plain",
    )
    assert html.state == pb.DOCUMENT_STATE_READY, html.error
    assert html.content_type == "text/html"
    joined = " ".join(c.text for c in chunks_of(db, html.id))
    assert "<script" not in joined and "function(" not in joined


async def test_download_returns_the_exact_bytes(docs, api_key, assistant_id):
    data = os.urandom(300_000) + b"tail"
    doc = await upload(docs, api_key, assistant_id, "blob.bin", data)
    received = b"".join(
        [
            m.chunk
            async for m in docs.DownloadDocument(
                pb.DownloadDocumentRequest(id=doc.id), metadata=bearer(api_key)
            )
        ]
    )
    assert hashlib.sha256(received).hexdigest() == doc.sha256


async def test_presigned_url_serves_bytes_and_refuses_tampering_and_expiry(
    docs, api_key, assistant_id
):
    data = (FIXTURES / "handbook.md").read_bytes()
    doc = await upload(docs, api_key, assistant_id, "handbook.md", data)
    reply = await docs.GetDownloadUrl(
        pb.GetDownloadUrlRequest(document_id=doc.id, ttl=duration_pb2.Duration(seconds=600)),
        metadata=bearer(api_key),
    )
    remaining = reply.expire_time.ToDatetime().timestamp() - time.time()
    assert 500 < remaining <= 601
    async with httpx.AsyncClient(timeout=10) as http:
        ok = await http.get(reply.url)
        assert ok.status_code == 200 and ok.content == data
        sig_at = reply.url.index("X-Amz-Signature=") + len("X-Amz-Signature=")
        flipped = "0" if reply.url[sig_at] != "0" else "1"
        tampered = reply.url[:sig_at] + flipped + reply.url[sig_at + 1 :]
        assert (await http.get(tampered)).status_code == 403

        short = await docs.GetDownloadUrl(
            pb.GetDownloadUrlRequest(document_id=doc.id, ttl=duration_pb2.Duration(seconds=1)),
            metadata=bearer(api_key),
        )
        await asyncio.sleep(2.5)
        assert (await http.get(short.url)).status_code == 403


@pytest.mark.parametrize("seconds", [0, -5, 7 * 24 * 3600 + 1])
async def test_download_url_ttl_is_bounded(docs, api_key, assistant_id, seconds):
    doc = await upload(docs, api_key, assistant_id, "a.txt", b"some text")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await docs.GetDownloadUrl(
            pb.GetDownloadUrlRequest(
                document_id=doc.id, ttl=duration_pb2.Duration(seconds=seconds)
            ),
            metadata=bearer(api_key),
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_info(err.value).metadata["field"] == "ttl"


async def test_over_the_limit_is_resource_exhausted_and_keeps_nothing(
    docs, api_key, assistant_id, db, settings, storage
):
    def count() -> int:
        return db.transact(lambda s: s.scalar(select(func.count()).select_from(DocumentRow)))

    objects_before = len(list(storage.client.list_objects(storage.bucket, recursive=True)))
    before = count()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await upload(docs, api_key, assistant_id, "big.txt", b"x" * (settings.max_upload_bytes + 1))
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert error_info(err.value).reason == "DOCUMENT_TOO_LARGE"
    assert count() == before
    assert len(list(storage.client.list_objects(storage.bucket, recursive=True))) == objects_before


async def test_request_id_returns_the_first_document(docs, api_key, assistant_id):
    rid = str(uuid.uuid4())
    first = await upload(docs, api_key, assistant_id, "a.txt", b"same bytes", request_id=rid)
    second = await upload(docs, api_key, assistant_id, "a.txt", b"same bytes", request_id=rid)
    assert second.id == first.id
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await upload(docs, api_key, assistant_id, "a.txt", b"other bytes", request_id=rid)
    assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS

    # Deleting the document frees its request_id for a new upload.
    await docs.DeleteDocument(pb.DeleteDocumentRequest(id=first.id), metadata=bearer(api_key))
    third = await upload(docs, api_key, assistant_id, "a.txt", b"other bytes", request_id=rid)
    assert third.id != first.id


@pytest.mark.parametrize(
    ("name", "data", "needle"),
    [
        ("cut.pdf", samples.multipage_pdf(2)[:900], "PDF"),
        ("bomb.docx", samples.docx_zip_bomb(300), "expands to"),
        ("noise.bin", bytes(range(256)) * 64 + os.urandom(4096), "unsupported"),
    ],
)
async def test_bad_files_fail_with_a_clear_error_and_spare_others(
    docs, api_key, assistant_id, db, name, data, needle
):
    good = await ingest(docs, api_key, assistant_id, "good.md", b"# Good\n\nThis one is fine.\n")
    assert good.state == pb.DOCUMENT_STATE_READY
    bad = await ingest(docs, api_key, assistant_id, name, data)
    assert bad.state == pb.DOCUMENT_STATE_FAILED
    assert needle.lower() in bad.error.lower(), bad.error
    assert "Traceback" not in bad.error
    after = await docs.GetDocument(pb.GetDocumentRequest(id=good.id), metadata=bearer(api_key))
    assert after.state == pb.DOCUMENT_STATE_READY and after.chunk_count == good.chunk_count
    # The original bytes are kept for a failed document.
    got = b"".join(
        [
            m.chunk
            async for m in docs.DownloadDocument(
                pb.DownloadDocumentRequest(id=bad.id), metadata=bearer(api_key)
            )
        ]
    )
    assert got == data


async def test_empty_upload_is_invalid(docs, api_key, assistant_id):
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await upload(docs, api_key, assistant_id, "empty.txt", b"")
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_info(err.value).reason == "DOCUMENT_EMPTY"


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda aid: [pb.UploadDocumentRequest(chunk=b"no metadata first")], "metadata"),
        (lambda aid: [], "metadata"),
        (
            lambda aid: [
                pb.UploadDocumentRequest(metadata=pb.UploadDocumentMetadata(assistant_id=aid))
            ],
            "metadata.display_name",
        ),
        (
            lambda aid: [
                pb.UploadDocumentRequest(metadata=pb.UploadDocumentMetadata(display_name="x"))
            ],
            "metadata.assistant_id",
        ),
        (
            lambda aid: [
                pb.UploadDocumentRequest(
                    metadata=pb.UploadDocumentMetadata(
                        assistant_id=aid, display_name="x", content_type="text/plain\x00"
                    )
                )
            ],
            "metadata.content_type",
        ),
        (
            lambda aid: [
                pb.UploadDocumentRequest(
                    metadata=pb.UploadDocumentMetadata(assistant_id=aid, display_name="x")
                ),
                pb.UploadDocumentRequest(
                    metadata=pb.UploadDocumentMetadata(assistant_id=aid, display_name="y")
                ),
            ],
            "metadata",
        ),
    ],
)
async def test_malformed_upload_streams_are_invalid(docs, api_key, assistant_id, build, field):
    async def stream():
        for message in build(assistant_id):
            yield message

    with pytest.raises(grpc.aio.AioRpcError) as err:
        await docs.UploadDocument(stream(), metadata=bearer(api_key))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_info(err.value).metadata["field"] == field


async def test_upload_to_another_tenants_assistant_is_not_found(docs, make_key, assistant_id):
    stranger = make_key("stranger-" + uuid.uuid4().hex[:6])
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await upload(docs, stranger, assistant_id, "a.txt", b"hello")
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


async def test_delete_hides_chunks_at_once_and_removes_the_object(
    docs, api_key, assistant_id, db, storage
):
    ready = await ingest(
        docs, api_key, assistant_id, "handbook.md", (FIXTURES / "handbook.md").read_bytes()
    )
    key = db.transact(lambda s: s.get(DocumentRow, uuid.UUID(ready.id)).object_key)
    await docs.DeleteDocument(pb.DeleteDocumentRequest(id=ready.id), metadata=bearer(api_key))
    assert chunks_of(db, ready.id) == []
    for rpc in (
        docs.GetDocument(pb.GetDocumentRequest(id=ready.id), metadata=bearer(api_key)),
        docs.DeleteDocument(pb.DeleteDocumentRequest(id=ready.id), metadata=bearer(api_key)),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await rpc
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
    async with asyncio.timeout(30):
        while storage.exists(key):
            await asyncio.sleep(0.2)


async def test_list_filters_and_pages(docs, make_key, channel):
    key = make_key("lister-" + uuid.uuid4().hex[:6])
    stub = apb_grpc.AssistantsServiceStub(channel)
    a1, a2 = [
        (
            await stub.CreateAssistant(
                apb.CreateAssistantRequest(assistant=apb.Assistant(display_name=n)),
                metadata=bearer(key),
            )
        ).id
        for n in ("one", "two")
    ]
    made = [(await upload(docs, key, a1, f"d{i}.txt", f"text {i}".encode())).id for i in range(5)]
    await upload(docs, key, a2, "other.txt", b"other")
    seen, token = [], ""
    while True:
        page = await docs.ListDocuments(
            pb.ListDocumentsRequest(assistant_id=a1, page_size=2, page_token=token),
            metadata=bearer(key),
        )
        seen += [d.id for d in page.documents]
        token = page.next_page_token
        if not token:
            break
    assert seen == made
    for doc_id in made:
        await watch(docs, key, doc_id)
    ready = await docs.ListDocuments(
        pb.ListDocumentsRequest(assistant_id=a1, state=pb.DOCUMENT_STATE_READY),
        metadata=bearer(key),
    )
    assert sorted(d.id for d in ready.documents) == sorted(made)
    failed = await docs.ListDocuments(
        pb.ListDocumentsRequest(state=pb.DOCUMENT_STATE_FAILED), metadata=bearer(key)
    )
    assert list(failed.documents) == []
