"""Builds the numbered source list that the prompt shows and the citations refer to."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace

from services.citations.excerpt import ELLIPSIS, make_excerpt
from services.citations.types import CitationSource, RetrievedChunk

__all__ = ["ELLIPSIS", "Manifest", "build_manifest", "make_excerpt"]


@dataclass(frozen=True, slots=True)
class Manifest:
    """The sources in prompt order; chunks[i] is the retrieved chunk behind sources[i]."""

    sources: tuple[CitationSource, ...]
    chunks: tuple[RetrievedChunk, ...]

    def __len__(self) -> int:
        return len(self.sources)

    def with_excerpts(self, excerpt_chars: int, query: str = "") -> Manifest:
        """The same sources, each excerpt the part of its chunk that best matches query."""
        if excerpt_chars < 0:
            raise ValueError("excerpt_chars must be >= 0")
        sources = tuple(
            replace(source, excerpt=make_excerpt(chunk.text, excerpt_chars, query))
            for source, chunk in zip(self.sources, self.chunks, strict=True)
        )
        return Manifest(sources=sources, chunks=self.chunks)


def build_manifest(
    chunks: Iterable[RetrievedChunk],
    *,
    max_sources: int = 10,
    excerpt_chars: int = 200,
    query: str = "",
    excerpts: bool = True,
) -> Manifest:
    """Number the retrieved chunks from 1, best first.

    chunks may hold several retrieval rounds one after another. A chunk seen more than once
    keeps its best score: a later stage beats an earlier one (rerank > fused > similarity),
    then the higher value wins. At most max_sources survive, ranked by score. Scores come
    normalised to [0, 1] by retrieval; anything outside is clamped, and NaN counts as 0.
    Each excerpt is the part of its chunk that best matches query (the question). With
    excerpts=False they are left empty for `Manifest.with_excerpts` to fill when they are
    needed: choosing them is most of the manifest's time, and a prompt does not show them.
    """
    if max_sources < 0:
        raise ValueError("max_sources must be >= 0")
    if excerpt_chars < 0:
        raise ValueError("excerpt_chars must be >= 0")
    best: dict[str, RetrievedChunk] = {}
    for chunk in chunks:
        held = best.get(chunk.chunk_id)
        if held is None or _priority(chunk) > _priority(held):
            best[chunk.chunk_id] = chunk

    def rank(scored: tuple[float, RetrievedChunk]) -> tuple[float, int, str, str, int, str]:
        score, chunk = scored
        # Ties fall back to stable keys (not the random ids), so the same documents always
        # number the same way.
        return (
            -score,
            -chunk.score_kind,
            chunk.document_name,
            chunk.document_sha256,
            chunk.chunk_index,
            chunk.chunk_id,
        )

    scored = sorted(((_unit(chunk.score), chunk) for chunk in best.values()), key=rank)
    kept = scored[:max_sources]
    sources = tuple(
        CitationSource(
            index=number,
            document_id=chunk.document_id,
            document_name=chunk.document_name,
            content_type=chunk.content_type,
            score=score,
            excerpt="",
            chunk_id=chunk.chunk_id,
            chunk_index=chunk.chunk_index,
            location=chunk.location,
            document_sha256=chunk.document_sha256,
            indexed_time=chunk.indexed_time,
        )
        for number, (score, chunk) in enumerate(kept, start=1)
    )
    manifest = Manifest(sources=sources, chunks=tuple(chunk for _, chunk in kept))
    return manifest.with_excerpts(excerpt_chars, query) if excerpts else manifest


def _priority(chunk: RetrievedChunk) -> tuple[int, float]:
    value = chunk.score
    return int(chunk.score_kind), (-math.inf if math.isnan(value) else value)


def _unit(score: float) -> float:
    return 0.0 if math.isnan(score) else min(1.0, max(0.0, float(score)))
