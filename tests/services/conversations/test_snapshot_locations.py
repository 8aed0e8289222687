"""Locations with paragraph numbers reach the proto and stored history, and old history loads."""

from __future__ import annotations

from services.citations import Citations, CitationSource, CitationStyle, SourceLocation
from services.conversations.convert import source_to_proto
from services.conversations.snapshot import citations_from_json, citations_to_json


def source(location: SourceLocation) -> CitationSource:
    return CitationSource(
        index=1,
        document_id="d",
        document_name="policy.docx",
        content_type="application/vnd.openxmlformats-officedocument.wordprocessingml.document",
        score=0.5,
        excerpt="...",
        chunk_id="c",
        chunk_index=3,
        location=location,
    )


def test_paragraphs_round_trip_through_history_and_reach_the_proto() -> None:
    location = SourceLocation(start_offset=10, end_offset=90, heading="Leave", paragraph_start=4,
                              paragraph_end=6)  # fmt: skip
    citations = Citations((source(location),), (1,), (), ())
    loaded, _ = citations_from_json(citations_to_json(citations, CitationStyle.INLINE))
    assert loaded.sources[0].location == location
    proto = source_to_proto(loaded.sources[0])
    assert (proto.location.paragraph_start, proto.location.paragraph_end) == (4, 6)
    assert proto.location.start_line == 0 and list(proto.location.heading_path) == ["Leave"]


def test_history_stored_before_paragraphs_existed_still_loads() -> None:
    stored = citations_to_json(
        Citations((source(SourceLocation(start_line=3, end_line=9)),), (1,), (), ()),
        CitationStyle.UNSPECIFIED,
    )
    for item in stored["sources"]:
        del item["location"]["paragraph_start"], item["location"]["paragraph_end"]
    loaded, _ = citations_from_json(stored)
    assert loaded.sources[0].location == SourceLocation(start_line=3, end_line=9)
    assert source_to_proto(loaded.sources[0]).location.paragraph_start == 0
