"""Removal of a deleted document's object and row, after its chunks are already gone."""

from __future__ import annotations

import uuid

from sqlalchemy import delete, select

from services.db.models import Document as DocumentRow
from services.db.session import Database
from services.storage import Storage


def purge_document(db: Database, storage: Storage, document_id: str) -> bool:
    """Deletes the object, then the row; True if there was anything to purge."""
    doc_id = uuid.UUID(document_id)
    key = db.transact(
        lambda s: s.scalar(
            select(DocumentRow.object_key).where(
                DocumentRow.id == doc_id, DocumentRow.delete_time.is_not(None)
            )
        )
    )
    if key is None:
        return False
    storage.delete(key)  # S3 answers success for a key that is already gone
    db.transact(lambda s: s.execute(delete(DocumentRow).where(DocumentRow.id == doc_id)))
    return True
