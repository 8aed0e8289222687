"""Citations as JSON for stored history, and back."""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Any

from services.citations import (
    CitationOrigin,
    Citations,
    CitationSource,
    CitationSpan,
    CitationStyle,
    Evidence,
    SourceLocation,
    SupportVerdict,
)

# Links are signed whenever history is served, never frozen into it.
NOT_STORED = ("download_url", "download_url_expire_time", "stale", "formatted")


def _time(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def citations_to_json(citations: Citations, style: CitationStyle) -> dict[str, Any]:
    return {
        "style": int(style),
        "sources": [_source_to_json(source) for source in citations.sources],
        "referenced_indices": list(citations.referenced_indices),
        "invalid_indices": list(citations.invalid_indices),
        "spans": [_span_to_json(span) for span in citations.spans],
        "uncited_claims": [_span_to_json(span) for span in citations.uncited_claims],
        "attributed_indices": list(citations.attributed_indices),
    }


# Field by field rather than dataclasses.asdict, which copies every value deeply and was a
# tenth of the event loop's time in a unary Complete; the JSON is the same.
_LOCATION_FIELDS = tuple(f.name for f in dataclasses.fields(SourceLocation))
_SOURCE_FIELDS = tuple(
    f.name for f in dataclasses.fields(CitationSource) if f.name not in NOT_STORED
)
_SPAN_FIELDS = tuple(f.name for f in dataclasses.fields(CitationSpan))
_EVIDENCE_FIELDS = tuple(f.name for f in dataclasses.fields(Evidence))


def _location_to_json(location: SourceLocation) -> dict[str, Any]:
    return {name: getattr(location, name) for name in _LOCATION_FIELDS}


def _source_to_json(source: CitationSource) -> dict[str, Any]:
    raw = {name: getattr(source, name) for name in _SOURCE_FIELDS}
    raw["location"] = _location_to_json(source.location)
    raw["indexed_time"] = _time(source.indexed_time)
    return raw


def _evidence_to_json(evidence: Evidence) -> dict[str, Any]:
    raw = {name: getattr(evidence, name) for name in _EVIDENCE_FIELDS}
    raw["location"] = _location_to_json(evidence.location)
    raw["verdict"] = int(evidence.verdict)
    raw["origin"] = int(evidence.origin)
    return raw


def _span_to_json(span: CitationSpan) -> dict[str, Any]:
    raw = {name: getattr(span, name) for name in _SPAN_FIELDS}
    raw["source_indices"] = list(span.source_indices)
    raw["evidence"] = [_evidence_to_json(e) for e in span.evidence]
    raw["verdict"] = int(span.verdict)
    return raw


def _span_from_json(raw: dict[str, Any]) -> CitationSpan:
    # Snapshots stored before evidence existed have no byte offsets, evidence or verdict.
    values = dict(raw)
    values["source_indices"] = tuple(values["source_indices"])
    values["verdict"] = SupportVerdict(values.get("verdict", 0))
    values["evidence"] = tuple(
        Evidence(
            source_index=e["source_index"],
            quote=e["quote"],
            location=SourceLocation(**e["location"]),
            support_score=e["support_score"],
            verdict=SupportVerdict(e["verdict"]),
            origin=CitationOrigin(e["origin"]),
        )
        for e in values.get("evidence", ())
    )
    return CitationSpan(**values)


def citations_from_json(raw: dict[str, Any]) -> tuple[Citations, CitationStyle]:
    sources = []
    for item in raw["sources"]:
        values = dict(item)
        values["location"] = SourceLocation(**values["location"])
        if values.get("indexed_time"):
            values["indexed_time"] = datetime.fromisoformat(values["indexed_time"])
        sources.append(CitationSource(**values))
    citations = Citations(
        sources=tuple(sources),
        referenced_indices=tuple(raw["referenced_indices"]),
        spans=tuple(_span_from_json(span) for span in raw["spans"]),
        invalid_indices=tuple(raw["invalid_indices"]),
        uncited_claims=tuple(_span_from_json(span) for span in raw.get("uncited_claims", ())),
        attributed_indices=tuple(raw.get("attributed_indices", ())),
    )
    return citations, CitationStyle(raw.get("style", 0))
