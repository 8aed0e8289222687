"""The version of an assistant's READY documents (migration 0009), which a copy of its vectors
held in memory is checked against on every search: it must change with every change to the set,
at the commit of that change, and not with work on documents still processing."""

from __future__ import annotations

import uuid
from datetime import timedelta

from sqlalchemy import delete, text

from services.assistants.domain import create_assistant, delete_assistant
from services.db.models import Document as DocumentRow
from services.documents.domain import insert_document, mark_deleted
from services.documents.ingest import claim, extend_lease, write_chunks
from services.retrieval.vector_memory import DIGEST


def version(db, assistant_id: str) -> int:
    row = db.read(lambda s: s.execute(text(DIGEST), {"assistant": uuid.UUID(assistant_id)}).one())
    return row.digest


def new_document(db, tenant: str, assistant_id: str) -> uuid.UUID:
    document_id = uuid.uuid4()
    db.transact(
        lambda s: insert_document(
            s,
            document_id=document_id,
            tenant_id=tenant,
            assistant_id=assistant_id,
            display_name="notes.txt",
            content_type="text/plain",
            size_bytes=5,
            sha256="0" * 64,
            object_key=f"objects/{document_id}",
            request_id="",
        )
    )
    return document_id


def test_the_version_follows_the_ready_documents_and_nothing_else(db) -> None:
    tenant = "versions-" + uuid.uuid4().hex[:6]
    assistant = db.transact(lambda s: create_assistant(s, tenant, "Versions", {})).id
    other = db.transact(lambda s: create_assistant(s, tenant, "Other", {})).id
    assert version(db, assistant) == 0

    document = new_document(db, tenant, assistant)
    assert version(db, assistant) == 0  # PENDING: not searched yet
    assert db.transact(lambda s: claim(s, document, timedelta(minutes=5))) is not None
    db.transact(lambda s: extend_lease(s, document, timedelta(minutes=5)))
    assert version(db, assistant) == 0  # processing, and its lease renewed

    assert db.transact(lambda s: write_chunks(s, document, "0" * 64, [], [], "text/plain", 0))
    assert version(db, assistant) == 1  # READY
    db.transact(lambda s: mark_deleted(s, tenant, str(document)))
    assert version(db, assistant) == 2  # deleted
    db.transact(lambda s: s.execute(delete(DocumentRow).where(DocumentRow.id == document)))
    assert version(db, assistant) == 2  # its row purged: it was out of the set already
    assert version(db, other) == 0

    ready = new_document(db, tenant, other)
    db.transact(lambda s: claim(s, ready, timedelta(minutes=5)))
    db.transact(lambda s: write_chunks(s, ready, "0" * 64, [], [], "text/plain", 0))
    assert version(db, other) == 1
    # An assistant's deletion cascades to its documents: the trigger must not fail on it.
    db.transact(lambda s: delete_assistant(s, tenant, other))
    assert version(db, other) == 2


def test_the_version_is_bumped_at_commit_without_holding_up_other_documents(db) -> None:
    tenant = "versions-" + uuid.uuid4().hex[:6]
    assistant = db.transact(lambda s: create_assistant(s, tenant, "Versions", {})).id
    first, second = new_document(db, tenant, assistant), new_document(db, tenant, assistant)
    for document in (first, second):
        db.transact(lambda s, d=document: claim(s, d, timedelta(minutes=5)))

    def second_ready(s) -> None:
        # Were the version bumped when the first document's row changed, this would wait for
        # the first transaction, which waits for this one: the lock timeout would end it.
        s.execute(text("SET LOCAL lock_timeout = '2s'"))
        assert write_chunks(s, second, "0" * 64, [], [], "text/plain", 0)

    def first_ready(s) -> int:
        assert write_chunks(s, first, "0" * 64, [], [], "text/plain", 0)
        s.flush()  # the first document is READY in this transaction, its chunks written
        db.transact(second_ready)
        return version(db, assistant)

    assert db.transact(first_ready) == 1  # the second's commit
    assert version(db, assistant) == 2  # and the first's
