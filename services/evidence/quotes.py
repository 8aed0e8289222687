"""Candidate quotes in a chunk: windows of one to three adjacent sentences, with locations."""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass

from services.citations import RetrievedChunk, SourceLocation
from services.citations.spans import sentence_ranges
from services.documents.extracted import DocumentKind

# A quote is "one or a few sentences": at most this many, and at most QUOTE_MAX_CHARS long
# unless a single sentence is longer by itself.
MAX_WINDOW_SENTENCES = 3
QUOTE_MAX_CHARS = 600
_BLANK_LINE = re.compile(r"\n[ \t]*\n")


@dataclass(frozen=True, slots=True)
class Window:
    """Sentences first..last of a chunk (indices into its sentence list), [start, end) in it."""

    first: int
    last: int
    start: int
    end: int


def sentences_of(text: str) -> list[tuple[int, int]]:
    """The sentences of a chunk's text; a chunk without any gives one range over its text."""
    ranges = sentence_ranges(text)
    if not ranges and text.strip():
        start = len(text) - len(text.lstrip())
        ranges = [(start, len(text.rstrip()))]
    return ranges


def windows_of(sentences: list[tuple[int, int]], text: str = "") -> list[Window]:
    """Windows of adjacent sentences; a window never crosses a blank line (a paragraph break)."""
    out: list[Window] = []
    for first in range(len(sentences)):
        for last in range(first, min(first + MAX_WINDOW_SENTENCES, len(sentences))):
            start, end = sentences[first][0], sentences[last][1]
            if last > first and end - start > QUOTE_MAX_CHARS:
                break
            if last > first and _BLANK_LINE.search(
                text, sentences[last - 1][1], sentences[last][0]
            ):
                break
            out.append(Window(first, last, start, end))
    return out


# The formats whose extracted text is the file, line for line. In HTML the extracted text's line
# breaks are not the markup's (a paragraph over five lines of markup is one line of text):
# counted from the text, 25 of 25 quotes of two HTML manuals were given lines 1 to 15 above their
# own. There a quote's lines come from the chunk's line marks, or are the chunk's lines (which
# hold it) for a chunk stored without them.
LINES_ARE_THE_TEXTS = frozenset(
    {DocumentKind.TEXT.content_type, DocumentKind.MARKDOWN.content_type}
)


def quote_location(chunk: RetrievedChunk, start: int, end: int) -> SourceLocation:
    """Where chunk.text[start:end] sits in the document, given where the chunk sits.

    Offsets move by the quote's position in the chunk, in code points and in UTF-8 bytes. Lines
    move by the line breaks before it where the text's lines are the file's (plain text,
    Markdown), are read from the chunk's line marks ((offset, line) pairs, flattened) where it
    has them, and stay the chunk's otherwise. Pages and heading stay the chunk's: a chunk does
    not record where its pages break.
    """
    location, marks = chunk.location, chunk.line_marks
    before = chunk.text[:start]
    quote = chunk.text[start:end]
    start_line, end_line = location.start_line, location.end_line
    if start_line and chunk.content_type in LINES_ARE_THE_TEXTS:
        start_line += before.count("\n")
        end_line = start_line + quote.count("\n")
    elif start_line and marks:
        offsets, lines = marks[0::2], marks[1::2]
        start_line = lines[max(bisect.bisect_right(offsets, start) - 1, 0)]
        end_line = lines[max(bisect.bisect_right(offsets, max(start, end - 1)) - 1, 0)]
    has_bytes = location.end_byte > 0
    start_byte = location.start_byte + len(before.encode("utf-8", "surrogatepass"))
    end_byte = start_byte + len(quote.encode("utf-8", "surrogatepass"))
    return SourceLocation(
        start_offset=location.start_offset + start,
        end_offset=location.start_offset + end,
        start_line=start_line,
        end_line=end_line,
        page_start=location.page_start,
        page_end=location.page_end,
        heading=location.heading,
        start_byte=start_byte if has_bytes else 0,
        end_byte=end_byte if has_bytes else 0,
    )
