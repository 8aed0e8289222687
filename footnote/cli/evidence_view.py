"""Plain-text lines that show an answer's evidence: each citation's verdict and quote, and the
claims that cite nothing. `footnote ask` prints them after the answer and its sources."""

from __future__ import annotations

from footnote.client import location_parts
from footnote.v1 import chat_service_pb2 as pb
from footnote.v1 import citations_pb2 as cpb

VERDICTS = {
    cpb.SUPPORT_VERDICT_SUPPORTED: "supported",
    cpb.SUPPORT_VERDICT_PARTIAL: "partial",
    cpb.SUPPORT_VERDICT_UNSUPPORTED: "UNSUPPORTED",
    cpb.SUPPORT_VERDICT_UNSPECIFIED: "not checked",
}
QUOTE_CHARS = 160


def evidence_lines(response: pb.CompleteResponse) -> list[str]:
    """The evidence section for one answer; empty when the answer carries no citations."""
    if not response.HasField("citations"):
        return []
    citations = response.citations
    names = {s.index: s.document_name for s in citations.sources}
    lines: list[str] = []
    if citations.spans:
        lines.append("Evidence:")
    for span in citations.spans:
        attributed_only = bool(span.evidence) and all(
            e.origin == cpb.CITATION_ORIGIN_ATTRIBUTED for e in span.evidence
        )
        marks = "".join(f"[{i}]" for i in span.source_indices)
        how = " (no marker; attributed)" if attributed_only else ""
        lines.append(f'  "{_short(span.cited_text)}" {marks} {VERDICTS[span.verdict]}{how}')
        for e in span.evidence:
            origin = "attributed" if e.origin == cpb.CITATION_ORIGIN_ATTRIBUTED else "cited"
            lines.append(
                f"    [{e.source_index}] {origin}, {VERDICTS[e.verdict]} "
                f"{e.support_score:.2f}: {names.get(e.source_index, '?')}{_where(e.location)}"
            )
            lines.append(f'        "{_short(e.quote)}"')
    if citations.uncited_claims:
        lines.append("Claims that no source supports:")
        for claim in citations.uncited_claims:
            lines.append(f'  "{_short(claim.cited_text)}" (characters {claim.start}-{claim.end})')
    return lines


def _where(loc: cpb.SourceLocation) -> str:
    parts = location_parts(loc)
    return (", " + ", ".join(parts)) if parts else ""


def _short(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= QUOTE_CHARS else flat[: QUOTE_CHARS - 3].rstrip() + "..."
