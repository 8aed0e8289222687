"""Plain value types of the citation engine; the gRPC layer maps them onto footnote.v1 messages."""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

# Joins a heading path ("Install", "Linux") into SourceLocation.heading ("Install > Linux").
HEADING_SEPARATOR = " > "


class ScoreKind(enum.IntEnum):
    """What produced a retrieval score; a later stage outranks an earlier one."""

    SIMILARITY = 1  # cosine similarity of embeddings
    FUSED = 2  # reciprocal rank fusion of several ranked lists
    RERANK = 3  # cross-encoder relevance


class CitationStyle(enum.IntEnum):
    """How CitationSource.formatted renders a source; numbers match footnote.v1.CitationStyle."""

    UNSPECIFIED = 0
    INLINE = 1
    FOOTNOTE = 2
    MARKDOWN = 3


@dataclass(frozen=True, slots=True)
class SourceLocation:
    """Where a chunk sits in its document; 0 (or "") means unknown.

    Offsets are code points into the document's extracted text (end exclusive). Lines are
    1-based, inclusive lines of the uploaded file (plain text, Markdown, HTML markup); pages
    (PDF) and paragraphs (DOCX: the body's non-empty paragraphs, a table counting as one) are
    1-based and inclusive; heading is the heading path joined with HEADING_SEPARATOR.
    """

    start_offset: int = 0
    end_offset: int = 0
    start_line: int = 0
    end_line: int = 0
    page_start: int = 0
    page_end: int = 0
    heading: str = ""
    paragraph_start: int = 0
    paragraph_end: int = 0


def join_heading(parts: Iterable[str]) -> str:
    """Join a heading path, outermost first, into the form SourceLocation.heading uses."""
    cleaned = (" ".join(part.split()) for part in parts)
    return HEADING_SEPARATOR.join(part for part in cleaned if part)


@dataclass(frozen=True, slots=True)
class RetrievedChunk:
    """One retrieval hit, as the retrieval layer hands it over."""

    chunk_id: str
    document_id: str
    document_name: str
    content_type: str
    chunk_index: int
    text: str
    score: float  # in [0, 1], normalised by retrieval (services/retrieval/fusion.py)
    score_kind: ScoreKind
    location: SourceLocation = SourceLocation()
    document_sha256: str = ""
    indexed_time: datetime | None = None


@dataclass(frozen=True, slots=True)
class CitationSource:
    """A source the model was given, numbered from 1 in the order of the prompt."""

    index: int
    document_id: str
    document_name: str
    content_type: str
    score: float
    excerpt: str
    chunk_id: str
    chunk_index: int
    location: SourceLocation = SourceLocation()
    download_url: str = ""
    download_url_expire_time: datetime | None = None
    document_sha256: str = ""
    indexed_time: datetime | None = None
    stale: bool = False
    formatted: str = ""


@dataclass(frozen=True, slots=True)
class CitationSpan:
    """A cited sentence of the final answer: [start, end) in code points, end exclusive."""

    start: int
    end: int
    source_indices: tuple[int, ...]
    cited_text: str
    support_score: float = 0.0


@dataclass(frozen=True, slots=True)
class Citations:
    """Everything the answer's last message carries about its sources."""

    sources: tuple[CitationSource, ...]
    referenced_indices: tuple[int, ...]
    spans: tuple[CitationSpan, ...]
    invalid_indices: tuple[int, ...]
