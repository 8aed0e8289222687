"""The citation engine: numbered sources in, markers found, spans and sources out. No I/O."""

from services.citations.context import build_context, neutralize_markers, source_label
from services.citations.extract import Extraction, Marker, extract
from services.citations.finalize import finalize_extraction
from services.citations.manifest import Manifest, build_manifest, make_excerpt
from services.citations.spans import answer_sentences, build_spans
from services.citations.stale import DocumentVersion, is_stale, mark_stale, version_of
from services.citations.stream import CitationEvent, Delta, MarkerBuffer, StreamEvent
from services.citations.styles import apply_style, format_source
from services.citations.types import (
    HEADING_SEPARATOR,
    CitationOrigin,
    Citations,
    CitationSource,
    CitationSpan,
    CitationStyle,
    Evidence,
    RetrievedChunk,
    ScoreKind,
    SourceLocation,
    SupportVerdict,
    join_heading,
)

__all__ = [
    "HEADING_SEPARATOR",
    "CitationEvent",
    "CitationOrigin",
    "CitationSource",
    "CitationSpan",
    "CitationStyle",
    "Citations",
    "Delta",
    "DocumentVersion",
    "Evidence",
    "Extraction",
    "Manifest",
    "Marker",
    "MarkerBuffer",
    "RetrievedChunk",
    "ScoreKind",
    "SourceLocation",
    "StreamEvent",
    "SupportVerdict",
    "answer_sentences",
    "apply_style",
    "build_context",
    "build_manifest",
    "build_spans",
    "extract",
    "finalize_extraction",
    "format_source",
    "is_stale",
    "join_heading",
    "make_excerpt",
    "mark_stale",
    "neutralize_markers",
    "source_label",
    "version_of",
]
