"""Document records: creation, lookup, listing and deletion in SQL, scoped to one tenant."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from sqlalchemy import delete, select, tuple_
from sqlalchemy.orm import Session

from services.assistants.domain import find_row as find_assistant
from services.db.models import Chunk, utcnow
from services.db.models import Document as DocumentRow
from services.errors import InvalidArgument, NotFound
from services.fields import has_control
from services.ids import parse_id
from services.pagination import decode_position, page_size, position_token

MAX_NAME_CHARS = 255


class DocumentState(StrEnum):
    PENDING = "PENDING"
    PROCESSING = "PROCESSING"
    READY = "READY"
    FAILED = "FAILED"

    @property
    def final(self) -> bool:
        return self in (DocumentState.READY, DocumentState.FAILED)


@dataclass(frozen=True)
class DocumentRecord:
    id: str
    assistant_id: str
    display_name: str
    content_type: str
    size_bytes: int
    sha256: str
    state: DocumentState
    error: str
    chunk_count: int
    page_count: int
    create_time: datetime
    update_time: datetime
    indexed_time: datetime | None
    object_key: str


def to_record(row: DocumentRow) -> DocumentRecord:
    return DocumentRecord(
        id=str(row.id),
        assistant_id=str(row.assistant_id),
        display_name=row.display_name,
        content_type=row.content_type,
        size_bytes=row.size_bytes,
        sha256=row.sha256,
        state=DocumentState(row.state),
        error=row.error,
        chunk_count=row.chunk_count,
        page_count=row.page_count,
        create_time=row.create_time,
        update_time=row.update_time,
        indexed_time=row.indexed_time,
        object_key=row.object_key,
    )


def validate_display_name(name: str) -> str:
    stripped = name.strip()
    if not stripped:
        raise InvalidArgument("metadata.display_name", "display_name must not be empty")
    if len(stripped) > MAX_NAME_CHARS or has_control(stripped):
        raise InvalidArgument(
            "metadata.display_name",
            f"display_name must be at most {MAX_NAME_CHARS} characters, without control characters",
        )
    return stripped


def find_row(s: Session, tenant_id: str, document_id: str, field: str = "id") -> DocumentRow:
    """The tenant's live document, or NOT_FOUND exactly as for a missing or deleted one."""
    row = s.scalar(
        select(DocumentRow).where(
            DocumentRow.id == parse_id(document_id, field),
            DocumentRow.tenant_id == tenant_id,
            DocumentRow.delete_time.is_(None),
        )
    )
    if row is None:
        raise NotFound("document", document_id)
    return row


def check_assistant(s: Session, tenant_id: str, assistant_id: str) -> None:
    find_assistant(s, tenant_id, assistant_id, field="metadata.assistant_id")


def find_by_request_id(s: Session, tenant_id: str, request_id: str) -> DocumentRecord | None:
    row = s.scalar(
        select(DocumentRow).where(
            DocumentRow.tenant_id == tenant_id,
            DocumentRow.request_id == request_id,
            DocumentRow.delete_time.is_(None),
        )
    )
    return None if row is None else to_record(row)


def insert_document(
    s: Session,
    *,
    document_id: uuid.UUID,
    tenant_id: str,
    assistant_id: str,
    display_name: str,
    content_type: str,
    size_bytes: int,
    sha256: str,
    object_key: str,
    request_id: str,
) -> DocumentRecord:
    check_assistant(s, tenant_id, assistant_id)
    now = utcnow()
    row = DocumentRow(
        id=document_id,
        tenant_id=tenant_id,
        assistant_id=uuid.UUID(assistant_id),
        display_name=display_name,
        content_type=content_type,
        size_bytes=size_bytes,
        sha256=sha256,
        object_key=object_key,
        state=DocumentState.PENDING.value,
        error="",
        chunk_count=0,
        page_count=0,
        request_id=request_id or None,
        attempts=0,
        create_time=now,
        update_time=now,
        enqueue_time=now,
    )
    s.add(row)
    s.flush()
    return to_record(row)


def get_document(s: Session, tenant_id: str, document_id: str, field: str = "id") -> DocumentRecord:
    return to_record(find_row(s, tenant_id, document_id, field))


def list_documents(
    s: Session,
    tenant_id: str,
    requested_size: int,
    token: str,
    assistant_id: str = "",
    state: DocumentState | None = None,
) -> tuple[list[DocumentRecord], str]:
    size = page_size(requested_size)
    # The filters are part of the token, so a token cannot be replayed against another list.
    kind = f"documents:{assistant_id}:{state or ''}"
    after = decode_position(token, kind)
    query = select(DocumentRow).where(
        DocumentRow.tenant_id == tenant_id, DocumentRow.delete_time.is_(None)
    )
    if assistant_id:
        query = query.where(DocumentRow.assistant_id == parse_id(assistant_id, "assistant_id"))
    if state is not None:
        query = query.where(DocumentRow.state == state.value)
    if after is not None:
        query = query.where(tuple_(DocumentRow.create_time, DocumentRow.id) > after)
    rows = s.scalars(query.order_by(DocumentRow.create_time, DocumentRow.id).limit(size + 1)).all()
    next_token = ""
    if len(rows) > size:
        rows = rows[:size]
        next_token = position_token(kind, rows[-1].create_time, rows[-1].id)
    return [to_record(r) for r in rows], next_token


def mark_deleted(s: Session, tenant_id: str, document_id: str) -> DocumentRecord:
    """Hides the document and drops its chunks in one transaction, so search stops at once."""
    row = find_row(s, tenant_id, document_id)
    s.execute(delete(Chunk).where(Chunk.document_id == row.id))
    now = utcnow()
    row.delete_time = now
    row.update_time = now
    # The request_id is free again: a later upload reusing it is a new document.
    row.request_id = None
    row.enqueue_time = now
    row.chunk_count = 0
    s.flush()
    return to_record(row)
