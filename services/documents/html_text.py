"""HTML to plain text that keeps headings and paragraph structure and drops page chrome."""

from __future__ import annotations

import re
from typing import Any

from lxml import etree

from services.documents.extracted import Budget, Heading, heading_title, normalize_text

# Elements whose content is never reading matter (code, styling, menus, embedded apps).
_DROPPED = frozenset(
    {
        "script", "style", "noscript", "template", "head", "nav", "aside",
        "svg", "iframe", "object", "canvas", "select", "button",
    }
)  # fmt: skip
# A page's header and footer are site chrome, but inside an article they hold its title or byline.
_CHROME = frozenset({"header", "footer"})
_SECTIONING = frozenset({"article", "main", "section"})
_PARAGRAPH_BREAK = frozenset(
    {
        "p", "div", "section", "article", "main", "blockquote", "pre", "ul", "ol", "dl",
        "table", "figure", "figcaption", "form", "fieldset", "legend", "hr", "address",
        "details", "summary", "header", "footer", "center", "body", "html",
        "h1", "h2", "h3", "h4", "h5", "h6",
    }
)  # fmt: skip
_LINE_BREAK = frozenset({"br", "li", "tr", "dt", "dd", "caption"})
_CELLS = frozenset({"td", "th"})
_HEADING_LEVELS = {f"h{n}": n for n in range(1, 7)}
_SPACE_RUN = re.compile(r"[ \t\n\r\f\xa0]+")
_FEED_SIZE = 64 * 1024


class _TextBuilder:
    """Receives libxml2's parse events; its implied end tags keep the element nesting sound."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.length = 0
        self.headings: list[Heading] = []
        self._pending_break = 0
        self._pending_separator = ""
        self._skip_depth = 0
        self._sectioning_depth = 0
        self._pre_depth = 0
        self._cell_index = 0
        self._heading_level: int | None = None
        self._heading_offset: int | None = None
        self._heading_parts: list[str] = []

    def start(self, tag: Any, attrib: Any) -> None:
        if self._skip_depth:
            self._skip_depth += 1
            return
        tag = str(tag).lower()
        if self._is_dropped(tag, attrib):
            self._skip_depth = 1
            return
        if tag in _SECTIONING:
            self._sectioning_depth += 1
        if tag == "pre":
            self._pre_depth += 1
        if tag == "tr":
            self._cell_index = 0
        if tag in _CELLS:
            if self._cell_index > 0:
                self._pending_separator = " | "
            self._cell_index += 1
        self._request_break(tag)
        if tag in _HEADING_LEVELS:
            self._finish_heading()
            self._heading_level = _HEADING_LEVELS[tag]

    def end(self, tag: Any) -> None:
        if self._skip_depth:
            self._skip_depth -= 1
            return
        tag = str(tag).lower()
        if tag in _SECTIONING:
            self._sectioning_depth = max(0, self._sectioning_depth - 1)
        if tag == "pre":
            self._pre_depth = max(0, self._pre_depth - 1)
        if tag in _HEADING_LEVELS:
            self._finish_heading()
        self._request_break(tag)

    def data(self, data: str) -> None:
        if self._skip_depth or not data:
            return
        if self._pre_depth:
            self._emit(normalize_text(data))
            return
        text = _SPACE_RUN.sub(" ", data)
        if self._at_line_start() or (self.parts and self.parts[-1].endswith(" ")):
            text = text.lstrip(" ")
        if text:
            self._emit(normalize_text(text))

    def close(self) -> None:
        self._finish_heading()

    def text_and_headings(self) -> tuple[str, tuple[Heading, ...]]:
        self._finish_heading()
        text = "".join(self.parts)
        stripped = text.lstrip()
        shift = len(text) - len(stripped)
        headings = tuple(Heading(max(0, h.offset - shift), h.level, h.title) for h in self.headings)
        return stripped.rstrip(), headings

    def _is_dropped(self, tag: str, attrib: Any) -> bool:
        if tag in _DROPPED:
            return True
        if tag in _CHROME and self._sectioning_depth == 0:
            return True
        attributes = {
            str(name).lower(): str(value).strip().lower() for name, value in attrib.items()
        }
        return (
            "hidden" in attributes
            or attributes.get("aria-hidden") == "true"
            or attributes.get("role") == "navigation"
        )

    def _at_line_start(self) -> bool:
        return self._pending_break > 0 or not self.parts or self.parts[-1].endswith("\n")

    def _request_break(self, tag: str) -> None:
        newlines = 2 if tag in _PARAGRAPH_BREAK else 1 if tag in _LINE_BREAK else 0
        if newlines:
            self._pending_break = max(self._pending_break, newlines)
            self._pending_separator = ""

    def _emit(self, text: str) -> None:
        if self._pending_break and self.parts:
            self._strip_trailing_spaces()
            trailing = len(self.parts[-1]) - len(self.parts[-1].rstrip("\n")) if self.parts else 0
            self._append("\n" * max(0, self._pending_break - trailing))
        elif self._pending_separator and self.parts:
            self._append(self._pending_separator)
            text = text.lstrip(" ")
        self._pending_break = 0
        self._pending_separator = ""
        if not text:
            return
        if self._heading_level is not None:
            if self._heading_offset is None:
                self._heading_offset = self.length
            self._heading_parts.append(text)
        self._append(text)

    def _append(self, text: str) -> None:
        self.parts.append(text)
        self.length += len(text)

    def _strip_trailing_spaces(self) -> None:
        while self.parts and self.parts[-1].endswith((" ", "\t")):
            last = self.parts.pop()
            self.length -= len(last)
            kept = last.rstrip(" \t")
            if kept:
                self._append(kept)
                return

    def _finish_heading(self) -> None:
        if self._heading_level is not None and self._heading_offset is not None:
            title = heading_title("".join(self._heading_parts))
            if title:
                self.headings.append(Heading(self._heading_offset, self._heading_level, title))
        self._heading_level = None
        self._heading_offset = None
        self._heading_parts = []


def extract_html(markup: str, budget: Budget) -> tuple[str, tuple[Heading, ...]]:
    """Return the reading text of an HTML page and the offsets of its h1-h6 headings."""
    # libxml2 parses in linear time and recovers from broken markup; html.parser goes
    # quadratic on inputs such as thousands of unclosed "<!--".
    builder = _TextBuilder()
    parser = etree.HTMLParser(target=builder, no_network=True, remove_comments=True)
    markup = normalize_text(markup)
    try:
        for start in range(0, len(markup), _FEED_SIZE):
            budget.check_time()
            parser.feed(markup[start : start + _FEED_SIZE])
            # Bound the output early: markup can be small while its text is not.
            if builder.length > budget.limits.max_chars:
                budget.add_chars(builder.length)
        parser.close()
    except etree.LxmlError:
        # Raised when nothing parseable was found (blank or markup-free input); whatever text
        # was recovered before that still stands, and no text at all means an empty document.
        pass
    text, headings = builder.text_and_headings()
    budget.add_chars(len(text))
    return text, headings
