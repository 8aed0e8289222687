"""PDF text per page with pypdf, with the outline (bookmarks) as headings."""

from __future__ import annotations

import io
import logging
import re
from collections.abc import Iterator
from typing import Any

from pypdf import PasswordType, PdfReader

from services.documents.extracted import (
    Budget,
    CorruptDocument,
    DocumentTooLarge,
    EmptyDocument,
    Heading,
    PageSpan,
    UnsupportedDocument,
    heading_title,
    normalize_text,
)

_log = logging.getLogger(__name__)

PAGE_SEPARATOR = "\n\n"
_MAX_OUTLINE_ITEMS = 10_000
_MAX_OUTLINE_DEPTH = 16


def extract_pdf(
    data: bytes, budget: Budget
) -> tuple[str, tuple[PageSpan, ...], tuple[Heading, ...]]:
    """Return the text of every page, each page's span in it, and the outline as headings."""
    # pypdf raises a wide and version-dependent set of exceptions on damaged files, so every
    # call into it is guarded and mapped onto a parse error.
    try:
        reader = PdfReader(io.BytesIO(data), strict=False)
        encrypted = reader.is_encrypted
    except Exception as err:
        raise CorruptDocument("the PDF could not be read; it may be damaged or truncated") from err
    if encrypted:
        _decrypt_with_empty_password(reader)
    try:
        page_count = len(reader.pages)
    except Exception as err:
        raise CorruptDocument("the PDF's page list could not be read; it may be damaged") from err
    if page_count == 0:
        raise EmptyDocument("the PDF has no pages")
    if page_count > budget.limits.max_pages:
        raise DocumentTooLarge(
            f"the PDF has {page_count:,} pages, more than the limit of "
            f"{budget.limits.max_pages:,}; split it into smaller files"
        )

    parts: list[str] = []
    length = 0
    pages: list[PageSpan] = []
    failed = 0
    for index in range(page_count):
        budget.check_time()
        try:
            page_text = reader.pages[index].extract_text()
        except Exception:
            # One broken content stream should not cost the reader every other page.
            _log.warning("pdf page %d: text extraction failed", index + 1, exc_info=True)
            failed += 1
            page_text = ""
        page_text = _tidy_page(page_text)
        budget.add_chars(len(page_text))
        if page_text:
            if parts:
                parts.append(PAGE_SEPARATOR)
                length += len(PAGE_SEPARATOR)
            parts.append(page_text)
            pages.append(PageSpan(length, length + len(page_text)))
            length += len(page_text)
        else:
            pages.append(PageSpan(length, length))
    if failed == page_count:
        raise CorruptDocument("no page of the PDF could be read; it may be damaged")
    text = "".join(parts)
    if not text.strip():
        raise EmptyDocument(
            "the PDF contains no extractable text (it may be scanned images; OCR is not supported)"
        )
    return text, tuple(pages), _outline_headings(reader, text, pages, budget)


def _decrypt_with_empty_password(reader: PdfReader) -> None:
    # Many PDFs are encrypted only to set permissions and open with an empty user password.
    try:
        result = reader.decrypt("")
    except Exception as err:
        raise UnsupportedDocument(
            "the PDF is encrypted in a way that cannot be opened; upload a copy without encryption"
        ) from err
    if result == PasswordType.NOT_DECRYPTED:
        raise UnsupportedDocument("the PDF is password-protected; upload a copy without a password")


def _tidy_page(page_text: str | None) -> str:
    lines = normalize_text(page_text or "").split("\n")
    return "\n".join(line.rstrip() for line in lines).strip("\n")


def _outline_headings(
    reader: PdfReader, text: str, pages: list[PageSpan], budget: Budget
) -> tuple[Heading, ...]:
    """Place each bookmark at its title's line on its page, else at the top of the page."""
    headings: list[Heading] = []
    try:
        for level, item in _walk_outline(reader.outline, 1):
            budget.check_time()
            title = heading_title(str(item.title or ""))
            page_number = reader.get_destination_page_number(item)
            if not title or page_number is None or not 0 <= page_number < len(pages):
                continue
            headings.append(Heading(_locate(text, pages[page_number], title), level, title))
            if len(headings) >= _MAX_OUTLINE_ITEMS:
                break
    except DocumentTooLarge:
        raise
    except Exception:
        # The outline is a convenience; a broken one must not fail an otherwise readable PDF.
        _log.warning("pdf outline could not be read", exc_info=True)
        return ()
    headings.sort(key=lambda heading: heading.offset)
    return tuple(headings)


def _walk_outline(items: Any, level: int) -> Iterator[tuple[int, Any]]:
    # pypdf nests a bookmark's children as a list right after the bookmark.
    if level > _MAX_OUTLINE_DEPTH:
        return
    for item in items:
        if isinstance(item, list):
            yield from _walk_outline(item, level + 1)
        else:
            yield level, item


def _locate(text: str, page: PageSpan, title: str) -> int:
    # PDF text often breaks or re-spaces a title, so match its words with any whitespace between.
    pattern = r"\s+".join(re.escape(word) for word in title.split())
    found = re.search(pattern, text[page.start : page.end], re.IGNORECASE)
    if found is None:
        return page.start
    return _line_start(text, page.start, page.start + found.start())


def _line_start(text: str, floor: int, offset: int) -> int:
    newline = text.rfind("\n", floor, offset)
    return floor if newline < 0 else newline + 1
