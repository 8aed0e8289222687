"""Builds the numbered source list that the prompt shows and the citations refer to."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from services.citations.types import (
    CitationSource,
    RerankScale,
    RetrievedChunk,
    ScoreKind,
)

ELLIPSIS = "..."
# Reciprocal rank fusion as services/retrieval runs it: k = 60 over two lists (vector, text).
RRF_K = 60
RRF_LISTS = 2


@dataclass(frozen=True, slots=True)
class Manifest:
    """The sources in prompt order; chunks[i] is the retrieved chunk behind sources[i]."""

    sources: tuple[CitationSource, ...]
    chunks: tuple[RetrievedChunk, ...]

    def __len__(self) -> int:
        return len(self.sources)


def build_manifest(
    chunks: Iterable[RetrievedChunk],
    *,
    max_sources: int = 10,
    excerpt_chars: int = 200,
    rerank_scale: RerankScale = RerankScale.PROBABILITY,
    rrf_k: int = RRF_K,
    rrf_lists: int = RRF_LISTS,
) -> Manifest:
    """Number the retrieved chunks from 1, best first.

    chunks may hold several retrieval rounds one after another. A chunk seen more than once
    keeps its best score: a later stage beats an earlier one (rerank > fused > similarity),
    then the higher value wins. At most max_sources survive, ranked by normalised score.
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

    def normalised(chunk: RetrievedChunk) -> float:
        return normalize_score(
            chunk.score,
            chunk.score_kind,
            rerank_scale=rerank_scale,
            rrf_k=rrf_k,
            rrf_lists=rrf_lists,
        )

    def rank(scored: tuple[float, RetrievedChunk]) -> tuple[float, int, str, int, str]:
        score, chunk = scored
        # Ties fall back to document order, so the same hits always number the same way.
        return (-score, -chunk.score_kind, chunk.document_id, chunk.chunk_index, chunk.chunk_id)

    scored = sorted(((normalised(chunk), chunk) for chunk in best.values()), key=rank)
    kept = scored[:max_sources]
    sources = tuple(
        CitationSource(
            index=number,
            document_id=chunk.document_id,
            document_name=chunk.document_name,
            content_type=chunk.content_type,
            score=score,
            excerpt=make_excerpt(chunk.text, excerpt_chars),
            chunk_id=chunk.chunk_id,
            chunk_index=chunk.chunk_index,
            location=chunk.location,
            document_sha256=chunk.document_sha256,
            indexed_time=chunk.indexed_time,
        )
        for number, (score, chunk) in enumerate(kept, start=1)
    )
    return Manifest(sources=sources, chunks=tuple(chunk for _, chunk in kept))


def _priority(chunk: RetrievedChunk) -> tuple[int, float]:
    value = chunk.score
    return int(chunk.score_kind), (-math.inf if math.isnan(value) else value)


def normalize_score(
    score: float,
    kind: ScoreKind,
    *,
    rerank_scale: RerankScale = RerankScale.PROBABILITY,
    rrf_k: int = RRF_K,
    rrf_lists: int = RRF_LISTS,
) -> float:
    """Map a raw retrieval score into [0, 1], monotonically within each kind.

    SIMILARITY: cosine similarity clamped to [0, 1] (a negative cosine means unrelated).
    FUSED: the RRF sum divided by its maximum, rrf_lists / (rrf_k + 1), i.e. a chunk ranked
    first in every list scores 1. RERANK: a probability is clamped to [0, 1]; a logit goes
    through the logistic function. NaN scores 0.
    """
    value = float(score)
    if math.isnan(value):
        return 0.0
    if kind is ScoreKind.FUSED:
        value = value * (rrf_k + 1) / max(rrf_lists, 1)
    elif kind is ScoreKind.RERANK and rerank_scale is RerankScale.LOGIT:
        value = _logistic(value)
    return min(1.0, max(0.0, value))


def _logistic(x: float) -> float:
    # Split by sign so exp() never overflows.
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)


def make_excerpt(text: str, limit: int) -> str:
    """The chunk's text with whitespace collapsed, cut to at most limit code points.

    A cut text ends at a word boundary followed by ELLIPSIS, and the ellipsis counts toward
    the limit. A single word longer than the limit is cut mid-word. Below 4 code points there
    is no room for an ellipsis, so the text is cut hard.
    """
    flat = " ".join(text.split())
    if len(flat) <= limit:
        return flat
    if limit <= len(ELLIPSIS):
        return flat[:limit]
    room = limit - len(ELLIPSIS)
    head = flat[:room]
    if flat[room] != " ":
        space = head.rfind(" ")
        if space > 0:
            head = head[:space]
    head = head.rstrip(" ,;:-–—")
    return (head or flat[:room]) + ELLIPSIS
