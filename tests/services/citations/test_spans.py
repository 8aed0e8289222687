"""Cited sentences: ranges in code points, the sources they cite, and their text."""

from hypothesis import given, settings
from hypothesis import strategies as st

from services.citations import CitationSource, build_spans, extract, finalize_extraction


def spans(text: str, n: int = 3) -> list[tuple[str, tuple[int, ...], str]]:
    result = extract(text, n)
    return [
        (result.text[s.start : s.end], s.source_indices, s.cited_text)
        for s in build_spans(result.text, result.markers)
    ]


def test_marker_after_the_full_stop_belongs_to_that_sentence() -> None:
    assert spans("Revenue grew.[1] Costs fell. [2] Margins held.") == [
        ("Revenue grew.[1]", (1,), "Revenue grew."),
        ("Costs fell. [2]", (2,), "Costs fell."),
    ]


def test_marker_before_the_full_stop_and_mid_sentence() -> None:
    assert spans("Revenue [1] grew by 5% [2]. Nothing here.") == [
        ("Revenue [1] grew by 5% [2].", (1, 2), "Revenue grew by 5%."),
    ]


def test_sentences_without_valid_citations_have_no_span() -> None:
    assert spans("Plain. Invalid [7]. Cited [3].") == [("Cited [3].", (3,), "Cited.")]


def test_bullets_and_headings_are_not_part_of_the_sentence() -> None:
    text = "## Setup [1]\n- Install it [2]\n1. Run it [3]\n> Quoted [1]"
    assert spans(text) == [
        ("Setup [1]", (1,), "Setup"),
        ("Install it [2]", (2,), "Install it"),
        ("Run it [3]", (3,), "Run it"),
        ("Quoted [1]", (1,), "Quoted"),
    ]


def test_a_line_of_only_markers_cites_the_sentence_before() -> None:
    assert spans("First. Revenue grew.\n\n[1][2]") == [
        ("Revenue grew.\n\n[1][2]", (1, 2), "Revenue grew."),
    ]


def test_abbreviations_and_numbers_do_not_end_sentences() -> None:
    text = "Dr. Smith measured 3.5 kg, e.g. in Fig. 2 and approx. twice [1]. Then J. Doe left [2]."
    assert [s[1] for s in spans(text)] == [(1,), (2,)]
    assert spans(text)[0][2] == "Dr. Smith measured 3.5 kg, e.g. in Fig. 2 and approx. twice."


def test_lowercase_after_a_period_continues_the_sentence_unless_a_marker_ends_it() -> None:
    assert [s[0] for s in spans("It costs 5 USD. or so [1].")] == ["It costs 5 USD. or so [1]."]
    assert [s[0] for s in spans("One [1]. then two [2].")] == ["One [1].", "then two [2]."]


def test_other_terminators_and_quotes() -> None:
    assert [s[0] for s in spans('Really?[1] "Yes!" [2] 收入增长。【3】下降了。')] == [
        "Really?[1]",
        '"Yes!" [2]',
        "收入增长。【3】",
    ]


def test_glued_marker_keeps_words_apart_in_cited_text() -> None:
    assert spans("Foo[1]bar.")[0][2] == "Foo bar."


def test_offsets_are_code_points_of_the_stripped_text() -> None:
    sources = [CitationSource(i, "d", "n", "t", 0.0, "", f"c{i}", 0) for i in (1, 2)]
    scanned = extract("😀 Émoji [9] ok [1]. Next [2].", len(sources), strip_invalid=True)
    text, citations = finalize_extraction(scanned, sources)
    assert text == "😀 Émoji  ok [1]. Next [2]."
    assert [(s.start, s.end) for s in citations.spans] == [(0, 16), (17, 26)]
    assert text[0:16] == "😀 Émoji  ok [1]."
    assert citations.spans[0].cited_text == "😀 Émoji ok."


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="ab .?!\n[]123-,`A", max_size=60))
def test_spans_are_ordered_disjoint_and_hold_their_markers(text: str) -> None:
    result = extract(text, 3)
    found = build_spans(result.text, result.markers)
    last_end = 0
    for span in found:
        assert last_end <= span.start < span.end <= len(result.text)
        last_end = span.end
        assert span.source_indices
        inside = {i for m in result.markers if span.start <= m.start < span.end for i in m.indices}
        assert set(span.source_indices) == inside
    cited = {i for span in found for i in span.source_indices}
    assert cited == set(result.referenced_indices)
