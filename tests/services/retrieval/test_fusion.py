"""Score normalisation: every retrieval score mapped monotonically into [0, 1]."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.citations import ScoreKind
from services.retrieval.fusion import RRF_LISTS, RerankScale, normalize_score


@pytest.mark.parametrize(
    ("score", "kind", "scale", "expected"),
    [
        (0.83, ScoreKind.SIMILARITY, RerankScale.PROBABILITY, 0.83),
        (-0.2, ScoreKind.SIMILARITY, RerankScale.PROBABILITY, 0.0),
        (1.0000001, ScoreKind.SIMILARITY, RerankScale.PROBABILITY, 1.0),
        (RRF_LISTS / 61, ScoreKind.FUSED, RerankScale.PROBABILITY, 1.0),
        (RRF_LISTS / 2 / 61, ScoreKind.FUSED, RerankScale.PROBABILITY, 0.5),
        (0.7, ScoreKind.RERANK, RerankScale.PROBABILITY, 0.7),
        (0.0, ScoreKind.RERANK, RerankScale.LOGIT, 0.5),
        (-1000.0, ScoreKind.RERANK, RerankScale.LOGIT, 0.0),
        (1000.0, ScoreKind.RERANK, RerankScale.LOGIT, 1.0),
        (math.nan, ScoreKind.SIMILARITY, RerankScale.PROBABILITY, 0.0),
    ],
)
def test_normalize_score(
    score: float, kind: ScoreKind, scale: RerankScale, expected: float
) -> None:
    assert normalize_score(score, kind, rerank_scale=scale) == pytest.approx(expected)


@given(
    st.sampled_from(list(ScoreKind)),
    st.sampled_from(list(RerankScale)),
    st.floats(allow_nan=False, width=32),
    st.floats(allow_nan=False, width=32),
)
def test_normalisation_is_monotonic_and_bounded(kind, scale, a, b) -> None:
    low, high = sorted((a, b))
    n_low = normalize_score(low, kind, rerank_scale=scale)
    n_high = normalize_score(high, kind, rerank_scale=scale)
    assert 0.0 <= n_low <= n_high <= 1.0
