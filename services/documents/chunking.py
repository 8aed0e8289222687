"""Structure-aware chunking of extracted text, with offsets, lines, pages and heading paths."""

from __future__ import annotations

import bisect
import re
from collections.abc import Sequence
from dataclasses import dataclass

from services.documents.extracted import ExtractedText, Heading


@dataclass(frozen=True, slots=True)
class Chunk:
    """A slice of the extracted text: text == extracted.text[start_offset:end_offset].

    Offsets are code points of the extracted text, end exclusive; start_byte and end_byte
    are the same range in UTF-8 bytes. Lines are 1-based, inclusive
    lines of the uploaded file (plain text, Markdown, HTML markup), 0 for PDF and DOCX, which
    have none. Pages are 1-based and inclusive, None for documents without pages. Paragraphs
    are 1-based, inclusive numbers of a DOCX body's non-empty paragraphs (a table counts as
    one), None for other formats.
    """

    index: int
    text: str
    start_offset: int
    end_offset: int
    start_line: int
    end_line: int
    page_start: int | None
    page_end: int | None
    heading_path: tuple[str, ...]
    start_byte: int = 0
    end_byte: int = 0
    paragraph_start: int | None = None
    paragraph_end: int | None = None
    # Where the text's lines of the file change, as (offset into text, line) pairs flattened;
    # empty where the text's own line breaks give them (plain text, Markdown) or there are none.
    line_marks: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class _Section:
    start: int
    end: int
    # The level of the heading the section starts with; a folded section starts with its parent's.
    lead_level: int
    path: tuple[str, ...]
    # Where the line of the heading that gives the path ends.
    heading_end: int


# Split points from coarse to fine: blank lines, sentence ends, line breaks, whitespace. Each
# pattern matches the separator that is left out between two pieces.
_PARAGRAPH_GAP = re.compile(r"\n[ \t]*\n\s*")
_LINE_GAP = re.compile(r"\n\s*")
# Closing quotes and brackets stay with their sentence; CJK sentences need no space after them.
_SENTENCE_GAP = re.compile(
    r"(?:(?<=[.!?…])|(?<=[.!?…][\"'”’»)\]]))\s+"
    r"|(?:(?<=[。！？])|(?<=[。！？][」』）\"”’]))(?![」』）\"”’])\s*"
)
_WORD_GAP = re.compile(r"\s+")
_LEVELS = (_PARAGRAPH_GAP, _SENTENCE_GAP, _LINE_GAP, _WORD_GAP)
_WORD_START = re.compile(r"(?<=\s)\S")
_SETEXT_UNDERLINE = re.compile(r"[ \t]*(?:=+|-+)[ \t]*")


def chunk(
    extracted: ExtractedText, *, max_chars: int = 1200, overlap_chars: int = 200
) -> list[Chunk]:
    """Cut the text into chunks of at most max_chars, never across a heading if avoidable.

    Within a section, consecutive chunks share up to overlap_chars of text, starting at a
    sentence or word boundary where one exists.
    """
    if max_chars < 1:
        raise ValueError("max_chars must be at least 1")
    if not 0 <= overlap_chars < max_chars:
        raise ValueError("overlap_chars must be at least 0 and less than max_chars")
    text = extracted.text
    spans: list[tuple[int, int, tuple[str, ...]]] = []
    for section in _sections(text, extracted.headings, max_chars):
        units = _units(text, section.start, section.end, max_chars, 0)
        for start, end in _pack(text, units, max_chars, overlap_chars):
            spans.append((start, end, section.path))

    locate = _Locator(extracted)
    chunks: list[Chunk] = []
    for index, (start, end, path) in enumerate(spans):
        page_start, page_end = locate.pages(start, end)
        paragraph_start, paragraph_end = locate.paragraphs(start, end)
        chunks.append(
            Chunk(
                index=index,
                text=text[start:end],
                start_offset=start,
                end_offset=end,
                start_line=locate.line(start),
                end_line=locate.line(end - 1),
                page_start=page_start,
                page_end=page_end,
                heading_path=path,
                start_byte=locate.byte(start),
                end_byte=locate.byte(end),
                paragraph_start=paragraph_start,
                paragraph_end=paragraph_end,
                line_marks=locate.marks(start, end),
            )
        )
    return chunks


def _sections(text: str, headings: Sequence[Heading], max_chars: int) -> list[_Section]:
    """One section per heading plus the text before the first; each carries its heading path."""
    ordered = sorted(
        (h for h in headings if 0 <= h.offset <= len(text)), key=lambda heading: heading.offset
    )
    sections: list[_Section] = []
    if not ordered or ordered[0].offset > 0:
        sections.append(_Section(0, ordered[0].offset if ordered else len(text), -1, (), 0))
    stack: list[Heading] = []
    for number, heading in enumerate(ordered):
        while stack and stack[-1].level >= heading.level:
            stack.pop()
        stack.append(heading)
        end = ordered[number + 1].offset if number + 1 < len(ordered) else len(text)
        path = tuple(entry.title for entry in stack)
        line_end = text.find("\n", heading.offset, end)
        _, heading_end = _trim(text, heading.offset, end if line_end < 0 else line_end)
        sections.append(_Section(heading.offset, end, heading.level, path, heading_end))
    return _fold_bare_headings(text, sections, max_chars)


def _fold_bare_headings(text: str, sections: list[_Section], max_chars: int) -> list[_Section]:
    """Join a heading with nothing under it to the subsection that follows it.

    "# Guide" directly followed by "## Install" would otherwise be a chunk of two words; the
    subsection's heading path already names the parent. Only done when the first chunk still
    reaches the subsection's heading, so that no chunk carries a path it does not contain.
    """
    folded: list[_Section] = []
    for section in reversed(sections):
        following = folded[-1] if folded else None
        if (
            following is not None
            and section.path
            and following.lead_level > section.lead_level
            and following.heading_end - section.start <= max_chars
            and _is_bare_heading(text[section.start : section.end])
        ):
            folded[-1] = _Section(
                section.start,
                following.end,
                section.lead_level,
                following.path,
                following.heading_end,
            )
        else:
            folded.append(section)
    folded.reverse()
    return folded


def _is_bare_heading(section_text: str) -> bool:
    lines = section_text.strip().split("\n")
    return len(lines) == 1 or (
        len(lines) == 2 and _SETEXT_UNDERLINE.fullmatch(lines[1]) is not None
    )


def _units(text: str, start: int, end: int, max_chars: int, level: int) -> list[tuple[int, int]]:
    """Trimmed pieces of text[start:end], each at most max_chars, split as coarsely as possible."""
    start, end = _trim(text, start, end)
    if start >= end:
        return []
    if end - start <= max_chars:
        return [(start, end)]
    if level == len(_LEVELS):
        # A run with no whitespace at all (a URL, base64, CJK without punctuation).
        return [(cut, min(cut + max_chars, end)) for cut in range(start, end, max_chars)]
    pieces: list[tuple[int, int]] = []
    position = start
    for gap in _LEVELS[level].finditer(text, start, end):
        pieces.extend(_units(text, position, gap.start(), max_chars, level + 1))
        position = gap.end()
    pieces.extend(_units(text, position, end, max_chars, level + 1))
    return pieces


def _pack(
    text: str, units: list[tuple[int, int]], max_chars: int, overlap_chars: int
) -> list[tuple[int, int]]:
    """Merge neighbouring units greedily; each chunk after the first overlaps the one before."""
    spans: list[tuple[int, int]] = []
    index = 0
    while index < len(units):
        start = units[index][0]
        if spans and overlap_chars:
            previous_start, previous_end = spans[-1]
            # The overlap must fit in front of the first new unit and must move forward.
            floor = max(
                previous_end - overlap_chars, units[index][1] - max_chars, previous_start + 1
            )
            overlap_start = _boundary_at_or_after(text, floor, previous_end)
            if overlap_start is not None:
                start = overlap_start
        end = units[index][1]
        index += 1
        while index < len(units) and units[index][1] - start <= max_chars:
            end = units[index][1]
            index += 1
        spans.append((start, end))
    return spans


def _boundary_at_or_after(text: str, floor: int, limit: int) -> int | None:
    """The first paragraph or sentence start in [floor, limit), else the first word start.

    Falls back to the first non-space character, and to None when there is only whitespace.
    """
    if floor >= limit:
        return None
    starts = [
        # Look a little behind the floor so that a gap ending just after it is still seen.
        next(
            (g.end() for g in gaps.finditer(text, max(0, floor - 8), limit) if g.end() >= floor),
            limit,
        )
        for gaps in (_PARAGRAPH_GAP, _SENTENCE_GAP)
    ]
    if min(starts) < limit:
        return min(starts)
    word = _WORD_START.search(text, floor, limit)
    if word is not None:
        return word.start()
    for position in range(floor, limit):
        if not text[position].isspace():
            return position
    return None


def _trim(text: str, start: int, end: int) -> tuple[int, int]:
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return start, end


class _Locator:
    """Maps offsets of the extracted text to lines of the file, pages and paragraphs."""

    def __init__(self, extracted: ExtractedText) -> None:
        self._kind_has_lines = extracted.has_file_lines
        self._marks = extracted.line_marks
        self._mark_offsets = [mark.offset for mark in extracted.line_marks]
        self._newlines = [match.start() for match in re.finditer("\n", extracted.text)]
        self._text = extracted.text
        # UTF-8 length of text[:offset], advanced lazily; chunk offsets mostly ascend.
        self._cp = 0
        self._byte = 0
        self._page_starts = [page[0] for page in extracted.pages]
        self._page_ends = [page[1] for page in extracted.pages]
        self._paragraphs = list(extracted.paragraphs)

    def byte(self, offset: int) -> int:
        """The UTF-8 byte offset of a code-point offset."""
        if offset < self._cp:
            self._byte -= len(self._text[offset : self._cp].encode("utf-8", "surrogatepass"))
        else:
            self._byte += len(self._text[self._cp : offset].encode("utf-8", "surrogatepass"))
        self._cp = offset
        return self._byte

    def marks(self, start: int, end: int) -> tuple[int, ...]:
        """The line marks of text[start:end], offsets made relative to start, flattened; the
        first says the line at start. Empty where the text's line breaks are the file's."""
        if not self._kind_has_lines or not self._marks:
            return ()
        first = max(bisect.bisect_right(self._mark_offsets, start) - 1, 0)
        last = bisect.bisect_left(self._mark_offsets, end)
        pairs = [(0, self._marks[first].line)]
        pairs += [(m.offset - start, m.line) for m in self._marks[first + 1 : last]]
        return tuple(value for pair in pairs for value in pair)

    def line(self, offset: int) -> int:
        if not self._kind_has_lines:
            return 0
        if self._marks:
            found = bisect.bisect_right(self._mark_offsets, offset) - 1
            return self._marks[max(found, 0)].line
        return bisect.bisect_left(self._newlines, offset) + 1

    def pages(self, start: int, end: int) -> tuple[int | None, int | None]:
        if not self._page_starts:
            return None, None
        last = len(self._page_starts) - 1
        first_page = min(bisect.bisect_right(self._page_ends, start), last)
        last_page = max(bisect.bisect_left(self._page_starts, end) - 1, first_page)
        return first_page + 1, last_page + 1

    def paragraphs(self, start: int, end: int) -> tuple[int | None, int | None]:
        if not self._paragraphs:
            return None, None
        first = max(bisect.bisect_right(self._paragraphs, start), 1)
        last = max(bisect.bisect_left(self._paragraphs, end), first)
        return first, last
