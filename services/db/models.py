"""SQLAlchemy 2.0 models for everything Footnote keeps in SQL."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from pgvector.sqlalchemy import Vector
from sqlalchemy import (
    BigInteger,
    Boolean,
    Computed,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    func,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, TSVECTOR
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# The local embedding model's dimension; a server model must be configured to match it,
# because the HNSW index needs one fixed dimension.
EMBEDDING_DIM = 384

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def utcnow() -> datetime:
    return datetime.now(UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class ApiKey(Base):
    """An API key, stored only as a SHA-256 of the secret; the key names its tenant."""

    __tablename__ = "api_keys"

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    tenant_id: Mapped[str] = mapped_column(String(128), index=True)
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(32))
    name: Mapped[str] = mapped_column(String(200), default="")
    create_time: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), default=utcnow, server_default=func.now()
    )
    revoke_time: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class Assistant(Base):
    """An assistant and its settings, one column per setting so SQL can read them."""

    __tablename__ = "assistants"
    __table_args__ = (
        UniqueConstraint("tenant_id", "request_id"),
        Index("ix_assistants_tenant_id_create_time_id", "tenant_id", "create_time", "id"),
    )

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    tenant_id: Mapped[str] = mapped_column(String(128), index=True)
    display_name: Mapped[str] = mapped_column(String(200))
    request_id: Mapped[str | None] = mapped_column(String(128))
    create_time: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    update_time: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

    system_prompt: Mapped[str] = mapped_column(Text, default="")
    model: Mapped[str] = mapped_column(String(200), default="")
    temperature: Mapped[float] = mapped_column(Float)
    max_output_tokens: Mapped[int] = mapped_column(Integer)
    enable_rag: Mapped[bool] = mapped_column(Boolean)
    enable_citations: Mapped[bool] = mapped_column(Boolean)
    citation_link_mode: Mapped[str] = mapped_column(String(32))
    top_k: Mapped[int] = mapped_column(Integer)
    score_threshold: Mapped[float] = mapped_column(Float)
    max_sources: Mapped[int] = mapped_column(Integer)
    excerpt_chars: Mapped[int] = mapped_column(Integer)
    enable_retrieval_gate: Mapped[bool] = mapped_column(Boolean)


class Document(Base):
    """An uploaded file; its state machine lives here, not in the broker."""

    __tablename__ = "documents"
    __table_args__ = (
        UniqueConstraint("tenant_id", "request_id"),
        Index("ix_documents_tenant_id_create_time_id", "tenant_id", "create_time", "id"),
        # The reconciler looks for PENDING or PROCESSING documents whose lease ran out.
        Index("ix_documents_state_lease_until", "state", "lease_until"),
        # Retrieval searches one copy of identical uploads to an assistant.
        Index("ix_documents_assistant_id_sha256", "assistant_id", "sha256"),
        # The reconciler retries documents that FAILED for a transient reason.
        Index("ix_documents_state_failure_kind", "state", "failure_kind"),
    )

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    tenant_id: Mapped[str] = mapped_column(String(128))
    assistant_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("assistants.id", ondelete="CASCADE"), index=True
    )
    display_name: Mapped[str] = mapped_column(String(255))
    content_type: Mapped[str] = mapped_column(String(255))
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(String(64))
    object_key: Mapped[str] = mapped_column(String(255))
    state: Mapped[str] = mapped_column(String(16))
    error: Mapped[str] = mapped_column(Text, default="")
    chunk_count: Mapped[int] = mapped_column(Integer, default=0)
    page_count: Mapped[int] = mapped_column(Integer, default=0)
    request_id: Mapped[str | None] = mapped_column(String(128))
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    lease_until: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # "hostname:pid:task_id" of the attempt that holds the lease.
    lease_holder: Mapped[str | None] = mapped_column(String(255))
    # TRANSIENT or PERMANENT once FAILED; only TRANSIENT failures are retried by the reconciler.
    failure_kind: Mapped[str | None] = mapped_column(String(16))
    reconcile_attempts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    enqueue_time: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    create_time: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    update_time: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    indexed_time: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    delete_time: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class DocumentSetVersion(Base):
    """The version of an assistant's set of READY documents: Postgres's own triggers on
    `documents` (migration 0009) bump it at the commit of any change to a row that is or
    becomes READY and undeleted. No row yet is version 0."""

    __tablename__ = "document_set_versions"

    assistant_id: Mapped[uuid.UUID] = mapped_column(primary_key=True)
    version: Mapped[int] = mapped_column(BigInteger)


class Chunk(Base):
    """A piece of a document's extracted text with its provenance, vector and search terms."""

    __tablename__ = "chunks"
    __table_args__ = (
        UniqueConstraint("document_id", "chunk_index"),
        # ef_construction 128: a denser graph than pgvector's default of 64 (migration 0007).
        Index(
            "ix_chunks_embedding_hnsw",
            "embedding",
            postgresql_using="hnsw",
            postgresql_ops={"embedding": "vector_cosine_ops"},
            postgresql_with={"m": 16, "ef_construction": 128},
        ),
        Index("ix_chunks_tsv", "tsv", postgresql_using="gin"),
    )

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    document_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("documents.id", ondelete="CASCADE"), index=True
    )
    tenant_id: Mapped[str] = mapped_column(String(128))
    assistant_id: Mapped[uuid.UUID] = mapped_column(index=True)
    chunk_index: Mapped[int] = mapped_column(Integer)
    text: Mapped[str] = mapped_column(Text)
    start_offset: Mapped[int] = mapped_column(Integer)
    end_offset: Mapped[int] = mapped_column(Integer)
    # UTF-8 byte offsets of the same range; NULL for chunks indexed before they were recorded.
    start_byte: Mapped[int | None] = mapped_column(BigInteger)
    end_byte: Mapped[int | None] = mapped_column(BigInteger)
    start_line: Mapped[int] = mapped_column(Integer)
    end_line: Mapped[int] = mapped_column(Integer)
    page_start: Mapped[int | None] = mapped_column(Integer)
    page_end: Mapped[int | None] = mapped_column(Integer)
    heading_path: Mapped[list[str]] = mapped_column(ARRAY(Text), default=list)
    # The document's title and the heading path: searched with weight 'A', never quoted.
    context: Mapped[str] = mapped_column(Text, default="")
    # DOCX only: 1-based numbers of the body's non-empty paragraphs the chunk spans.
    paragraph_start: Mapped[int | None] = mapped_column(Integer)
    paragraph_end: Mapped[int | None] = mapped_column(Integer)
    # HTML: (offset into text, line of the file) pairs, flattened (migration 0008).
    line_marks: Mapped[list[int] | None] = mapped_column(ARRAY(Integer))
    # Kept in the row (storage MAIN, migration 0007) so exact search reads no TOAST.
    embedding: Mapped[list[float]] = mapped_column(Vector(EMBEDDING_DIM))
    tsv: Mapped[str] = mapped_column(
        TSVECTOR,
        Computed(
            "setweight(to_tsvector('english', context), 'A') || "
            "setweight(to_tsvector('english', text), 'D')",
            persisted=True,
        ),
    )


class Conversation(Base):
    """A stored exchange with one assistant."""

    __tablename__ = "conversations"
    __table_args__ = (
        Index("ix_conversations_tenant_id_update_time_id", "tenant_id", "update_time", "id"),
    )

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    tenant_id: Mapped[str] = mapped_column(String(128))
    assistant_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("assistants.id", ondelete="CASCADE"), index=True
    )
    title: Mapped[str] = mapped_column(String(200))
    message_count: Mapped[int] = mapped_column(Integer, default=0)
    create_time: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    update_time: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class Message(Base):
    """One turn; an assistant turn keeps the answer's citations and metadata as JSON snapshots."""

    __tablename__ = "messages"
    __table_args__ = (
        UniqueConstraint("conversation_id", "seq"),
        UniqueConstraint("tenant_id", "request_id"),
    )

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    conversation_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("conversations.id", ondelete="CASCADE"), index=True
    )
    tenant_id: Mapped[str] = mapped_column(String(128))
    seq: Mapped[int] = mapped_column(Integer)
    role: Mapped[str] = mapped_column(String(16))
    content: Mapped[str] = mapped_column(Text)
    request_id: Mapped[str | None] = mapped_column(String(128))
    citations: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    # For an assistant turn: completion id, finish reason, usage and retrieval, so a retried
    # request_id replays the same response.
    response: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    create_time: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
