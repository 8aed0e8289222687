"""CitationSource.formatted in each style."""

from services.citations import (
    CitationSource,
    CitationStyle,
    SourceLocation,
    apply_style,
    format_source,
)


def source(index=1, name="guide.md", content_type="text/markdown", chunk_id="1b9d6bcd-bbfd", **loc):
    return CitationSource(
        index, "doc", name, content_type, 0.5, "", chunk_id, 0, SourceLocation(**loc)
    )


def test_inline() -> None:
    assert format_source(source(heading="Install"), CitationStyle.INLINE) == "[guide.md, §Install]"
    assert format_source(source(page_start=4, heading="A > B"), CitationStyle.INLINE) == (
        "[guide.md, p. 4, §A > B]"
    )
    assert format_source(source(), CitationStyle.UNSPECIFIED) == "[guide.md]"


def test_footnote() -> None:
    assert (
        format_source(source(start_line=42), CitationStyle.FOOTNOTE) == "[^1b9d6bcd]: guide.md:42"
    )
    assert format_source(source(name="r.pdf", page_start=3), CitationStyle.FOOTNOTE) == (
        "[^1b9d6bcd]: r.pdf, p. 3"
    )
    assert format_source(source(), CitationStyle.FOOTNOTE) == "[^1b9d6bcd]: guide.md"


def test_footnote_labels_stay_unique() -> None:
    styled = apply_style(
        [
            source(1, chunk_id="chunk-000001"),
            source(2, chunk_id="chunk-000002"),
            source(3, chunk_id="other id"),
        ],
        CitationStyle.FOOTNOTE,
    )
    labels = [s.formatted.split("]")[0] for s in styled]
    assert labels == ["[^chunk-000001", "[^chunk-000002", "[^other-id"]


def test_markdown_links_lines_and_pdf_pages() -> None:
    md = source(start_line=42)
    pdf = source(name="Q3 [final].pdf", content_type="application/pdf", page_start=4, start_line=9)
    assert (
        format_source(md, CitationStyle.MARKDOWN, link="https://h/d")
        == "[guide.md](https://h/d#L42)"
    )
    assert format_source(pdf, CitationStyle.MARKDOWN, link="https://h/p?x=1") == (
        "[Q3 \\[final\\].pdf](https://h/p?x=1#page=4)"
    )
    assert (
        format_source(md, CitationStyle.MARKDOWN, link="https://h/d#top")
        == "[guide.md](https://h/d#top)"
    )
    assert format_source(source(), CitationStyle.MARKDOWN, link="https://h/a b") == (
        "[guide.md](<https://h/a b>)"
    )


def test_markdown_without_a_link_falls_back_to_inline() -> None:
    assert format_source(source(start_line=42), CitationStyle.MARKDOWN) == "[guide.md]"


def test_apply_style_links_markdown_to_the_download_url() -> None:
    with_url = CitationSource(
        1, "d", "a.md", "text/markdown", 0.5, "", "c1", 0, download_url="https://u"
    )
    other = source(2)
    styled = apply_style([with_url, other], CitationStyle.MARKDOWN)
    assert [s.formatted for s in styled] == ["[a.md](https://u)", "[guide.md]"]
