"""Citations as JSON for stored history, and back."""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Any

from services.citations import (
    Citations,
    CitationSource,
    CitationSpan,
    CitationStyle,
    SourceLocation,
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
        "spans": [
            {**dataclasses.asdict(span), "source_indices": list(span.source_indices)}
            for span in citations.spans
        ],
    }


def citations_from_json(raw: dict[str, Any]) -> tuple[Citations, CitationStyle]:
    sources = []
    for item in raw["sources"]:
        values = dict(item)
        values["location"] = SourceLocation(**values["location"])
        if values.get("indexed_time"):
            values["indexed_time"] = datetime.fromisoformat(values["indexed_time"])
        sources.append(CitationSource(**values))
    spans = [
        CitationSpan(**{**span, "source_indices": tuple(span["source_indices"])})
        for span in raw["spans"]
    ]
    citations = Citations(
        sources=tuple(sources),
        referenced_indices=tuple(raw["referenced_indices"]),
        spans=tuple(spans),
        invalid_indices=tuple(raw["invalid_indices"]),
    )
    return citations, CitationStyle(raw.get("style", 0))
