"""SQLAlchemy 2.0 models for everything Footnote keeps in SQL."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from sqlalchemy import (
    Boolean,
    DateTime,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    func,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

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
