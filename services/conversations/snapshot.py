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
    sources = []
    for source in citations.sources:
        raw = {
            f.name: getattr(source, f.name)
            for f in dataclasses.fields(source)
            if f.name not in NOT_STORED
        }
        raw["location"] = dataclasses.asdict(source.location)
        raw["indexed_time"] = _time(source.indexed_time)
        sources.append(raw)
    return {
        "style": int(style),
        "sources": sources,
        "referenced_indices": list(citations.referenced_indices),
        "invalid_indices": list(citations.invalid_indices),
        "spans": [_span_to_json(span) for span in citations.spans],
        "uncited_claims": [_span_to_json(span) for span in citations.uncited_claims],
        "attributed_indices": list(citations.attributed_indices),
    }


def _span_to_json(span: CitationSpan) -> dict[str, Any]:
    raw = dataclasses.asdict(span)
    raw["source_indices"] = list(span.source_indices)
    raw["verdict"] = int(span.verdict)
    raw["evidence"] = [
        {**dataclasses.asdict(e), "verdict": int(e.verdict), "origin": int(e.origin)}
        for e in span.evidence
    ]
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
