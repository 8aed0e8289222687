"""Ingestion of one document: claim it, parse, chunk, embed, and index its chunks in one go.

The document's state machine lives in SQL. A worker claims a document by taking a lease on
it, keeps the lease alive while it works, and writes the chunks and READY in one transaction
that replaces any earlier chunks, so running it twice changes nothing. A lease that runs out
(the worker was killed) lets the reconciler hand the document to another worker.
"""

from __future__ import annotations

import logging
import re
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum
from pathlib import PurePosixPath

from sqlalchemy import delete, or_, select, update
from sqlalchemy.exc import OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.orm import Session

from services.db.models import Chunk as ChunkRow
from services.db.models import Document as DocumentRow
from services.db.models import utcnow
from services.db.session import Database
from services.documents.chunking import Chunk, chunk
from services.documents.domain import DocumentState
from services.documents.parsing import DocumentParseError, ExtractedText, ParseLimits, parse
from services.observability.worker_metrics import ingest_stage
from services.retrieval.embeddings import Embedder, EmbeddingUnavailable
from services.storage import ObjectMissing, Storage, StorageUnavailable

log = logging.getLogger(__name__)

# Failures that a later attempt may not meet: the task retries these with backoff.
TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    StorageUnavailable,
    EmbeddingUnavailable,
    OperationalError,
    PoolTimeout,
)


@dataclass(frozen=True)
class IngestOptions:
    lease_seconds: float = 60.0
    max_bytes: int = 100 * 1024 * 1024
    chunk_chars: int = 1200
    overlap_chars: int = 200


class Outcome(StrEnum):
    READY = "READY"
    FAILED = "FAILED"
    SKIPPED = "SKIPPED"


def claim(s: Session, document_id: uuid.UUID, lease: timedelta) -> DocumentRow | None:
    """Takes the lease on a document that waits or whose lease ran out; None if not ours to do."""
    now = utcnow()
    row = s.scalar(
        select(DocumentRow)
        .where(
            DocumentRow.id == document_id,
            DocumentRow.delete_time.is_(None),
            DocumentRow.state.in_([DocumentState.PENDING.value, DocumentState.PROCESSING.value]),
            or_(DocumentRow.lease_until.is_(None), DocumentRow.lease_until < now),
        )
        .with_for_update(skip_locked=True)
    )
    if row is None:
        return None
    row.state = DocumentState.PROCESSING.value
    row.lease_until = now + lease
    row.attempts += 1
    row.update_time = now
    return row


def extend_lease(s: Session, document_id: uuid.UUID, lease: timedelta) -> None:
    s.execute(
        update(DocumentRow)
        .where(DocumentRow.id == document_id, DocumentRow.state == DocumentState.PROCESSING.value)
        .values(lease_until=utcnow() + lease)
    )


def release(db: Database, document_id: str, retry_in: float) -> None:
    """Shortens the lease to when the retry is due, so the retry (and only it) can claim then.

    If the retry message is lost, the lease simply runs out and the reconciler re-sends it.
    """
    db.transact(
        lambda s: s.execute(
            update(DocumentRow)
            .where(
                DocumentRow.id == uuid.UUID(document_id),
                DocumentRow.state == DocumentState.PROCESSING.value,
            )
            .values(lease_until=utcnow() + timedelta(seconds=retry_in), enqueue_time=utcnow())
        )
    )


def mark_failed(db: Database, document_id: str, message: str) -> None:
    def write(s: Session) -> None:
        now = utcnow()
        s.execute(
            update(DocumentRow)
            .where(
                DocumentRow.id == uuid.UUID(document_id),
                DocumentRow.state.in_(
                    [DocumentState.PENDING.value, DocumentState.PROCESSING.value]
                ),
            )
            .values(
                state=DocumentState.FAILED.value, error=message, lease_until=None, update_time=now
            )
        )

    db.transact(write)


@contextmanager
def kept_alive(db: Database, document_id: uuid.UUID, lease: timedelta) -> Iterator[None]:
    """Renews the lease in the background while the block runs."""
    done = threading.Event()

    def renew() -> None:
        while not done.wait(lease.total_seconds() / 3):
            try:
                db.transact(lambda s: extend_lease(s, document_id, lease))
            except Exception:  # a missed renewal only risks a harmless rerun
                log.warning("could not renew the lease on document %s", document_id)

    thread = threading.Thread(target=renew, name=f"lease-{document_id}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


# A title longer than this is a sentence, not a title.
MAX_TITLE_CHARS = 120
_NAME_SEPARATORS = re.compile(r"[\s_\-]+|\.(?!\d)|(?<!\d)\.")


def document_title(extracted: ExtractedText, display_name: str) -> str:
    """What the document is called: its file name without the extension, and its first line
    when that is short enough to be a title (a heading at the very start counts as one)."""
    stem = _NAME_SEPARATORS.sub(" ", PurePosixPath(display_name).stem).strip()
    first = next((h.title for h in extracted.headings if h.offset == 0), "")
    if not first:
        line = extracted.text.lstrip()[: MAX_TITLE_CHARS + 1].split("\n", 1)[0]
        line = " ".join(line.lstrip("#").split())
        first = line if len(line) <= MAX_TITLE_CHARS else ""
    if first and first.casefold() != stem.casefold():
        return f"{stem}: {first}" if stem else first
    return stem or first


def chunk_context(piece: Chunk, title: str) -> str:
    """The chunk's place: the document's title, then its heading path."""
    return " > ".join(part for part in (title, *piece.heading_path) if part)


def embedding_input(piece: Chunk, title: str = "") -> str:
    # Only the first chunk of a section contains its heading; the path gives the rest context,
    # and the title tells which document the passage is from.
    context = chunk_context(piece, title)
    return f"{context}\n{piece.text}" if context else piece.text


def write_chunks(
    s: Session,
    document_id: uuid.UUID,
    sha256: str,
    pieces: list[Chunk],
    vectors: list[list[float]],
    content_type: str,
    page_count: int,
    title: str = "",
) -> bool:
    """Replaces the document's chunks and marks it READY; False if it changed meanwhile."""
    row = s.scalar(select(DocumentRow).where(DocumentRow.id == document_id).with_for_update())
    if row is None or row.delete_time is not None or row.sha256 != sha256:
        return False
    if row.state != DocumentState.PROCESSING.value:
        return False
    s.execute(delete(ChunkRow).where(ChunkRow.document_id == document_id))
    s.add_all(
        ChunkRow(
            document_id=document_id,
            tenant_id=row.tenant_id,
            assistant_id=row.assistant_id,
            chunk_index=p.index,
            text=p.text,
            start_offset=p.start_offset,
            end_offset=p.end_offset,
            start_byte=p.start_byte,
            end_byte=p.end_byte,
            start_line=p.start_line,
            end_line=p.end_line,
            page_start=p.page_start,
            page_end=p.page_end,
            heading_path=list(p.heading_path),
            context=chunk_context(p, title),
            paragraph_start=p.paragraph_start,
            paragraph_end=p.paragraph_end,
            embedding=v,
        )
        for p, v in zip(pieces, vectors, strict=True)
    )
    now = utcnow()
    row.state = DocumentState.READY.value
    row.error = ""
    row.chunk_count = len(pieces)
    row.page_count = page_count
    row.content_type = content_type
    row.lease_until = None
    row.indexed_time = now
    row.update_time = now
    return True


def ingest_document(
    db: Database,
    storage: Storage,
    embedder: Embedder,
    document_id: str,
    options: IngestOptions = IngestOptions(),
) -> Outcome:
    """Runs the whole ingestion of one document; transient errors propagate for a retry."""
    doc_id = uuid.UUID(document_id)
    lease = timedelta(seconds=options.lease_seconds)

    def take(s: Session) -> tuple[str, str, str, str] | None:
        row = claim(s, doc_id, lease)
        return (
            None
            if row is None
            else (row.object_key, row.sha256, row.content_type, row.display_name)
        )

    with ingest_stage("claim"):
        claimed = db.transact(take)
    if claimed is None:
        log.info("document %s is not waiting for ingestion; nothing to do", document_id)
        return Outcome.SKIPPED
    object_key, sha256, declared_type, name = claimed
    with kept_alive(db, doc_id, lease):
        try:
            with ingest_stage("download"):
                data = storage.read(object_key, limit=options.max_bytes)
        except ObjectMissing:
            mark_failed(
                db, document_id, "the uploaded file is missing from storage; upload it again"
            )
            return Outcome.FAILED
        try:
            with ingest_stage("parse"):
                extracted = parse(
                    data, declared_type, name, limits=ParseLimits(max_input_bytes=options.max_bytes)
                )
            with ingest_stage("chunk"):
                pieces = chunk(
                    extracted, max_chars=options.chunk_chars, overlap_chars=options.overlap_chars
                )
        except DocumentParseError as err:
            mark_failed(db, document_id, err.message)
            return Outcome.FAILED
        if not pieces:
            mark_failed(db, document_id, "the document contains no text to index")
            return Outcome.FAILED
        title = document_title(extracted, name)
        with ingest_stage("embed"):
            vectors = embedder.embed_documents([embedding_input(p, title) for p in pieces])
        with ingest_stage("index"):
            written = db.transact(
                lambda s: write_chunks(
                    s,
                    doc_id,
                    sha256,
                    pieces,
                    vectors,
                    extracted.kind.content_type,
                    extracted.page_count or 0,
                    title,
                )
            )
    if not written:
        log.info("document %s changed or was deleted during ingestion; dropped", document_id)
        return Outcome.SKIPPED
    log.info("document %s is READY with %d chunks", document_id, len(pieces))
    return Outcome.READY
