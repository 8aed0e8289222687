"""Ingestion under faults: hostile files, documented limits, and transient failures that heal.

Expected outcomes:
- every hostile file ends READY or FAILED (PERMANENT) with a message for the uploader, and
  ingest_document never raises for it;
- a document past max_chunks_per_document or the per-document time budget ends FAILED
  (PERMANENT) with a message naming the limit;
- a Markdown file of nothing but headings makes chunks in proportion to its size, not one per
  heading;
- a document FAILED for a transient reason goes back to PENDING through the reconciler only
  while its dependencies answer, at most reconcile_transient_retries times, and then reaches
  READY through a real worker.
"""

from __future__ import annotations

import io
import time
import uuid
import zipfile
from datetime import timedelta

import pytest
from sqlalchemy import update

from services.db.models import Document as DocumentRow
from services.db.models import utcnow
from services.documents.ingest import (
    FailureKind,
    IngestOptions,
    Outcome,
    ingest_document,
    mark_failed,
)
from services.documents.reconcile import Grace, reconcile
from services.retrieval.embeddings import create_embedder
from services.tasks import TaskClient, create_celery
from tests.support import stored_document


@pytest.fixture(scope="module")
def embedder():
    return create_embedder()


def zip_bomb() -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("[Content_Types].xml", "<Types/>")
        z.writestr("word/document.xml", b"<w:document>" + b"A" * 50_000_000 + b"</w:document>")
    return out.getvalue()


def nested_zip() -> bytes:
    inner = zip_bomb()
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for n in range(3):
            z.writestr(f"inner{n}.zip", inner)
    return out.getvalue()


def broken_xref_pdf() -> bytes:
    return (
        b"%PDF-1.4\n1 0 obj << /Type /Catalog /Pages 2 0 R >> endobj\n"
        b"2 0 obj << /Type /Pages /Kids [3 0 R] /Count 1 >> endobj\n"
        b"3 0 obj << /Type /Page /Parent 2 0 R /Contents 4 0 R >> endobj\n"
        b"4 0 obj << /Length 44 >> stream\nBT /F1 12 Tf 72 712 Td (Hello xref) Tj ET\nendstream\n"
        b"endobj\nxref\n0 5\n0000000000 65535 f \n0000000999 00000 n \ntrailer << /Size 5 "
        b"/Root 1 0 R >>\nstartxref\n99999\n%%EOF\n"
    )


HOSTILE_FILES: dict[str, tuple[bytes, str]] = {
    "zip-bomb.docx": (zip_bomb(), "application/vnd.openxmlformats-officedocument"),
    "nested-zips.zip": (nested_zip(), "application/zip"),
    "deep.html": (b"<div>" * 100_000 + b"deep text" + b"</div>" * 100_000, "text/html"),
    "unclosed.html": (b"<html><body>" + b"<p><b><i>" * 20_000 + b"text", "text/html"),
    "huge-line.txt": (b"word " * 40_000, "text/plain"),
    "no-spaces.txt": (b"x" * 150_000, "text/plain"),
    "broken-xref.pdf": (broken_xref_pdf(), "application/pdf"),
    "truncated.pdf": (b"%PDF-1.7\n1 0 obj << /Type /Catalog", "application/pdf"),
    "pdf-html-polyglot.pdf": (
        b"%PDF-1.4\n<html><body><script>alert(1)</script>hello</body></html>\n%%EOF",
        "application/pdf",
    ),
    "zip-as-markdown.md": (zip_bomb()[:4096], "text/markdown"),
    "nul-bytes.txt": (b"text\x00" * 2_000, "text/plain"),
    "invalid-utf8.md": (b"# Title\n\n\xff\xfe\xfd caf\xe9 \xc3\x28\n" * 100, "text/markdown"),
    "utf16-no-bom.txt": ("hello world ".encode("utf-16-le") * 500, "text/plain"),
    "control-chars.md": (bytes(range(32)) * 500, "text/markdown"),
    "only-whitespace.txt": (b" \n\t\r\n" * 10_000, "text/plain"),
    "heading-storm.md": (b"#\n" * 100_000, "text/markdown"),
    "deep-lists.md": (b"".join(b"  " * n + b"- item\n" for n in range(500)), "text/markdown"),
    "random.bin": (bytes((n * 7919) % 256 for n in range(20_000)), "application/octet-stream"),
    "empty-docx.docx": (b"PK\x05\x06" + b"\x00" * 18, "application/vnd.openxmlformats"),
}
LEAKS = ("Traceback", "Error(", 'File "')


def state_of(db, doc_id: str) -> DocumentRow:
    return db.transact(lambda s: s.get(DocumentRow, uuid.UUID(doc_id)))


@pytest.mark.parametrize("name", sorted(HOSTILE_FILES))
def test_hostile_files_end_ready_or_failed_for_good(db, storage, tenant, embedder, name):
    data, _ = HOSTILE_FILES[name]
    doc_id = stored_document(db, storage, tenant, data, name)
    # A low chunk limit keeps the suite fast: the hostile part is parsing and chunking, and a
    # file past the limit must end FAILED for good just the same.
    options = IngestOptions(max_bytes=64 * 1024 * 1024, time_budget_seconds=120, max_chunks=25)
    outcome = ingest_document(db, storage, embedder, doc_id, options)
    row = state_of(db, doc_id)
    assert outcome in (Outcome.READY, Outcome.FAILED)
    assert row.state == outcome.value
    if outcome is Outcome.FAILED:
        assert row.failure_kind == FailureKind.PERMANENT
        assert row.error and not any(leak in row.error for leak in LEAKS), row.error
    else:
        assert row.chunk_count > 0


def headings_only(count: int) -> bytes:
    return "".join(f"# Heading {n}\n\n" for n in range(count)).encode()


def test_a_file_of_headings_makes_chunks_in_proportion_to_its_size(db, storage, tenant, embedder):
    counts = []
    for headings in (500, 2_000):
        data = headings_only(headings)
        doc_id = stored_document(db, storage, tenant, data, "headings.md")
        assert ingest_document(db, storage, embedder, doc_id) is Outcome.READY
        row = state_of(db, doc_id)
        counts.append((len(data), row.chunk_count))
    (small_bytes, small_chunks), (big_bytes, big_chunks) = counts
    # Tiny sections merge up to the chunk size: about one chunk per chunk_chars of input.
    assert big_chunks <= big_bytes / 600 and small_chunks <= small_bytes / 600
    assert big_chunks < 2_000 / 10


def test_a_document_past_the_chunk_limit_fails_naming_it(db, storage, tenant, embedder):
    data = ("A sentence of text that fills the page. " * 2_000).encode()
    doc_id = stored_document(db, storage, tenant, data, "long.txt")
    outcome = ingest_document(db, storage, embedder, doc_id, IngestOptions(max_chunks=10))
    row = state_of(db, doc_id)
    assert outcome is Outcome.FAILED and row.failure_kind == FailureKind.PERMANENT
    assert "FOOTNOTE_MAX_CHUNKS_PER_DOCUMENT" in row.error and "10 chunks" in row.error


def test_a_document_past_the_time_budget_fails_naming_it(db, storage, tenant, embedder):
    data = ("Text to embed, sentence after sentence. " * 3_000).encode()
    doc_id = stored_document(db, storage, tenant, data, "slow.txt")
    options = IngestOptions(time_budget_seconds=0.000_001)
    outcome = ingest_document(db, storage, embedder, doc_id, options)
    row = state_of(db, doc_id)
    assert outcome is Outcome.FAILED and row.failure_kind == FailureKind.PERMANENT
    assert "FOOTNOTE_INGEST_TIME_BUDGET_SECONDS" in row.error


def fail_transiently(db, doc_id: str, attempts: int = 0) -> None:
    mark_failed(db, doc_id, "temporary failure: S3 was down", FailureKind.TRANSIENT)
    db.transact(
        lambda s: s.execute(
            update(DocumentRow)
            .where(DocumentRow.id == uuid.UUID(doc_id))
            .values(reconcile_attempts=attempts, update_time=utcnow() - timedelta(seconds=1))
        )
    )


def test_transient_failures_are_retried_once_dependencies_answer(
    db, storage, settings, tenant, worker
):
    doc_id = stored_document(db, storage, tenant, b"# Notes\n\nThe outage is over.\n", "n.md")
    exhausted = stored_document(db, storage, tenant, b"# Notes\n\nGiven up.\n", "m.md")
    fail_transiently(db, doc_id)
    fail_transiently(db, exhausted, attempts=2)
    grace = Grace(transient_retries=2, transient_backoff=timedelta(0))
    tasks = TaskClient(create_celery(settings))
    try:
        down = reconcile(db, tasks, grace, ready=lambda: False)
        assert doc_id not in (down.retried or [])
        assert state_of(db, doc_id).state == "FAILED"

        up = reconcile(db, tasks, grace, ready=lambda: True)
        assert doc_id in (up.retried or []) and exhausted not in (up.retried or [])
    finally:
        tasks.close()
    deadline = time.monotonic() + 120
    while (row := state_of(db, doc_id)).state not in ("READY", "FAILED"):
        assert time.monotonic() < deadline, "the retried document never finished"
        time.sleep(0.2)
    assert row.state == "READY", row.error
    assert row.reconcile_attempts == 1 and row.failure_kind is None
    left = state_of(db, exhausted)
    assert left.state == "FAILED" and left.failure_kind == FailureKind.TRANSIENT
