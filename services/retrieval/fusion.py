"""Scoring: reciprocal rank fusion of the ranked lists, and every score mapped into [0, 1].

Retrieval owns scores: the citation engine receives them already normalised and only
compares them.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Hashable, Sequence
from typing import TypeVar

from services.citations import ScoreKind

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)  # a candidate's id

# Reciprocal rank fusion over two lists (vector, full text), with the customary k = 60. The
# tunables below were chosen on the labelled set with bench/retrieval.py (docs/quality.md).
RRF_K = 60
# How much a rank in each list counts; the best possible fused score is their sum / (k + 1).
VECTOR_WEIGHT = 1.0
TEXT_WEIGHT = 1.0
RRF_LISTS = VECTOR_WEIGHT + TEXT_WEIGHT
# Candidates taken from each list before fusion: at least this many, or this many per result.
MIN_CANDIDATES = 20
CANDIDATES_PER_RESULT = 8
# ts_rank weights for the labels D, C, B, A: A is the title and heading path, D the text.
TEXT_RANK_WEIGHTS = (0.1, 0.2, 0.4, 1.0)
# At most this many of the top-k results come from one document while another document
# matches well: has a candidate whose cosine similarity is at least WELL_MATCHED times the
# best one's. (Fused scores are too flat to tell: rank 20 still scores 0.76 of rank 1.)
MAX_PER_DOCUMENT = 3
WELL_MATCHED = 0.9


class RerankScale(enum.Enum):
    """How a reranker reports relevance."""

    PROBABILITY = "probability"  # already in [0, 1] (TEI, Cohere, Jina)
    LOGIT = "logit"  # raw cross-encoder output, any real number


def fuse(
    rankings: Sequence[Sequence[K]],
    k: int = RRF_K,
    weights: Sequence[float] | None = None,
) -> dict[K, float]:
    """Reciprocal rank fusion: each list adds weight / (k + rank) for every id it holds."""
    scores: dict[K, float] = {}
    for number, ranking in enumerate(rankings):
        weight = 1.0 if weights is None else weights[number]
        for rank, chunk_id in enumerate(ranking, start=1):
            scores[chunk_id] = scores.get(chunk_id, 0.0) + weight / (k + rank)
    return scores


def diversify(
    ranked: Sequence[T],
    document_of: Callable[[T], object],
    match_of: Callable[[T], float],
    top_k: int,
    *,
    max_per_document: int = MAX_PER_DOCUMENT,
    well_matched: float = WELL_MATCHED,
) -> list[T]:
    """The best top_k of ranked (best first), keeping one document from crowding out others.

    match_of measures how well a result matches on its own (cosine similarity). A document
    gets at most max_per_document of the places while another document has a result matching
    at least well_matched times as well as the best; the places it cannot take go to the next
    best results of other documents. So the best match's document is capped only when a
    second document also matches well, and every other document is capped whenever the best
    match is not its own: a document whose name the question shares can rank first in full
    text with every chunk, and must not push out the passage that matches the question best.
    When the others run out, the held-back results fill the places in ranking order.
    """
    if not ranked or top_k <= 0:
        return []
    matches = list(map(match_of, ranked))  # each item's once: ranked is long, the kept few
    best = max(matches)
    if best <= 0:
        return list(ranked[:top_k])
    floor = well_matched * best
    strong = {document_of(item) for item, m in zip(ranked, matches, strict=True) if m >= floor}
    kept: list[T] = []
    held: list[T] = []
    taken: dict[object, int] = {}
    for item in ranked:
        document = document_of(item)
        # Capped while some other document matches well: strong holds one besides this one.
        capped = len(strong) > (document in strong)
        if not capped or taken.get(document, 0) < max_per_document:
            taken[document] = taken.get(document, 0) + 1
            kept.append(item)
            if len(kept) == top_k:
                return kept
        else:
            held.append(item)
    # Too few other documents to fill the places: the held-back results fill them in order.
    position = {id(item): number for number, item in enumerate(ranked)}
    return sorted(kept + held[: top_k - len(kept)], key=lambda item: position[id(item)])


def normalize_score(
    score: float,
    kind: ScoreKind,
    *,
    rerank_scale: RerankScale = RerankScale.PROBABILITY,
    rrf_k: int = RRF_K,
    rrf_lists: float = RRF_LISTS,
) -> float:
    """Map a raw retrieval score into [0, 1], monotonically within each kind.

    SIMILARITY: cosine similarity clamped to [0, 1] (a negative cosine means unrelated).
    FUSED: the RRF sum divided by its maximum, rrf_lists / (rrf_k + 1) where rrf_lists is the
    sum of the list weights, i.e. a chunk ranked first in every list scores 1. RERANK: a
    probability is clamped to [0, 1]; a logit goes through the logistic function. NaN scores 0.
    """
    value = float(score)
    if math.isnan(value):
        return 0.0
    if kind is ScoreKind.FUSED:
        value = value * (rrf_k + 1) / rrf_lists if rrf_lists > 0 else 0.0
    elif kind is ScoreKind.RERANK and rerank_scale is RerankScale.LOGIT:
        value = _logistic(value)
    return min(1.0, max(0.0, value))


def _logistic(x: float) -> float:
    # Split by sign so exp() never overflows.
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)
