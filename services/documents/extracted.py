"""Document kinds, extracted text with its structure, parse limits and parse errors."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from enum import StrEnum
from typing import ClassVar, NamedTuple


class DocumentKind(StrEnum):
    TEXT = "text"
    MARKDOWN = "markdown"
    HTML = "html"
    PDF = "pdf"
    DOCX = "docx"

    @property
    def content_type(self) -> str:
        return _CONTENT_TYPES[self]


_CONTENT_TYPES = {
    DocumentKind.TEXT: "text/plain",
    DocumentKind.MARKDOWN: "text/markdown",
    DocumentKind.HTML: "text/html",
    DocumentKind.PDF: "application/pdf",
    DocumentKind.DOCX: "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
}

SUPPORTED_KINDS_TEXT = "plain text, Markdown, HTML, PDF, DOCX"


class Heading(NamedTuple):
    """A heading at `offset` (code points into the extracted text); level 0 is a DOCX Title."""

    offset: int
    level: int
    title: str


class LineMark(NamedTuple):
    """From `offset` (code points into the extracted text) on, the text comes from `line` of the
    file (1-based); used where extraction changes the lines (HTML)."""

    offset: int
    line: int


class PageSpan(NamedTuple):
    """One page's text as [start, end) code-point offsets into the extracted text."""

    start: int
    end: int


@dataclass(frozen=True, slots=True)
class ExtractedText:
    kind: DocumentKind
    text: str
    pages: tuple[PageSpan, ...] = ()
    headings: tuple[Heading, ...] = ()
    encoding: str | None = None
    # HTML: where the text sits in the markup's lines. Plain text and Markdown need none (their
    # lines are the file's); PDF and DOCX have no lines of the file.
    line_marks: tuple[LineMark, ...] = ()
    # DOCX: the start offset of each paragraph (a table counts as one), in document order.
    paragraphs: tuple[int, ...] = ()

    @property
    def has_file_lines(self) -> bool:
        return self.kind in (DocumentKind.TEXT, DocumentKind.MARKDOWN, DocumentKind.HTML)

    @property
    def page_count(self) -> int | None:
        return len(self.pages) if self.pages else None


@dataclass(frozen=True, slots=True)
class ParseLimits:
    max_input_bytes: int = 100 * 1024 * 1024
    max_chars: int = 10_000_000
    max_pages: int = 5_000
    max_seconds: float = 120.0
    max_zip_members: int = 5_000
    max_uncompressed_bytes: int = 256 * 1024 * 1024
    # Real DOCX XML compresses 5-30x; bombs compress 1000x and more.
    max_compression_ratio: float = 200.0
    # Tiny members compress absurdly well in normal files, so the ratio is only judged above this.
    ratio_check_min_bytes: int = 1024 * 1024


class DocumentParseError(Exception):
    """A document that cannot be turned into text; `message` is meant for the uploader."""

    reason: ClassVar[str] = "DOCUMENT_PARSE_ERROR"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class UnsupportedDocument(DocumentParseError):
    reason: ClassVar[str] = "UNSUPPORTED_DOCUMENT"


class CorruptDocument(DocumentParseError):
    reason: ClassVar[str] = "CORRUPT_DOCUMENT"


class EmptyDocument(DocumentParseError):
    reason: ClassVar[str] = "EMPTY_DOCUMENT"


class DocumentTooLarge(DocumentParseError):
    reason: ClassVar[str] = "DOCUMENT_TOO_LARGE"


# Postgres text rejects NUL and UTF-8 rejects lone surrogates, so neither may reach storage.
_DROPPED_CONTROLS = re.compile("[\x00-\x08\x0e-\x1f\x7f]")
_LINE_BREAKS = re.compile("\r\n?|[\x0b\x0c\x85\u2028\u2029]")
_SURROGATES = re.compile("[\ud800-\udfff]")


def normalize_text(text: str) -> str:
    """Unify line breaks to \\n and drop characters that storage or line counting trip over."""
    text = _LINE_BREAKS.sub("\n", text)
    text = _DROPPED_CONTROLS.sub("", text)
    return _SURROGATES.sub("\ufffd", text)


# Titles end up in every chunk's heading path and in citations; a paragraph styled as a
# heading must not turn into a kilobyte-long path entry.
MAX_TITLE_CHARS = 200


def heading_title(raw: str) -> str:
    """Collapse whitespace and cut an over-long title at a word boundary."""
    title = " ".join(raw[: MAX_TITLE_CHARS * 4].split())
    if len(title) <= MAX_TITLE_CHARS:
        return title
    cut = title.rfind(" ", 0, MAX_TITLE_CHARS)
    return title[: cut if cut > 0 else MAX_TITLE_CHARS - 1].rstrip() + "…"


class Budget:
    """The time and text budget of one extraction, checked between units of work."""

    def __init__(self, limits: ParseLimits) -> None:
        self.limits = limits
        self._deadline = time.monotonic() + limits.max_seconds
        self._chars = 0

    def check_time(self) -> None:
        if time.monotonic() > self._deadline:
            raise DocumentTooLarge(
                f"extracting the text took longer than {self.limits.max_seconds:g} seconds; "
                "split the document into smaller files"
            )

    def add_chars(self, count: int) -> None:
        self._chars += count
        if self._chars > self.limits.max_chars:
            raise DocumentTooLarge(
                f"the document has more than {self.limits.max_chars:,} characters of text; "
                "split it into smaller files"
            )
