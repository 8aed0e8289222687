"""Scoring: reciprocal rank fusion of the ranked lists, and every score mapped into [0, 1].

Retrieval owns scores: the citation engine receives them already normalised and only
compares them.
"""

from __future__ import annotations

import enum
import math
import uuid
from collections.abc import Sequence

from services.citations import ScoreKind

# Reciprocal rank fusion over two lists (vector, full text), with the customary k = 60.
RRF_K = 60
RRF_LISTS = 2


class RerankScale(enum.Enum):
    """How a reranker reports relevance."""

    PROBABILITY = "probability"  # already in [0, 1] (TEI, Cohere, Jina)
    LOGIT = "logit"  # raw cross-encoder output, any real number


def fuse(rankings: Sequence[Sequence[uuid.UUID]], k: int = RRF_K) -> dict[uuid.UUID, float]:
    """Reciprocal rank fusion: each list adds 1 / (k + rank) for every id it holds."""
    scores: dict[uuid.UUID, float] = {}
    for ranking in rankings:
        for rank, chunk_id in enumerate(ranking, start=1):
            scores[chunk_id] = scores.get(chunk_id, 0.0) + 1.0 / (k + rank)
    return scores


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
