"""Proto <-> domain conversion for citations, shared by chat and conversation history."""

from __future__ import annotations

from footnote.v1 import citations_pb2 as cpb
from services.citations import (
    HEADING_SEPARATOR,
    Citations,
    CitationSource,
    CitationSpan,
    Evidence,
    SourceLocation,
)
from services.rpc import to_timestamp


def location_to_proto(loc: SourceLocation) -> cpb.SourceLocation:
    path = [part for part in loc.heading.split(HEADING_SEPARATOR) if part] if loc.heading else []
    return cpb.SourceLocation(
        start_offset=loc.start_offset,
        end_offset=loc.end_offset,
        start_line=loc.start_line,
        end_line=loc.end_line,
        page_start=loc.page_start,
        page_end=loc.page_end,
        heading=path[-1] if path else "",
        heading_path=path,
        start_byte=loc.start_byte,
        end_byte=loc.end_byte,
        paragraph_start=loc.paragraph_start,
        paragraph_end=loc.paragraph_end,
    )


def evidence_to_proto(evidence: Evidence) -> cpb.Evidence:
    return cpb.Evidence(
        source_index=evidence.source_index,
        quote=evidence.quote,
        location=location_to_proto(evidence.location),
        support_score=evidence.support_score,
        verdict=int(evidence.verdict),
        origin=int(evidence.origin),
    )


def span_to_proto(span: CitationSpan) -> cpb.CitationSpan:
    return cpb.CitationSpan(
        start=span.start,
        end=span.end,
        source_indices=list(span.source_indices),
        cited_text=span.cited_text,
        support_score=span.support_score,
        start_byte=span.start_byte,
        end_byte=span.end_byte,
        evidence=[evidence_to_proto(e) for e in span.evidence],
        verdict=int(span.verdict),
    )


def source_to_proto(source: CitationSource) -> cpb.CitationSource:
    return cpb.CitationSource(
        index=source.index,
        document_id=source.document_id,
        document_name=source.document_name,
        content_type=source.content_type,
        score=source.score,
        excerpt=source.excerpt,
        chunk_id=source.chunk_id,
        chunk_index=source.chunk_index,
        location=location_to_proto(source.location),
        download_url=source.download_url,
        download_url_expire_time=to_timestamp(source.download_url_expire_time),
        document_sha256=source.document_sha256,
        indexed_time=to_timestamp(source.indexed_time),
        stale=source.stale,
        formatted=source.formatted,
    )


def citations_to_proto(citations: Citations) -> cpb.Citations:
    return cpb.Citations(
        sources=[source_to_proto(s) for s in citations.sources],
        referenced_indices=list(citations.referenced_indices),
        invalid_indices=list(citations.invalid_indices),
        spans=[span_to_proto(span) for span in citations.spans],
        uncited_claims=[span_to_proto(span) for span in citations.uncited_claims],
        attributed_indices=list(citations.attributed_indices),
    )
