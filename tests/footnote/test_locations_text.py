"""How the CLI words a source's location: pages, file lines, DOCX paragraphs, headings."""

from footnote.client import describe_location
from footnote.v1 import citations_pb2 as cpb


def source(**location: object) -> cpb.CitationSource:
    return cpb.CitationSource(location=cpb.SourceLocation(**location))


def test_each_format_is_located_in_its_own_units() -> None:
    assert describe_location(source(page_start=4, page_end=5)) == "p. 4-5"
    assert describe_location(source(start_line=12, end_line=14)) == "lines 12-14"
    assert (
        describe_location(
            source(paragraph_start=7, paragraph_end=7, heading_path=["1. Definitions"])
        )
        == "¶ 7, §1. Definitions"
    )
    assert describe_location(source(paragraph_start=3, paragraph_end=9)) == "¶ 3-9"
    assert describe_location(source()) == ""
