"""One document does not take every place while another matches well."""

from __future__ import annotations

from services.retrieval.fusion import diversify


def ranked(*items: tuple[str, float]) -> list[tuple[str, float]]:
    return list(items)


def doc(item: tuple[str, float]) -> str:
    return item[0][0]


def score(item: tuple[str, float]) -> float:
    return item[1]


def test_a_document_is_capped_while_another_matches_well() -> None:
    hits = ranked(("a1", 1.0), ("a2", 0.9), ("a3", 0.9), ("a4", 0.8), ("b1", 0.7), ("b2", 0.6))
    kept = diversify(hits, doc, score, 4, max_per_document=2, well_matched=0.5)
    assert [name for name, _ in kept] == ["a1", "a2", "b1", "b2"]


def test_one_document_keeps_every_place_when_no_other_matches_well() -> None:
    hits = ranked(("a1", 1.0), ("a2", 0.9), ("a3", 0.9), ("a4", 0.8), ("b1", 0.2))
    kept = diversify(hits, doc, score, 4, max_per_document=2, well_matched=0.5)
    assert [name for name, _ in kept] == ["a1", "a2", "a3", "a4"]


def test_held_back_results_fill_places_that_others_cannot() -> None:
    hits = ranked(("a1", 1.0), ("a2", 0.9), ("a3", 0.9), ("b1", 0.7))
    kept = diversify(hits, doc, score, 4, max_per_document=1, well_matched=0.5)
    assert [name for name, _ in kept] == ["a1", "a2", "a3", "b1"]
    assert diversify([], doc, score, 4) == []
    assert diversify(hits, doc, score, 0) == []
