"""Renders sources in the citation style a client asked for (CitationSource.formatted)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

from services.citations.context import location_parts
from services.citations.types import CitationSource, CitationStyle

FOOTNOTE_LABEL_CHARS = 8
_LABEL_UNSAFE = re.compile(r"[\s\[\]^]")
_TITLE_ESCAPE = re.compile(r"([\\\[\]])")
_URL_NEEDS_BRACKETS = re.compile(r"[\s()]")


def apply_style(
    sources: Sequence[CitationSource], style: CitationStyle
) -> tuple[CitationSource, ...]:
    """Fill `formatted` for every source; a MARKDOWN citation links to its download_url."""
    # Only footnotes need labels, and telling the sources' apart compares every pair.
    labels = footnote_labels(sources) if style is CitationStyle.FOOTNOTE else {}
    styled = []
    for source in sources:
        label = labels.get(source.index, "")
        text = format_source(source, style, link=source.download_url, label=label)
        styled.append(dataclasses.replace(source, formatted=text))
    return tuple(styled)


def format_source(
    source: CitationSource, style: CitationStyle, *, link: str = "", label: str = ""
) -> str:
    """Render one source.

    INLINE:   [guide.md, p. 4, §Install > Linux], unknown parts left out.
    FOOTNOTE: [^1b9d6bcd]: guide.md:42, the line being start_line; ", p. 4" when only the
              page is known; just the name when neither is.
    MARKDOWN: [guide.md](link#L42), or link#page=4 for a PDF; no fragment when the place is
              unknown or link already has one; without a link it falls back to INLINE.
    UNSPECIFIED renders as INLINE.
    """
    name = " ".join(source.document_name.split())
    if style is CitationStyle.FOOTNOTE:
        where = name
        if source.location.start_line > 0:
            where = f"{name}:{source.location.start_line}"
        elif source.location.page_start > 0:
            where = f"{name}, p. {source.location.page_start}"
        return f"[^{label or _footnote_label(source.chunk_id, source.index)}]: {where}"
    if style is CitationStyle.MARKDOWN and link:
        title = _TITLE_ESCAPE.sub(r"\\\1", name)
        return f"[{title}]({_destination(link, source)})"
    return "[" + ", ".join([name, *location_parts(source.location)]) + "]"


def footnote_labels(sources: Sequence[CitationSource]) -> dict[int, str]:
    """A footnote label per source index: the first 8 characters of the chunk id, longer
    where two sources would share a label, with "-<index>" when the ids are identical."""
    ids = {s.index: _LABEL_UNSAFE.sub("-", s.chunk_id) for s in sources}
    labels: dict[int, str] = {}
    for index, chunk_id in ids.items():
        others = [other for i, other in ids.items() if i != index]
        size = FOOTNOTE_LABEL_CHARS
        while any(other[:size] == chunk_id[:size] for other in others) and size < len(chunk_id):
            size += 1
        label = chunk_id[:size]
        if not label or any(other[:size] == label for other in others):
            label = f"{label}-{index}" if label else f"source-{index}"
        labels[index] = label
    return labels


def _footnote_label(chunk_id: str, index: int) -> str:
    label = _LABEL_UNSAFE.sub("-", chunk_id)[:FOOTNOTE_LABEL_CHARS]
    return label or f"source-{index}"


def _destination(link: str, source: CitationSource) -> str:
    url = link
    if "#" not in url:
        location = source.location
        if _is_pdf(source):
            if location.page_start > 0:
                url += f"#page={location.page_start}"
        elif location.start_line > 0:
            url += f"#L{location.start_line}"
    url = url.replace("<", "%3C").replace(">", "%3E").replace("\n", "%0A")
    # CommonMark wants <...> around a destination with spaces or parentheses.
    return f"<{url}>" if _URL_NEEDS_BRACKETS.search(url) else url


def _is_pdf(source: CitationSource) -> bool:
    content_type = source.content_type.split(";")[0].strip().lower()
    return content_type == "application/pdf" or source.document_name.lower().endswith(".pdf")
