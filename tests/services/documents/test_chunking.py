"""Structure-aware chunking: sections, sizes, overlap and provenance (offsets, lines, pages)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.documents.chunking import Chunk, chunk
from services.documents.extracted import DocumentKind, ExtractedText, Heading, PageSpan
from services.documents.parsing import parse
from tests.fixtures.documents.samples import FIXTURES, handbook_docx, multipage_pdf


def _plain(text: str, headings: tuple[Heading, ...] = ()) -> ExtractedText:
    return ExtractedText(kind=DocumentKind.TEXT, text=text, headings=headings)


def _containing(chunks: list[Chunk], needle: str) -> Chunk:
    return next(c for c in chunks if needle in c.text)


def assert_invariants(
    extracted: ExtractedText, chunks: list[Chunk], max_chars: int, overlap_chars: int
) -> None:
    text = extracted.text
    covered = [False] * len(text)
    for position, c in enumerate(chunks):
        assert c.index == position
        assert c.text == text[c.start_offset : c.end_offset]
        assert c.text.strip() == c.text != ""
        assert len(c.text) <= max_chars
        if extracted.kind in (DocumentKind.TEXT, DocumentKind.MARKDOWN):
            # The extracted text of plain text and Markdown is the file, line for line.
            assert c.start_line == text.count("\n", 0, c.start_offset) + 1
            assert c.end_line == text.count("\n", 0, c.end_offset - 1) + 1
        elif not extracted.has_file_lines:
            # PDF and DOCX have no lines of the file; pages or paragraphs place the chunk.
            assert c.start_line == c.end_line == 0
        for offset in range(c.start_offset, c.end_offset):
            covered[offset] = True
        if position:
            previous = chunks[position - 1]
            assert previous.start_offset < c.start_offset
            assert previous.end_offset < c.end_offset
            overlap = previous.end_offset - c.start_offset
            assert overlap <= overlap_chars
            if overlap > 0:
                assert previous.heading_path == c.heading_path
        if extracted.pages:
            assert 1 <= c.page_start <= c.page_end <= len(extracted.pages)
            for number, page in enumerate(extracted.pages, start=1):
                if page.start <= c.start_offset < page.end:
                    assert c.page_start == number
                if page.start <= c.end_offset - 1 < page.end:
                    assert c.page_end == number
        else:
            assert c.page_start is None and c.page_end is None
    missed = [i for i, char in enumerate(text) if not char.isspace() and not covered[i]]
    assert missed == []


# --- real documents ---------------------------------------------------------------------------


def test_pdf_chunks_carry_their_pages() -> None:
    extracted = parse(multipage_pdf(3))
    chunks = chunk(extracted, max_chars=300, overlap_chars=60)
    assert_invariants(extracted, chunks, 300, 60)
    for n in (1, 2, 3):
        first = _containing(chunks, f"Chapter {n}")
        assert (first.page_start, first.page_end) == (n, n)
        assert first.heading_path == (f"Chapter {n}",)
        for c in chunks:
            if f"Page {n} explains" in c.text:
                assert c.page_start <= n <= c.page_end
    rollback = _containing(chunks, "Restore the previous release")
    assert rollback.heading_path == ("Chapter 2", "Rollback plan")
    assert rollback.page_start == rollback.page_end == 2
    # The outline splits sections even where pages would not.
    assert not any("Rollback plan" in c.text and "Page 2 explains" in c.text for c in chunks)


def test_markdown_chunks_carry_heading_paths_and_source_lines() -> None:
    source = (FIXTURES / "handbook.md").read_text()
    extracted = parse(source.encode(), "text/markdown")
    chunks = chunk(extracted, max_chars=400, overlap_chars=80)
    assert_invariants(extracted, chunks, 400, 80)
    lines = source.split("\n")
    install = _containing(chunks, "# this is a shell comment")
    assert install.heading_path == ("Operator handbook", "Install")
    assert lines[install.start_line - 1] == "## Install"
    database = _containing(chunks, "pgvector extension")
    assert database.heading_path == ("Operator handbook", "Configuration", "Database")
    assert lines[database.start_line - 1] == "### Database"
    assert lines[database.end_line - 1].endswith("pgvector extension.")
    assert _containing(chunks, "title: Operator handbook").heading_path == ()


def test_docx_chunks_carry_heading_paths() -> None:
    extracted = parse(handbook_docx())
    chunks = chunk(extracted, max_chars=250, overlap_chars=50)
    assert_invariants(extracted, chunks, 250, 50)
    table = _containing(chunks, "Sick | 10 | yes")
    assert table.heading_path == ("Employee Handbook", "Leave", "Sick leave")
    assert _containing(chunks, "travel portal").heading_path == ("Employee Handbook", "Travel")
    assert all(c.page_start is None for c in chunks)


def test_html_chunks_carry_heading_paths() -> None:
    extracted = parse((FIXTURES / "article.html").read_bytes(), "text/html")
    chunks = chunk(extracted)
    assert_invariants(extracted, chunks, 1200, 200)
    steps = _containing(chunks, "make migrate")
    assert steps.heading_path == ("Release notes & upgrade guide", "Upgrade steps")
    assert steps.text.startswith("Upgrade steps")


# --- rules ------------------------------------------------------------------------------------


def test_small_document_is_one_chunk() -> None:
    extracted = _plain("  Hello world.\n\nSecond paragraph.\n\n")
    [only] = chunk(extracted)
    assert only.text == "Hello world.\n\nSecond paragraph."
    assert (only.start_offset, only.start_line, only.end_line) == (2, 1, 3)


def test_blank_text_has_no_chunks() -> None:
    assert chunk(_plain(" \n\t\n ")) == []
    assert chunk(_plain("")) == []


def test_sections_are_never_merged_even_when_small() -> None:
    text = "## A\nalpha\n## B\nbeta\n"
    headings = (Heading(0, 2, "A"), Heading(11, 2, "B"))
    chunks = chunk(_plain(text, headings))
    assert [(c.text, c.heading_path) for c in chunks] == [
        ("## A\nalpha", ("A",)),
        ("## B\nbeta", ("B",)),
    ]


def test_bare_parent_heading_joins_its_first_subsection() -> None:
    text = "# Guide\n\n## Install\n\nRun it.\n\n## Empty\n\n# Next\n\nMore."
    headings = (
        Heading(0, 1, "Guide"),
        Heading(9, 2, "Install"),
        Heading(text.index("## Empty"), 2, "Empty"),
        Heading(text.index("# Next"), 1, "Next"),
    )
    chunks = chunk(_plain(text, headings))
    assert [(c.text, c.heading_path) for c in chunks] == [
        ("# Guide\n\n## Install\n\nRun it.", ("Guide", "Install")),
        ("## Empty", ("Guide", "Empty")),
        ("# Next\n\nMore.", ("Next",)),
    ]


def test_long_paragraph_splits_at_sentences_with_overlap() -> None:
    sentences = [f"Sentence number {n} says something useful." for n in range(40)]
    text = " ".join(sentences)
    chunks = chunk(_plain(text), max_chars=200, overlap_chars=60)
    assert_invariants(_plain(text), chunks, 200, 60)
    assert len(chunks) > 5
    for c in chunks:
        assert c.text.startswith("Sentence number ")
        assert c.text.endswith("useful.")
    assert all(chunks[i].end_offset > chunks[i + 1].start_offset for i in range(len(chunks) - 1))


def test_paragraphs_are_kept_whole_when_they_fit() -> None:
    paragraphs = [f"Paragraph {n}. " + "word " * 30 for n in range(6)]
    text = "\n\n".join(p.strip() for p in paragraphs)
    chunks = chunk(_plain(text), max_chars=400, overlap_chars=0)
    for c in chunks:
        assert c.text.startswith("Paragraph ")
        assert c.text.endswith("word")


def test_huge_token_is_cut_hard() -> None:
    text = "start " + "x" * 1000 + " end"
    chunks = chunk(_plain(text), max_chars=300, overlap_chars=50)
    assert_invariants(_plain(text), chunks, 300, 50)
    assert chunks[0].text == "start"
    assert chunks[-1].text.endswith(" end")


def test_cjk_sentences_split_without_spaces() -> None:
    text = "これは最初の文です。" * 30
    chunks = chunk(_plain(text), max_chars=50, overlap_chars=10)
    assert_invariants(_plain(text), chunks, 50, 10)
    assert all(c.text.endswith("。") for c in chunks)


def test_overlap_stays_within_a_section() -> None:
    body = " ".join(f"Fact {n} is recorded here." for n in range(30))
    text = f"# One\n{body}\n# Two\n{body}"
    headings = (Heading(0, 1, "One"), Heading(text.index("# Two"), 1, "Two"))
    chunks = chunk(_plain(text, headings), max_chars=150, overlap_chars=60)
    assert_invariants(_plain(text, headings), chunks, 150, 60)
    first_of_two = next(c for c in chunks if c.heading_path == ("Two",))
    assert first_of_two.start_offset == text.index("# Two")


def test_chunking_is_deterministic() -> None:
    extracted = parse(multipage_pdf(2))
    assert chunk(extracted, max_chars=200, overlap_chars=40) == chunk(
        extracted, max_chars=200, overlap_chars=40
    )


@pytest.mark.parametrize(("max_chars", "overlap"), [(0, 0), (100, 100), (100, -1)])
def test_bad_sizes_are_rejected(max_chars: int, overlap: int) -> None:
    with pytest.raises(ValueError):
        chunk(_plain("text"), max_chars=max_chars, overlap_chars=overlap)


# --- properties -------------------------------------------------------------------------------

_TEXT = st.text(
    st.one_of(
        st.sampled_from(list("abc xyz.!?\n\n\t ")),
        st.sampled_from(["。", "」", "\u00a0", "\u2028", "é", "\U0001f600"]),
        st.characters(),
    ),
    max_size=1500,
)


@st.composite
def _extracted(draw: st.DrawFn) -> ExtractedText:
    text = draw(_TEXT)
    offsets = sorted(draw(st.lists(st.integers(0, len(text)), max_size=8)))
    headings = tuple(
        Heading(offset, draw(st.integers(0, 6)), draw(st.text(min_size=1, max_size=10)))
        for offset in offsets
    )
    pages: tuple[PageSpan, ...] = ()
    if draw(st.booleans()):
        cuts = sorted(set(draw(st.lists(st.integers(0, len(text)), max_size=6))) | {0, len(text)})
        pages = tuple(PageSpan(a, b) for a, b in itertools.pairwise(cuts))
    return ExtractedText(kind=DocumentKind.PDF, text=text, pages=pages, headings=headings)


@settings(max_examples=300, deadline=None)
@given(extracted=_extracted(), max_chars=st.integers(1, 300), overlap_share=st.floats(0, 0.9))
def test_chunk_invariants_for_any_text(
    extracted: ExtractedText, max_chars: int, overlap_share: float
) -> None:
    overlap = min(int(max_chars * overlap_share), max_chars - 1)
    chunks = chunk(extracted, max_chars=max_chars, overlap_chars=overlap)
    assert_invariants(extracted, chunks, max_chars, overlap)
    assert chunks == chunk(extracted, max_chars=max_chars, overlap_chars=overlap)


_WORDS = st.lists(st.sampled_from(["alpha", "beta", "gamma.", "delta!", "x" * 40]), max_size=60)


@st.composite
def _sectioned(
    draw: st.DrawFn,
) -> tuple[ExtractedText, list[tuple[int, int, bool, tuple[str, ...]]]]:
    """Markdown-like text built from sections, with each section's range and heading path."""
    text = ""
    headings: list[Heading] = []
    sections: list[tuple[int, int, bool, tuple[str, ...]]] = []
    stack: list[Heading] = []
    for number in range(draw(st.integers(1, 6))):
        level = draw(st.integers(1, 4))
        title = f"T{number}"
        heading = Heading(len(text), level, title)
        while stack and stack[-1].level >= level:
            stack.pop()
        stack.append(heading)
        body = " ".join(draw(_WORDS))
        text += f"{'#' * level} {title}\n\n{body}\n\n"
        headings.append(heading)
        sections.append((heading.offset, len(text), bool(body), tuple(h.title for h in stack)))
    extracted = ExtractedText(kind=DocumentKind.MARKDOWN, text=text, headings=tuple(headings))
    return extracted, sections


@settings(max_examples=200, deadline=None)
@given(case=_sectioned(), max_chars=st.integers(20, 200))
def test_chunks_stay_inside_their_section(case, max_chars: int) -> None:
    extracted, sections = case
    chunks = chunk(extracted, max_chars=max_chars, overlap_chars=max_chars // 4)
    assert_invariants(extracted, chunks, max_chars, max_chars // 4)
    for c in chunks:
        touched = [s for s in sections if s[0] < c.end_offset and c.start_offset < s[1]]
        # Only sections that hold nothing but their heading may share a chunk with the next one.
        assert all(not has_body for _, _, has_body, _ in touched[:-1])
        assert c.heading_path == touched[-1][3]
