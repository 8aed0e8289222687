"""Streaming: any split of any text gives the unary result, and no delta ends inside a marker."""

import itertools

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.citations import (
    CitationEvent,
    CitationSource,
    Delta,
    MarkerBuffer,
    extract,
    finalize_extraction,
)

# Characters that make up markers, code and links, so that random text is dense with near-misses.
ALPHABET = "ab .!\n129034[]【】,-–`~^()\\ 、"
TOKENS = [
    "[1]", "[2]", "[3]", "[9]", "[1][3]", "[1, 2]", "[1-3]", "[2-9]", "【1】", "【9】", "【1、3】",
    "`", "``", "```", "```\n", "~~~\n", "\n```\n", "[1](u)", "](", "[^1]", "\\[1]", "\\",
    "Foo bar. ", "e.g. ", "\n- ", "\n\n", "[", "]", "【", "】", ", ", "-",
]  # fmt: skip
N_SOURCES = 3

texts = st.lists(
    st.one_of(st.sampled_from(TOKENS), st.text(alphabet=ALPHABET, max_size=4)), max_size=24
).map("".join)


@st.composite
def split_text(draw: st.DrawFn) -> tuple[str, list[str]]:
    text = draw(texts)
    cuts = draw(st.lists(st.integers(0, len(text)), max_size=12))
    bounds = [0, *sorted(cuts), len(text)]
    return text, [text[a:b] for a, b in itertools.pairwise(bounds)]


def stream(pieces: list[str], strip: bool) -> tuple[MarkerBuffer, list[Delta | CitationEvent]]:
    buffer = MarkerBuffer(N_SOURCES, strip_invalid=strip)
    events = []
    for piece in pieces:
        events.extend(buffer.feed(piece))
    events.extend(buffer.finish())
    return buffer, events


PROPERTY = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(split_text(), st.booleans())
def test_deltas_join_to_the_unary_text(case: tuple[str, list[str]], strip: bool) -> None:
    text, pieces = case
    _, events = stream(pieces, strip)
    joined = "".join(e.text for e in events if isinstance(e, Delta))
    assert joined == extract(text, N_SOURCES, strip_invalid=strip).text
    if not strip:
        assert joined == text


@PROPERTY
@given(split_text(), st.booleans())
def test_no_delta_ends_inside_a_marker(case: tuple[str, list[str]], strip: bool) -> None:
    # Every marker of the final text lies wholly inside one delta.
    text, pieces = case
    _, events = stream(pieces, strip)
    bounds, at = set(), 0
    for event in events:
        if isinstance(event, Delta):
            assert event.text, "empty delta"
            at += len(event.text)
            bounds.add(at)
    for marker in extract(text, N_SOURCES, strip_invalid=strip).markers:
        assert not any(marker.start < b < marker.end for b in bounds), (marker, sorted(bounds))


@PROPERTY
@given(split_text(), st.booleans())
def test_incremental_extraction_equals_whole_text(case: tuple[str, list[str]], strip: bool) -> None:
    text, pieces = case
    buffer, _ = stream(pieces, strip)
    assert buffer.text == text
    assert buffer.result() == extract(text, N_SOURCES, strip_invalid=strip)


@PROPERTY
@given(split_text(), st.booleans())
def test_each_cited_index_is_announced_once_after_its_marker(
    case: tuple[str, list[str]], strip: bool
) -> None:
    text, pieces = case
    buffer, events = stream(pieces, strip)
    result = buffer.result()
    assert buffer.text == text
    sent, announced = 0, []
    first_marker = {}
    for marker in result.markers:
        for index in marker.indices:
            first_marker.setdefault(index, marker)
    for event in events:
        if isinstance(event, Delta):
            sent += len(event.text)
        else:
            marker = first_marker[event.index]
            assert (event.start, event.end) == (marker.start, marker.end)
            assert event.end <= sent  # the marker has already been sent
            announced.append(event.index)
    assert sorted(announced) == list(result.referenced_indices)
    assert len(announced) == len(set(announced))


@PROPERTY
@given(split_text(), st.booleans())
def test_streamed_then_finalized_equals_unary(case: tuple[str, list[str]], strip: bool) -> None:
    text, pieces = case
    sources = [
        CitationSource(i, f"d{i}", f"doc{i}.md", "text/markdown", 0.5, "", f"c{i}", 0)
        for i in range(1, N_SOURCES + 1)
    ]
    buffer, events = stream(pieces, strip)
    streamed = finalize_extraction(buffer.result(), sources)
    unary = finalize_extraction(extract(text, N_SOURCES, strip_invalid=strip), sources)
    assert streamed == unary
    assert streamed[0] == "".join(e.text for e in events if isinstance(e, Delta))


@PROPERTY
@given(texts)
def test_stripping_is_idempotent_and_keeps_citations(text: str) -> None:
    once = extract(text, N_SOURCES, strip_invalid=True)
    again = extract(once.text, N_SOURCES, strip_invalid=True)
    assert again.text == once.text
    assert again.referenced_indices == once.referenced_indices
    kept = [(m.start, m.end, m.indices) for m in once.markers if m.text]
    assert [(m.start, m.end, m.indices) for m in again.markers] == kept


def test_partial_marker_is_held_until_it_resolves() -> None:
    buffer = MarkerBuffer(3)
    assert buffer.feed("Revenue grew [") == [Delta("Revenue grew ")]
    assert buffer.feed("1") == []
    assert buffer.feed(", ") == []
    assert buffer.feed("2]") == []  # could still be link text "[1, 2](url)"
    assert buffer.feed(" and") == [
        Delta("[1, 2]"),
        CitationEvent(1, 13, 19),
        CitationEvent(2, 13, 19),
        Delta(" and"),
    ]
    assert buffer.feed(" 【") == [Delta(" ")]
    assert buffer.feed("3】") == [Delta("【3】"), CitationEvent(3, 24, 27)]
    assert buffer.finish() == []


def test_held_text_is_released_at_the_end() -> None:
    buffer = MarkerBuffer(3)
    assert buffer.feed("See [1") == [Delta("See ")]
    assert buffer.finish() == [Delta("[1")]
    assert buffer.result().referenced_indices == ()


def test_invalid_marker_is_never_shown_when_stripping() -> None:
    buffer = MarkerBuffer(3, strip_invalid=True)
    events = buffer.feed("Costs fell [1][9")
    events += buffer.feed("9]. Done [99]")
    events += buffer.finish()
    assert "".join(e.text for e in events if isinstance(e, Delta)) == "Costs fell [1]. Done "
    assert buffer.result().invalid_indices == (99,)


def test_code_state_carries_across_pieces() -> None:
    buffer = MarkerBuffer(3)
    events = []
    for piece in ["Run:\n``", "`sh\necho [", "1]\n`", "``\nDone [", "2]."]:
        events += buffer.feed(piece)
    events += buffer.finish()
    assert [e.index for e in events if isinstance(e, CitationEvent)] == [2]


def test_plain_text_flows_while_a_code_span_is_open() -> None:
    # The closing backtick decides nothing about text without brackets, so it is not held.
    buffer = MarkerBuffer(3)
    assert buffer.feed("Call `make") == [Delta("Call `make")]
    assert buffer.feed(" [1]") == [Delta(" ")]
    assert buffer.feed("` now [2]") == [Delta("[1]` now ")]
    assert buffer.finish() == [Delta("[2]"), CitationEvent(2, 20, 23)]


def test_feed_after_finish_is_an_error() -> None:
    buffer = MarkerBuffer(1)
    buffer.finish()
    try:
        buffer.feed("x")
    except RuntimeError:
        return
    raise AssertionError("feed() after finish() was accepted")
