"""Ingestion of one document: claim it, parse, chunk, embed, and index its chunks in one go.

The document's state machine lives in SQL. A worker claims a document by taking a lease on
it, keeps the lease alive while it works, and writes the chunks and READY in one transaction
that replaces any earlier chunks, so running it twice changes nothing. A lease that runs out
(the worker was killed) lets the reconciler hand the document to another worker.

The lease names its holder (host, pid and task id) and is renewed every few seconds, so a
killed attempt is taken over at once instead of after the lease: by the redelivery of the
same task, by any attempt on the same host once the holder's process is gone, and by any
attempt anywhere once the holder missed three renewals. Failures are recorded as TRANSIENT (a
dependency was down: the reconciler retries once it is back) or PERMANENT (the file itself,
or a documented limit: upload a different file).
"""

from __future__ import annotations

import logging
import os
import re
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from pathlib import PurePosixPath

from kombu.exceptions import OperationalError as BrokerError
from sqlalchemy import delete, select, update
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.orm import Session

from services.db.models import Chunk as ChunkRow
from services.db.models import Document as DocumentRow
from services.db.models import utcnow
from services.db.session import Database
from services.documents.chunking import Chunk, chunk
from services.documents.domain import DocumentState
from services.documents.parsing import DocumentParseError, ExtractedText, ParseLimits, parse
from services.documents.sections import merge_tiny_sections
from services.observability.worker_metrics import ingest_stage
from services.retrieval.embeddings import Embedder, EmbeddingUnavailable
from services.storage import ObjectMissing, Storage, StorageUnavailable

log = logging.getLogger(__name__)

# Failures that a later attempt may not meet: the task retries these with backoff.
TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    StorageUnavailable,
    EmbeddingUnavailable,
    OperationalError,
    InterfaceError,
    PoolTimeout,
    BrokerError,
    ConnectionError,
)

# The lease is renewed this often at most; three missed renewals mean the holder is gone.
HEARTBEAT_SECONDS = 5.0
MISSED_HEARTBEATS = 3
EMBED_BATCH = 64


class FailureKind(StrEnum):
    TRANSIENT = "TRANSIENT"
    PERMANENT = "PERMANENT"


def is_transient(exc: BaseException) -> bool:
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return True
    return isinstance(exc, TRANSIENT_ERRORS)


@dataclass(frozen=True)
class IngestOptions:
    lease_seconds: float = 60.0
    max_bytes: int = 100 * 1024 * 1024
    chunk_chars: int = 1200
    overlap_chars: int = 200
    # Past either limit the document ends FAILED (permanent) with a message naming it.
    max_chunks: int = 10_000
    time_budget_seconds: float = 600.0

    @property
    def heartbeat_seconds(self) -> float:
        return min(self.lease_seconds / 3, HEARTBEAT_SECONDS)


class LimitExceeded(Exception):
    """A document past a documented ingestion limit; `message` names the limit."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True)
class Holder:
    """Who runs an attempt: written into the lease so that others can tell it died."""

    host: str
    pid: int
    task_id: str = ""
    redelivered: bool = False

    @classmethod
    def current(cls, task_id: str = "", redelivered: bool = False) -> Holder:
        return cls(socket.gethostname(), os.getpid(), task_id, redelivered)

    def encode(self) -> str:
        return f"{self.host}:{self.pid}:{self.task_id}"[:255]

    @classmethod
    def decode(cls, value: str | None) -> Holder | None:
        if not value:
            return None
        host, _, rest = value.partition(":")
        pid, _, task_id = rest.partition(":")
        try:
            return cls(host, int(pid), task_id)
        except ValueError:
            return None


def process_gone(pid: int) -> bool:
    """True if no process runs with this pid here (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            # The state follows the command name, which is in parentheses and may hold spaces.
            return f.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except FileNotFoundError:
        return True
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False


def holder_gone(holder_text: str | None, me: Holder | None = None) -> bool:
    """Whether the attempt named in a lease is known to be dead, without waiting for the lease.

    The same task id, redelivered, means the broker gave it back because its attempt died;
    a holder on this host whose process is gone is dead too. Other hosts are judged by their
    heartbeat (see abandoned_before).
    """
    holder = Holder.decode(holder_text)
    if holder is None:
        return False
    if me is not None and me.redelivered and holder.task_id and holder.task_id == me.task_id:
        return True
    if holder.host != socket.gethostname():
        return False
    if me is not None and holder.pid == me.pid and holder.task_id == me.task_id:
        return False
    return process_gone(holder.pid)


def abandoned_before(lease: timedelta, heartbeat: float) -> datetime:
    """Leases ending before this moment missed MISSED_HEARTBEATS renewals: their holder died."""
    return utcnow() + lease - timedelta(seconds=heartbeat * MISSED_HEARTBEATS)


class Outcome(StrEnum):
    READY = "READY"
    FAILED = "FAILED"
    SKIPPED = "SKIPPED"


def claim(
    s: Session,
    document_id: uuid.UUID,
    lease: timedelta,
    holder: Holder | None = None,
    heartbeat: float = HEARTBEAT_SECONDS,
) -> DocumentRow | None:
    """Takes the lease on a document that waits, or whose holder died; None if not ours to do."""
    now = utcnow()
    row = s.scalar(
        select(DocumentRow)
        .where(
            DocumentRow.id == document_id,
            DocumentRow.delete_time.is_(None),
            DocumentRow.state.in_([DocumentState.PENDING.value, DocumentState.PROCESSING.value]),
        )
        .with_for_update(skip_locked=True)
    )
    if row is None:
        return None
    held = row.state == DocumentState.PROCESSING.value and row.lease_until is not None
    if held and row.lease_until is not None and row.lease_until >= now:
        # A lease without a holder was handed to a scheduled retry: only running out ends it.
        stale = row.lease_holder is not None and row.lease_until < abandoned_before(
            lease, heartbeat
        )
        if not (stale or holder_gone(row.lease_holder, holder)):
            return None
        log.info("document %s: taking over from %s, which is gone", row.id, row.lease_holder)
    row.state = DocumentState.PROCESSING.value
    row.lease_until = now + lease
    row.lease_holder = holder.encode() if holder is not None else None
    row.attempts += 1
    row.update_time = now
    return row


def extend_lease(
    s: Session, document_id: uuid.UUID, lease: timedelta, holder: Holder | None = None
) -> None:
    """Renews the lease, unless another attempt took the document over."""
    query = update(DocumentRow).where(
        DocumentRow.id == document_id, DocumentRow.state == DocumentState.PROCESSING.value
    )
    if holder is not None:
        query = query.where(DocumentRow.lease_holder == holder.encode())
    s.execute(query.values(lease_until=utcnow() + lease))


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
            .values(
                lease_until=utcnow() + timedelta(seconds=retry_in),
                lease_holder=None,
                enqueue_time=utcnow(),
            )
        )
    )


def mark_failed(
    db: Database, document_id: str, message: str, kind: FailureKind = FailureKind.PERMANENT
) -> None:
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
                state=DocumentState.FAILED.value,
                error=message,
                failure_kind=kind.value,
                lease_until=None,
                lease_holder=None,
                update_time=now,
            )
        )

    db.transact(write)


@contextmanager
def kept_alive(
    db: Database,
    document_id: uuid.UUID,
    lease: timedelta,
    holder: Holder | None = None,
    every: float = HEARTBEAT_SECONDS,
) -> Iterator[None]:
    """Renews the lease in the background while the block runs: the holder's heartbeat."""
    done = threading.Event()

    def renew() -> None:
        while not done.wait(every):
            try:
                db.transact(lambda s: extend_lease(s, document_id, lease, holder))
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
            line_marks=list(p.line_marks) or None,
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
    row.lease_holder = None
    row.failure_kind = None
    row.indexed_time = now
    row.update_time = now
    return True


def check_chunk_count(pieces: list[Chunk], options: IngestOptions) -> None:
    if len(pieces) > options.max_chunks:
        raise LimitExceeded(
            f"the document makes {len(pieces):,} chunks, more than the limit of "
            f"{options.max_chunks:,} chunks per document (FOOTNOTE_MAX_CHUNKS_PER_DOCUMENT); "
            "split it into smaller files"
        )


class Deadline:
    """The per-document time budget, checked between the steps of an ingestion."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.end = time.monotonic() + seconds

    @property
    def remaining(self) -> float:
        return max(0.0, self.end - time.monotonic())

    def check(self, step: str) -> None:
        if time.monotonic() > self.end:
            raise LimitExceeded(
                f"ingestion took longer than the per-document budget of {self.seconds:.0f}s "
                f"(FOOTNOTE_INGEST_TIME_BUDGET_SECONDS) while {step}; split the file into "
                "smaller ones"
            )


def embed_within(
    embedder: Embedder, pieces: list[Chunk], title: str, deadline: Deadline
) -> list[list[float]]:
    """Embeds in batches, so that memory stays bounded and the budget is checked between them."""
    vectors: list[list[float]] = []
    for start in range(0, len(pieces), EMBED_BATCH):
        deadline.check("embedding")
        batch = pieces[start : start + EMBED_BATCH]
        vectors.extend(embedder.embed_documents([embedding_input(p, title) for p in batch]))
    return vectors


def ingest_document(
    db: Database,
    storage: Storage,
    embedder: Embedder,
    document_id: str,
    options: IngestOptions = IngestOptions(),
    holder: Holder | None = None,
) -> Outcome:
    """Runs the whole ingestion of one document; transient errors propagate for a retry."""
    doc_id = uuid.UUID(document_id)
    lease = timedelta(seconds=options.lease_seconds)
    holder = holder or Holder.current()

    def take(s: Session) -> tuple[str, str, str, str] | None:
        row = claim(s, doc_id, lease, holder, options.heartbeat_seconds)
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
    deadline = Deadline(options.time_budget_seconds)
    with kept_alive(db, doc_id, lease, holder, options.heartbeat_seconds):
        try:
            with ingest_stage("download"):
                data = storage.read(object_key, limit=options.max_bytes)
        except ObjectMissing:
            mark_failed(
                db, document_id, "the uploaded file is missing from storage; upload it again"
            )
            return Outcome.FAILED
        try:
            limits = ParseLimits(
                max_input_bytes=options.max_bytes,
                max_seconds=min(ParseLimits().max_seconds, max(1.0, deadline.remaining)),
            )
            with ingest_stage("parse"):
                extracted = merge_tiny_sections(
                    parse(data, declared_type, name, limits=limits), options.chunk_chars
                )
            del data
            deadline.check("parsing")
            with ingest_stage("chunk"):
                pieces = chunk(
                    extracted, max_chars=options.chunk_chars, overlap_chars=options.overlap_chars
                )
            check_chunk_count(pieces, options)
            deadline.check("chunking")
            if not pieces:
                mark_failed(db, document_id, "the document contains no text to index")
                return Outcome.FAILED
            title = document_title(extracted, name)
            with ingest_stage("embed"):
                vectors = embed_within(embedder, pieces, title, deadline)
        except DocumentParseError as err:
            mark_failed(db, document_id, err.message)
            return Outcome.FAILED
        except LimitExceeded as err:
            log.warning("document %s is past a limit: %s", document_id, err.message)
            mark_failed(db, document_id, err.message)
            return Outcome.FAILED
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
