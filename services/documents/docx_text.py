"""DOCX text with python-docx: paragraphs, tables and heading styles, after zip-bomb checks."""

from __future__ import annotations

import io
import re
import zipfile
from collections.abc import Iterator
from typing import Any

import docx
from docx.oxml.ns import qn
from docx.table import Table
from docx.text.paragraph import Paragraph

from services.documents.extracted import (
    Budget,
    CorruptDocument,
    DocumentParseError,
    DocumentTooLarge,
    Heading,
    ParseLimits,
    UnsupportedDocument,
    heading_title,
    normalize_text,
)

BLOCK_SEPARATOR = "\n\n"
_HEADING_STYLE = re.compile(r"heading\s*([1-9])", re.IGNORECASE)
_MAX_NESTING = 20
_MAX_STYLE_CHAIN = 10
_TIME_CHECK_EVERY = 200


def check_zip_bounds(data: bytes, limits: ParseLimits) -> None:
    """Reject archives that would expand past the limits, judged by the central directory.

    zipfile never inflates a member past its declared size (a lie fails the CRC check), so
    bounding the declared sizes bounds the real work too.
    """
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            members = archive.infolist()
    except Exception as err:
        raise CorruptDocument(
            "the DOCX file is not a readable ZIP archive; it may be damaged"
        ) from err
    if len(members) > limits.max_zip_members:
        raise DocumentTooLarge(
            f"the DOCX archive holds {len(members):,} files, more than the limit of "
            f"{limits.max_zip_members:,}"
        )
    total = sum(member.file_size for member in members)
    if total > limits.max_uncompressed_bytes:
        raise DocumentTooLarge(
            f"the DOCX expands to {total / 2**20:,.0f} MiB, more than the limit of "
            f"{limits.max_uncompressed_bytes / 2**20:,.0f} MiB"
        )
    for member in members:
        ratio = member.file_size / max(member.compress_size, 1)
        if member.file_size > limits.ratio_check_min_bytes and ratio > limits.max_compression_ratio:
            raise DocumentTooLarge(
                f"the DOCX member {member.filename!r} is compressed {ratio:,.0f}:1, far beyond "
                "any real document; the file looks like a zip bomb"
            )


def extract_docx(data: bytes, budget: Budget) -> tuple[str, tuple[Heading, ...], tuple[int, ...]]:
    """Return the body text (paragraphs and tables in document order), the headings, and the
    start offset of each non-empty paragraph (a table counts as one)."""
    check_zip_bounds(data, budget.limits)
    # python-docx raises KeyError, ValueError, lxml errors and more on damaged packages.
    try:
        document = docx.Document(io.BytesIO(data))
        blocks = list(_blocks(document.element.body, document._body, 0))
    except Exception as err:
        if _is_word_variant(data):
            raise UnsupportedDocument(
                "unsupported file type: looks like a Word template or macro-enabled document "
                "(DOTX/DOCM); save it as DOCX"
            ) from err
        raise CorruptDocument("the DOCX file could not be read; it may be damaged") from err

    parts: list[str] = []
    length = 0
    headings: list[Heading] = []
    paragraphs: list[int] = []
    for number, block in enumerate(blocks):
        if number % _TIME_CHECK_EVERY == 0:
            budget.check_time()
        try:
            if isinstance(block, Paragraph):
                text = normalize_text(block.text).strip()
                level = _heading_level(block) if text else None
            else:
                text = _table_text(block)
                level = None
        except DocumentParseError:
            raise
        except Exception as err:
            raise CorruptDocument("the DOCX file could not be read; it may be damaged") from err
        if not text:
            continue
        budget.add_chars(len(text))
        if parts:
            parts.append(BLOCK_SEPARATOR)
            length += len(BLOCK_SEPARATOR)
        if level is not None:
            headings.append(Heading(length, level, heading_title(text)))
        paragraphs.append(length)
        parts.append(text)
        length += len(text)
    return "".join(parts), tuple(headings), tuple(paragraphs)


def _is_word_variant(data: bytes) -> bool:
    # python-docx refuses these by content type although their body has the same structure.
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            content_types = archive.read("[Content_Types].xml")
    except Exception:
        return False
    return b"wordprocessingml.template" in content_types or b"macroEnabled" in content_types


def _blocks(container: Any, parent: Any, depth: int) -> Iterator[Paragraph | Table]:
    # Walk the XML rather than Document.iter_inner_content so that content controls (w:sdt),
    # which Word templates wrap around whole sections, are not skipped.
    if depth > _MAX_NESTING:
        return
    for child in container.iterchildren():
        if child.tag == qn("w:p"):
            yield Paragraph(child, parent)
        elif child.tag == qn("w:tbl"):
            yield Table(child, parent)
        elif child.tag == qn("w:sdt") and not _is_table_of_contents(child):
            content = child.find(qn("w:sdtContent"))
            if content is not None:
                yield from _blocks(content, parent, depth + 1)


def _is_table_of_contents(sdt: Any) -> bool:
    # A generated table of contents repeats every heading; indexing it only adds noise.
    gallery = sdt.find(f"{qn('w:sdtPr')}/{qn('w:docPartObj')}/{qn('w:docPartGallery')}")
    return gallery is not None and (gallery.get(qn("w:val")) or "").startswith("Table of Contents")


def _heading_level(paragraph: Paragraph) -> int | None:
    """Title is level 0, "Heading N" is N; custom styles count through their outline level."""
    level = _outline_level(paragraph._p.pPr)
    style = paragraph.style
    for _ in range(_MAX_STYLE_CHAIN):
        if style is None:
            break
        name = (style.name or "").strip()
        if name.casefold() == "title":
            return 0
        match = _HEADING_STYLE.fullmatch(name)
        if match:
            return int(match.group(1))
        if level is None:
            level = _outline_level(style.element.pPr)
        style = style.base_style
    return level


def _outline_level(properties: Any) -> int | None:
    if properties is None:
        return None
    outline = properties.find(qn("w:outlineLvl"))
    if outline is None:
        return None
    value = outline.get(qn("w:val")) or ""
    # Outline level 9 means body text.
    return int(value) + 1 if value.isdigit() and int(value) < 9 else None


def _table_text(table: Table) -> str:
    rows: list[str] = []
    try:
        for row in table.rows:
            cells: list[str] = []
            seen: list[Any] = []
            for cell in row.cells:
                # A merged cell is returned once per grid column it spans.
                if any(cell._tc is earlier for earlier in seen):
                    continue
                seen.append(cell._tc)
                text = " ".join(normalize_text(cell.text).split())
                if text:
                    cells.append(text)
            if cells:
                rows.append(" | ".join(cells))
    except (ValueError, IndexError):
        # python-docx rejects some irregular grids; the raw text is still worth keeping.
        texts = (node.text or "" for node in table._tbl.iter(qn("w:t")))
        return " ".join(normalize_text(" ".join(texts)).split())
    return "\n".join(rows)
