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


class SupportVerdict(enum.IntEnum):
    """How well a source supports a sentence; numbers match footnote.v1.SupportVerdict."""

    UNSPECIFIED = 0
    SUPPORTED = 1
    PARTIAL = 2
    UNSUPPORTED = 3


class CitationOrigin(enum.IntEnum):
    """Who linked a sentence to a source; numbers match footnote.v1.CitationOrigin."""

    UNSPECIFIED = 0
    MODEL = 1  # a marker in the answer
    ATTRIBUTED = 2  # the evidence scorer


@dataclass(frozen=True, slots=True)
class SourceLocation:
    """Where a chunk sits in its document; 0 (or "") means unknown.

    Offsets are code points into the document's extracted text (end exclusive). Lines are
    1-based, inclusive lines of the uploaded file (plain text, Markdown, HTML markup); pages
    (PDF) and paragraphs (DOCX: the body's non-empty paragraphs, a table counting as one) are
    1-based and inclusive; heading is the heading path joined with HEADING_SEPARATOR.
    start_byte and end_byte are the same range in UTF-8 bytes (0 when not recorded).
    """

    start_offset: int = 0
    end_offset: int = 0
    start_line: int = 0
    end_line: int = 0
    page_start: int = 0
    page_end: int = 0
    heading: str = ""
    start_byte: int = 0
    end_byte: int = 0
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
    # HTML: where the text's lines of the file change, (offset into text, line) pairs
    # flattened, so that a quote can name its own lines; empty elsewhere.
    line_marks: tuple[int, ...] = ()


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
class Evidence:
    """The quote of one source that best supports one sentence, and how well it does."""

    source_index: int
    quote: str  # verbatim: the document's extracted text at location's offsets
    location: SourceLocation
    support_score: float
    verdict: SupportVerdict
    origin: CitationOrigin


@dataclass(frozen=True, slots=True)
class CitationSpan:
    """A sentence of the final answer: [start, end) in code points, end exclusive.

    start_byte and end_byte are the same range in UTF-8 bytes of the answer.
    """

    start: int
    end: int
    source_indices: tuple[int, ...]
    cited_text: str
    support_score: float = 0.0
    start_byte: int = 0
    end_byte: int = 0
    evidence: tuple[Evidence, ...] = ()
    verdict: SupportVerdict = SupportVerdict.UNSPECIFIED


@dataclass(frozen=True, slots=True)
class Citations:
    """Everything the answer's last message carries about its sources."""

    sources: tuple[CitationSource, ...]
    referenced_indices: tuple[int, ...]
    spans: tuple[CitationSpan, ...]
    invalid_indices: tuple[int, ...]
    uncited_claims: tuple[CitationSpan, ...] = ()
    attributed_indices: tuple[int, ...] = ()
