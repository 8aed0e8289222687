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


def test_a_document_ranked_first_does_not_push_out_the_best_match() -> None:
    # "a" ranks first with every chunk (its name is a word of the question), "b" holds the
    # passage that matches best by meaning, and ranks last.
    hits = ranked(
        ("a1", 0.52), ("a2", 0.51), ("a3", 0.50), ("a4", 0.49), ("c1", 0.45), ("b1", 0.61)
    )
    kept = diversify(hits, doc, score, 4, max_per_document=2, well_matched=0.9)
    assert [name for name, _ in kept] == ["a1", "a2", "c1", "b1"]


def test_the_best_matches_document_alone_is_not_capped() -> None:
    hits = ranked(("b1", 0.61), ("b2", 0.6), ("b3", 0.6), ("a1", 0.3), ("b4", 0.59))
    kept = diversify(hits, doc, score, 4, max_per_document=1, well_matched=0.9)
    assert [name for name, _ in kept] == ["b1", "b2", "b3", "a1"]  # b past the cap of 1
