"""Turns a finished answer into its final text and Citations record."""

from __future__ import annotations

from collections.abc import Sequence

from services.citations.extract import Extraction, extract
from services.citations.spans import SupportScorer, build_spans
from services.citations.types import Citations, CitationSource


def finalize(
    answer_text: str,
    sources: Sequence[CitationSource],
    *,
    strip_invalid: bool = False,
    support: SupportScorer | None = None,
) -> tuple[str, Citations]:
    """The text to show and its citations, for an answer generated from `sources`.

    sources are the manifest's, numbered 1..n. Spans are positioned in the returned text.
    """
    _check_numbering(sources)
    extraction = extract(answer_text, len(sources), strip_invalid=strip_invalid)
    return finalize_extraction(extraction, sources, support=support)


def finalize_extraction(
    extraction: Extraction,
    sources: Sequence[CitationSource],
    *,
    support: SupportScorer | None = None,
) -> tuple[str, Citations]:
    """finalize() for text already scanned, e.g. by MarkerBuffer.result() after streaming."""
    _check_numbering(sources)
    spans = build_spans(extraction.text, extraction.markers, sources, support)
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
