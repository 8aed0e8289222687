"""Decides whether a stored citation still describes its document."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from services.citations.types import CitationSource


@dataclass(frozen=True, slots=True)
class DocumentVersion:
    """The identity of one indexed state of a document."""

    document_id: str
    sha256: str = ""  # hex; "" when unknown
    indexed_time: datetime | None = None  # None when not (or not yet) indexed


def version_of(source: CitationSource) -> DocumentVersion:
    """The document version a source was answered from."""
    return DocumentVersion(source.document_id, source.document_sha256, source.indexed_time)


def is_stale(stored: DocumentVersion, current: DocumentVersion | None) -> bool:
    """True when the document was deleted (current is None), its content changed (sha256),
    or it was indexed again since (indexed_time). An unknown sha256 on either side proves
    nothing, so only indexed_time decides then. Naive datetimes are taken as UTC."""
    if current is None:
        return True
    if stored.document_id != current.document_id:
        raise ValueError("comparing versions of two different documents")
    if stored.sha256 and current.sha256 and stored.sha256.lower() != current.sha256.lower():
        return True
    return _utc(stored.indexed_time) != _utc(current.indexed_time)


def mark_stale(
    sources: Iterable[CitationSource], current: Mapping[str, DocumentVersion]
) -> tuple[CitationSource, ...]:
    """Set `stale` on each source; current maps document ids to their versions now, and a
    document missing from it has been deleted."""
    return tuple(
        dataclasses.replace(s, stale=is_stale(version_of(s), current.get(s.document_id)))
        for s in sources
    )


def _utc(moment: datetime | None) -> datetime | None:
    if moment is None or moment.tzinfo is not None:
        return moment
    return moment.replace(tzinfo=UTC)
