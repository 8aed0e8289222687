"""Turns a finished answer into its final text and Citations record."""

from __future__ import annotations

from collections.abc import Sequence

from services.citations.extract import Extraction
from services.citations.spans import build_spans
from services.citations.types import Citations, CitationSource


def finalize_extraction(
    extraction: Extraction, sources: Sequence[CitationSource]
) -> tuple[str, Citations]:
    """The text to show and its citations, for text scanned by extract() or MarkerBuffer.

    sources are the manifest's, numbered 1..n. Spans are positioned in the returned text.
    """
    _check_numbering(sources)
    spans = build_spans(extraction.text, extraction.markers)
    citations = Citations(
        sources=tuple(sources),
        referenced_indices=extraction.referenced_indices,
        spans=spans,
        invalid_indices=extraction.invalid_indices,
    )
    return extraction.text, citations


def _check_numbering(sources: Sequence[CitationSource]) -> None:
    # Marker numbers are positions in this list; anything else would cite the wrong source.
    for position, source in enumerate(sources, start=1):
        if source.index != position:
            raise ValueError(
                f"sources must be numbered 1..n in order; got {source.index} at {position}"
            )
