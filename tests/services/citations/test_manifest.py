"""Source numbering, de-duplication across rounds, score normalisation and excerpts."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.citations import (
    RetrievedChunk,
    ScoreKind,
    SourceLocation,
    build_manifest,
    make_excerpt,
)


def chunk(
    chunk_id: str, score: float, kind: ScoreKind = ScoreKind.SIMILARITY, **kw
) -> RetrievedChunk:
    fields = {
        "document_id": f"doc-{chunk_id}",
        "document_name": f"{chunk_id}.md",
        "content_type": "text/markdown",
        "chunk_index": 0,
        "text": f"text of {chunk_id}",
    }
    fields.update(kw)
    return RetrievedChunk(chunk_id=chunk_id, score=score, score_kind=kind, **fields)


def test_sources_are_numbered_from_one_by_score() -> None:
    manifest = build_manifest([chunk("a", 0.2), chunk("b", 0.9), chunk("c", 0.5)])
    assert [(s.index, s.chunk_id) for s in manifest.sources] == [(1, "b"), (2, "c"), (3, "a")]
    assert [c.chunk_id for c in manifest.chunks] == ["b", "c", "a"]


def test_a_chunk_seen_in_several_rounds_keeps_its_best_stage_then_value() -> None:
    rounds = [
        chunk("a", 0.95, ScoreKind.SIMILARITY),
        chunk("a", 0.31, ScoreKind.FUSED),
        chunk("a", 0.40, ScoreKind.RERANK),
        chunk("a", 0.30, ScoreKind.RERANK),
        chunk("b", 0.61, ScoreKind.FUSED),
        chunk("b", 0.92, ScoreKind.FUSED),
    ]
    manifest = build_manifest(rounds)
    scores = {s.chunk_id: s.score for s in manifest.sources}
    assert len(manifest) == 2
    assert scores["a"] == pytest.approx(0.40)
    assert scores["b"] == pytest.approx(0.92)


def test_at_most_max_sources_are_kept() -> None:
    hits = [chunk(f"c{i}", i / 100) for i in range(30)]
    manifest = build_manifest(hits, max_sources=4)
    assert [s.chunk_id for s in manifest.sources] == ["c29", "c28", "c27", "c26"]
    assert build_manifest(hits, max_sources=0).sources == ()
    with pytest.raises(ValueError):
        build_manifest(hits, max_sources=-1)


def test_ties_are_numbered_the_same_whatever_the_input_order() -> None:
    hits = [chunk("x", 0.5, document_id="d2"), chunk("y", 0.5, document_id="d1")]
    assert build_manifest(hits).sources == build_manifest(hits[::-1]).sources


def test_source_carries_location_and_document_version() -> None:
    location = SourceLocation(10, 50, 3, 4, 2, 2, "Install > Linux")
    hit = chunk("a", 0.5, location=location, document_sha256="ab" * 32, chunk_index=7)
    source = build_manifest([hit]).sources[0]
    assert source.location == location
    assert source.document_sha256 == "ab" * 32
    assert source.chunk_index == 7
    assert source.download_url == "" and not source.stale and source.formatted == ""


def test_excerpt_is_cut_at_a_word_boundary_and_the_ellipsis_counts() -> None:
    text = "Revenue grew  five percent\nin the third quarter."
    assert make_excerpt(text, 100) == "Revenue grew five percent in the third quarter."
    assert make_excerpt(text, 20) == "Revenue grew five..."
    assert make_excerpt(text, 19) == "Revenue grew..."
    assert make_excerpt("Revenue, costs and more", 12) == "Revenue..."
    assert make_excerpt("Supercalifragilistic", 10) == "Superca..."
    assert make_excerpt("abcdef", 3) == "abc"
    assert make_excerpt("abcdef", 0) == ""


@settings(max_examples=300)
@given(st.text(alphabet="ab \n.,", max_size=80), st.integers(0, 90))
def test_excerpt_never_exceeds_its_limit(text: str, limit: int) -> None:
    excerpt = make_excerpt(text, limit)
    flat = " ".join(text.split())
    assert len(excerpt) <= limit
    if len(flat) <= limit:
        assert excerpt == flat
    elif limit > 3:
        assert excerpt.endswith("...")
        assert flat.startswith(excerpt[:-3])


def test_excerpt_chars_is_applied() -> None:
    hit = chunk("a", 0.5, text="word " * 100)
    assert len(build_manifest([hit], excerpt_chars=30).sources[0].excerpt) <= 30


def test_ties_number_by_document_name_and_chunk_not_by_random_ids() -> None:
    # Same score: the order must not depend on the ids, which differ on every upload.
    first = [
        chunk("x1", 0.5, ScoreKind.FUSED, document_id="ffff", document_name="b.md"),
        chunk("x2", 0.5, ScoreKind.FUSED, document_id="0000", document_name="c.md"),
        chunk("x3", 0.5, ScoreKind.FUSED, document_id="9999", document_name="a.md"),
    ]
    again = [
        chunk("y1", 0.5, ScoreKind.FUSED, document_id="0001", document_name="b.md"),
        chunk("y2", 0.5, ScoreKind.FUSED, document_id="fffe", document_name="c.md"),
        chunk("y3", 0.5, ScoreKind.FUSED, document_id="5555", document_name="a.md"),
    ]
    names = [[s.document_name for s in build_manifest(hits).sources] for hits in (first, again)]
    assert names[0] == names[1] == ["a.md", "b.md", "c.md"]


def test_excerpts_chosen_later_are_the_ones_chosen_at_once() -> None:
    text = (
        "The office opens at eight. Parking is behind the building. "
        "Annual leave is twenty-five days a year and expires in March. "
        "The kitchen is on the second floor."
    )
    chunks = [chunk("a", 0.9, text=text), chunk("b", 0.4, text="Short text of b.")]
    question = "How many days of annual leave do I get?"
    at_once = build_manifest(chunks, excerpt_chars=70, query=question)
    later = build_manifest(chunks, excerpt_chars=70, query=question, excerpts=False)
    assert [s.excerpt for s in later.sources] == ["", ""]
    filled = later.with_excerpts(70, question)
    assert filled == at_once
    assert "Annual leave" in filled.sources[0].excerpt
    with pytest.raises(ValueError):
        later.with_excerpts(-1, question)
