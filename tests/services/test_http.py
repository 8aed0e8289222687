"""The HTTP side port over a real socket: downloads from real S3, keys checked against Postgres."""

from __future__ import annotations

import contextlib
import hashlib
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from urllib.parse import unquote

import httpx
import pytest

from footnote.v1 import documents_service_pb2 as pb
from services.config import Settings
from services.http import content_disposition, create_http_app, media_type, start_http
from services.server import Deps
from services.storage import READ_CHUNK_BYTES, Storage, StorageUnavailable, object_key
from tests.support import bearer, stored_document, upload

NOT_FOUND_BODY = {"error": {"code": "NOT_FOUND", "message": "document not found"}}


class FailsAfterOnePiece(Storage):
    """Real S3 for the first piece, then an outage: the failure only a streamed body can have."""

    def stream(self, key: str, chunk_bytes: int = READ_CHUNK_BYTES) -> Iterator[bytes]:
        pieces = super().stream(key, chunk_bytes)
        yield next(pieces)
        pieces.close()
        raise StorageUnavailable("object storage is unavailable: ReadTimeoutError")


@contextlib.asynccontextmanager
async def serve_http(
    settings: Settings, storage_class: type[Storage] | None = None
) -> AsyncIterator[str]:
    deps = Deps.from_settings(settings)
    if storage_class is not None:
        # The document service streams the bytes, so it is the one that gets this storage.
        deps.documents.storage = storage_class(
            settings.s3_endpoint or "",
            settings.s3_access_key or "",
            settings.s3_secret_key or "",
            settings.s3_bucket,
        )
    runner, port = await start_http(create_http_app(deps), "127.0.0.1", 0, shutdown_timeout=1.0)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()
        deps.close()


@pytest.fixture(scope="module")
async def base_url(settings: Settings) -> AsyncIterator[str]:
    async with serve_http(settings) as url:
        yield url


@pytest.fixture
async def http(base_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as client:
        yield client


@pytest.fixture
async def document(docs, api_key, assistant_id) -> tuple[pb.Document, bytes]:
    # Over a megabyte, so the body crosses several storage reads.
    data = os.urandom(1024 * 1024 + 12345)
    doc = await upload(
        docs, api_key, assistant_id, "blob.bin", data, content_type="application/octet-stream"
    )
    return doc, data


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def path(document_id: str) -> str:
    return f"/v1/documents/{document_id}/download"


async def test_healthz_needs_no_key(http):
    reply = await http.get("/healthz")
    assert reply.status_code == 200 and reply.text == "ok"


async def test_download_streams_the_exact_bytes(http, api_key, document):
    doc, data = document
    reply = await http.get(path(doc.id), headers=auth(api_key))
    assert reply.status_code == 200
    assert hashlib.sha256(reply.content).hexdigest() == doc.sha256
    assert reply.content == data
    assert reply.headers["content-type"] == "application/octet-stream"
    assert reply.headers["content-length"] == str(len(data)) == str(doc.size_bytes)
    assert reply.headers["content-disposition"] == (
        "attachment; filename=\"blob.bin\"; filename*=UTF-8''blob.bin"
    )
    assert reply.headers["etag"] == f'"{doc.sha256}"'
    assert reply.headers["cache-control"] == "private, no-store"
    assert reply.headers["x-content-type-options"] == "nosniff"
    assert "transfer-encoding" not in reply.headers


async def test_head_sends_the_headers_without_a_body(http, api_key, document):
    doc, data = document
    got = await http.get(path(doc.id), headers=auth(api_key))
    head = await http.head(path(doc.id), headers=auth(api_key))
    assert head.status_code == 200
    assert head.content == b""
    for name in ("content-type", "content-length", "content-disposition", "etag", "cache-control"):
        assert head.headers[name] == got.headers[name], name
    assert head.headers["content-length"] == str(len(data))


@pytest.mark.parametrize(
    ("headers", "challenge"),
    [
        ({}, 'Bearer realm="footnote"'),
        ({"Authorization": "Bearer"}, 'Bearer realm="footnote"'),
        ({"Authorization": "Basic dXNlcjpwYXNz"}, 'Bearer realm="footnote"'),
        ({"Authorization": "Bearer fn_not-a-real-key"}, 'Bearer realm="footnote", error='),
    ],
)
async def test_no_valid_key_is_401(http, document, headers, challenge):
    doc, _ = document
    for method in ("GET", "HEAD"):
        reply = await http.request(method, path(doc.id), headers=headers)
        assert reply.status_code == 401, method
        assert reply.headers["www-authenticate"].startswith(challenge)
    body = (await http.get(path(doc.id), headers=headers)).json()
    assert body["error"]["code"] == "UNAUTHENTICATED"
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message"}


async def test_the_key_is_checked_before_the_id(http):
    reply = await http.get(path("not-an-id"))
    assert reply.status_code == 401


async def test_other_tenants_document_looks_exactly_like_a_missing_one(http, make_key, document):
    doc, _ = document
    other = make_key(f"other-{uuid.uuid4().hex[:8]}")
    theirs = await http.get(path(doc.id), headers=auth(other))
    missing = await http.get(path(str(uuid.uuid4())), headers=auth(other))
    assert theirs.status_code == missing.status_code == 404
    assert theirs.content == missing.content
    assert theirs.json() == NOT_FOUND_BODY
    assert theirs.headers.get("content-type") == missing.headers.get("content-type")
    head = await http.head(path(doc.id), headers=auth(other))
    assert head.status_code == 404 and head.content == b""


@pytest.mark.parametrize("bad_id", ["not-an-id", "1234", "%00", "' OR 1=1 --", "x" * 300])
async def test_malformed_ids_are_404(http, api_key, bad_id):
    reply = await http.get(f"/v1/documents/{bad_id}/download", headers=auth(api_key))
    assert reply.status_code == 404
    assert reply.json() == NOT_FOUND_BODY


async def test_deleted_document_is_404(http, docs, api_key, document):
    doc, _ = document
    assert (await http.head(path(doc.id), headers=auth(api_key))).status_code == 200
    await docs.DeleteDocument(pb.DeleteDocumentRequest(id=doc.id), metadata=bearer(api_key))
    reply = await http.get(path(doc.id), headers=auth(api_key))
    assert reply.status_code == 404
    assert reply.json() == NOT_FOUND_BODY


async def test_a_document_without_its_object_is_404(http, db, storage, tenant, api_key):
    data = b"# gone\n"
    doc_id = stored_document(db, storage, tenant, data, "gone.md")
    storage.delete(object_key(doc_id, hashlib.sha256(data).hexdigest()))
    for method in ("GET", "HEAD"):
        reply = await http.request(method, path(doc_id), headers=auth(api_key))
        assert reply.status_code == 404, method


async def test_display_name_with_quotes_and_unicode(http, docs, api_key, assistant_id):
    name = 'Q3 "final" résumé; 报告 ✓ 100%\\x.pdf'
    data = b"%PDF-1.4 not really\n"
    doc = await upload(docs, api_key, assistant_id, name, data, content_type="application/pdf")
    reply = await http.get(path(doc.id), headers=auth(api_key))
    assert reply.status_code == 200 and reply.content == data
    assert reply.headers["content-type"] == "application/pdf"
    assert_safe_disposition(reply.headers["content-disposition"], name)


async def test_display_name_with_line_breaks_cannot_inject_headers(
    http, db, storage, tenant, api_key
):
    # Uploads reject control characters; a row written another way must still be harmless.
    name = 'evil"\r\nSet-Cookie: stolen=1\r\n\r\n<script>.md'
    doc_id = stored_document(db, storage, tenant, b"# hi\n", name)
    reply = await http.get(path(doc_id), headers=auth(api_key))
    assert reply.status_code == 200 and reply.content == b"# hi\n"
    assert "set-cookie" not in reply.headers
    assert_safe_disposition(reply.headers["content-disposition"], name)


def assert_safe_disposition(header: str, name: str) -> None:
    assert header.startswith('attachment; filename="')
    assert all(32 <= ord(c) < 127 for c in header), header
    fallback, _, encoded = header.partition("; filename*=UTF-8''")
    # Exactly two quotes in the fallback part: none of the name's quotes got through.
    assert fallback.count('"') == 2
    assert encoded and all(c.isalnum() or c in "%-._~" for c in encoded), encoded
    assert unquote(encoded, errors="strict") == name


@pytest.mark.parametrize(
    ("declared", "served"),
    [
        ("text/markdown", "text/markdown"),
        ("text/plain; charset=utf-8", "text/plain; charset=utf-8"),
        ("", "application/octet-stream"),
        ("text/html\r\nX-Evil: 1", "application/octet-stream"),
        ("not a type", "application/octet-stream"),
    ],
)
def test_media_type_is_echoed_only_when_well_formed(declared, served):
    assert media_type(declared) == served


def test_an_empty_name_still_gives_a_filename():
    assert content_disposition("") == "attachment; filename=\"download\"; filename*=UTF-8''download"


async def test_unknown_routes_and_methods_answer_json(http, api_key, document):
    doc, _ = document
    missing = await http.get("/v1/nothing", headers=auth(api_key))
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "NOT_FOUND"
    post = await http.post(path(doc.id), headers=auth(api_key))
    assert post.status_code == 405 and post.json()["error"]["code"] == "UNIMPLEMENTED"
    assert "GET" in post.headers["allow"]


async def test_storage_outage_is_503_without_internal_text(settings, api_key, document):
    doc, _ = document
    # Port 1 refuses connections: the store is down while Postgres still answers.
    down = settings.model_copy(update={"s3_endpoint": "http://127.0.0.1:1"})
    async with serve_http(down) as url, httpx.AsyncClient(base_url=url, timeout=60) as client:
        for method in ("GET", "HEAD"):
            reply = await client.request(method, path(doc.id), headers=auth(api_key))
            assert reply.status_code == 503, method
        body = (await client.get(path(doc.id), headers=auth(api_key))).json()
    assert body == {
        "error": {
            "code": "UNAVAILABLE",
            "message": "a service this download depends on is unavailable; retry",
        }
    }


async def test_an_outage_mid_body_cuts_the_connection_short(settings, api_key, document):
    doc, data = document
    async with (
        serve_http(settings, FailsAfterOnePiece) as url,
        httpx.AsyncClient(base_url=url, timeout=60) as client,
    ):
        received = bytearray()
        # The status is already 200; the client learns of the failure from the short body.
        with pytest.raises(httpx.RemoteProtocolError):
            async with client.stream("GET", path(doc.id), headers=auth(api_key)) as reply:
                assert reply.status_code == 200
                async for piece in reply.aiter_bytes():
                    received.extend(piece)
        assert 0 < len(received) < len(data)
        assert bytes(received) == data[: len(received)]
        # The server is fine afterwards.
        assert (await client.get("/healthz")).status_code == 200
