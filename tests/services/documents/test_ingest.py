"""The ingestion domain function, run directly against the real Postgres and S3."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from sqlalchemy import select, update

from services.db.models import Chunk, utcnow
from services.db.models import Document as DocumentRow
from services.documents.ingest import IngestOptions, Outcome, ingest_document
from services.retrieval.embeddings import create_embedder
from tests.support import stored_document

FIXTURES = Path(__file__).parents[2] / "fixtures" / "documents"


@pytest.fixture(scope="module")
def embedder():
    return create_embedder()


def chunk_rows(db, doc_id: str) -> list[tuple]:
    return db.transact(
        lambda s: [
            (c.chunk_index, c.text, c.start_offset, c.end_offset, tuple(c.heading_path))
            for c in s.scalars(
                select(Chunk)
                .where(Chunk.document_id == uuid.UUID(doc_id))
                .order_by(Chunk.chunk_index)
            )
        ]
    )


def test_ingesting_twice_yields_the_same_chunks(db, storage, embedder, tenant):
    doc_id = stored_document(
        db, storage, tenant, (FIXTURES / "handbook.md").read_bytes(), "handbook.md"
    )
    assert ingest_document(db, storage, embedder, doc_id) == Outcome.READY
    first = chunk_rows(db, doc_id)
    assert first

    # A duplicate task for a READY document is a no-op.
    assert ingest_document(db, storage, embedder, doc_id) == Outcome.SKIPPED
    assert chunk_rows(db, doc_id) == first

    # A forced re-run (as after a lost lease) replaces the chunks instead of adding to them.
    db.transact(
        lambda s: s.execute(
            update(DocumentRow)
            .where(DocumentRow.id == uuid.UUID(doc_id))
            .values(state="PENDING", enqueue_time=utcnow())
        )
    )
    assert ingest_document(db, storage, embedder, doc_id) == Outcome.READY
    assert chunk_rows(db, doc_id) == first


def test_a_held_lease_keeps_a_second_worker_out(db, storage, embedder, tenant):
    doc_id = stored_document(db, storage, tenant, b"# T\n\nSome text here.\n", "t.md")
    options = IngestOptions(lease_seconds=60)
    from datetime import timedelta

    from services.documents.ingest import claim

    db.transact(lambda s: claim(s, uuid.UUID(doc_id), timedelta(seconds=60)))
    assert ingest_document(db, storage, embedder, doc_id, options) == Outcome.SKIPPED
    assert chunk_rows(db, doc_id) == []
