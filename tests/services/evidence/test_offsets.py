"""Code-point and UTF-8 byte offsets of answer sentences, quotes and chunks."""

from hypothesis import given
from hypothesis import strategies as st

from services.citations import (
    RetrievedChunk,
    ScoreKind,
    SourceLocation,
    answer_sentences,
    extract,
)
from services.citations.spans import ByteOffsets
from services.documents.chunking import chunk
from services.documents.extracted import DocumentKind, ExtractedText
from services.documents.parsing import parse
from services.evidence.quotes import quote_location

MIXED = "Le café coûte 3 € [1]. 東京は日本の首都です。[2] Emoji 🎉 party 👩‍👩‍👧 here [1]. Plain."


def test_sentence_byte_offsets_match_the_utf8_encoding() -> None:
    result = extract(MIXED, 2)
    sentences = answer_sentences(result.text, result.markers)
    assert [s.source_indices for s in sentences] == [(1,), (2,), (1,), ()]
    encoded = result.text.encode()
    for s in sentences:
        assert s.start_byte == len(result.text[: s.start].encode())
        assert encoded[s.start_byte : s.end_byte].decode() == result.text[s.start : s.end]
    # Accents, CJK and emoji take more bytes than code points.
    assert all(s.end_byte - s.start_byte > s.end - s.start for s in sentences[:3])


@given(st.text(), st.lists(st.integers(0, 200), max_size=20))
def test_byte_offsets_in_any_order(text: str, offsets: list[int]) -> None:
    at = ByteOffsets(text)
    for offset in offsets:
        offset = min(offset, len(text))
        assert at(offset) == len(text[:offset].encode("utf-8", "surrogatepass"))


def chunk_at(
    text: str, location: SourceLocation, content_type: str, line_marks: tuple[int, ...] = ()
) -> RetrievedChunk:
    return RetrievedChunk(
        chunk_id="c",
        document_id="d",
        document_name="doc",
        content_type=content_type,
        chunk_index=0,
        text=text,
        score=1.0,
        score_kind=ScoreKind.FUSED,
        location=location,
        line_marks=line_marks,
    )


def test_quote_location_moves_offsets_lines_and_bytes() -> None:
    document = "Intro ☕ line.\nÀ Tōkyō, 東京.\nLe café coûte 500 円 ☕.\nEnd."
    start = document.index("À")
    chunk_text = document[start:]
    loc = SourceLocation(
        start_offset=start,
        end_offset=len(document),
        start_line=2,
        end_line=4,
        heading="Cafés",
        start_byte=len(document[:start].encode()),
        end_byte=len(document.encode()),
    )
    q_start = chunk_text.index("Le café")
    q_end = chunk_text.index("☕.") + 2
    got = quote_location(chunk_at(chunk_text, loc, "text/plain"), q_start, q_end)
    quote = chunk_text[q_start:q_end]
    assert document[got.start_offset : got.end_offset] == quote
    assert document.encode()[got.start_byte : got.end_byte] == quote.encode()
    assert (got.start_line, got.end_line, got.heading) == (3, 3, "Cafés")


def test_an_html_quote_keeps_the_chunks_lines() -> None:
    # Lines of the markup, not of the extracted text: three paragraphs on the first line of
    # markup are five lines of text.
    markup = "<p>Intro.</p><p>Middle.</p><p>More.</p>\n<p>Last.</p>\n"
    extracted = parse(markup.encode(), "text/html")
    piece = chunk(extracted, max_chars=400, overlap_chars=0)[0]
    loc = SourceLocation(
        start_offset=piece.start_offset,
        end_offset=piece.end_offset,
        start_line=piece.start_line,
        end_line=piece.end_line,
    )
    q_start = piece.text.index("Last")
    marked = chunk_at(piece.text, loc, "text/html", piece.line_marks)
    # The chunk's line marks place it on its own line; a chunk stored without them gives its
    # own lines, which hold it.
    got = quote_location(marked, q_start, q_start + 5)
    assert (got.start_line, got.end_line) == (2, 2)
    middle = piece.text.index("Middle")
    got = quote_location(marked, middle, middle + 7)
    assert (got.start_line, got.end_line) == (1, 1)
    got = quote_location(chunk_at(piece.text, loc, "text/html"), q_start, q_start + 5)
    assert (got.start_line, got.end_line) == (piece.start_line, piece.end_line) == (1, 2)
    # Counted from the text, "Last." would sit on line 7 of a file of two lines.
    assert (
        quote_location(chunk_at(piece.text, loc, "text/plain"), q_start, q_start + 5).start_line
        == 7
    )


def test_quote_location_without_recorded_bytes_reports_none() -> None:
    loc = SourceLocation(start_offset=10, end_offset=20, start_line=1, end_line=1)
    got = quote_location(chunk_at("café au lait", loc, "text/plain"), 5, 7)
    assert (got.start_offset, got.end_offset, got.start_byte, got.end_byte) == (15, 17, 0, 0)


def test_chunks_record_byte_offsets() -> None:
    text = ("Ünïcödé ✓ text 東京 🎉. " * 40 + "\n\n") * 5
    pieces = chunk(
        ExtractedText(kind=DocumentKind.TEXT, text=text), max_chars=300, overlap_chars=50
    )
    assert len(pieces) > 3
    encoded = text.encode()
    for p in pieces:
        assert p.start_byte == len(text[: p.start_offset].encode())
        assert encoded[p.start_byte : p.end_byte].decode() == p.text
