"""HTML to plain text that keeps headings and paragraph structure and drops page chrome.

Every piece of text remembers the line of the markup it came from (LineMark), so that a
citation can name the lines of the uploaded file rather than of the extracted text.
"""

from __future__ import annotations

import bisect
import functools
import re
from typing import Any

from lxml import etree

from services.documents.extracted import (
    Budget,
    Heading,
    LineMark,
    heading_title,
    normalize_text,
)

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
_PERMALINK_MARKS = frozenset({"¶", "§", "#", "🔗"})
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
        self.line_marks: list[LineMark] = []
        self._line = 1

    def data_at(self, data: str, line: int) -> None:
        """Text that starts on `line` of the markup; each of its lines is marked as such."""
        pieces = data.split("\n")
        for number, piece in enumerate(pieces):
            self._line = line + number
            self.data(piece if number + 1 == len(pieces) else piece + "\n")

    def start(self, tag: Any, attrib: Any, text: str | None = None) -> None:
        if self._skip_depth:
            self._skip_depth += 1
            return
        tag = str(tag).lower()
        if self._is_dropped(tag, attrib, text):
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

    def text_and_headings(self) -> tuple[str, tuple[Heading, ...], tuple[LineMark, ...]]:
        self._finish_heading()
        text = "".join(self.parts)
        stripped = text.lstrip()
        shift = len(text) - len(stripped)
        headings = tuple(Heading(max(0, h.offset - shift), h.level, h.title) for h in self.headings)
        marks = tuple(LineMark(max(0, m.offset - shift), m.line) for m in self.line_marks)
        return stripped.rstrip(), headings, marks

    def _is_dropped(self, tag: str, attrib: Any, text: str | None) -> bool:
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
            or (tag == "a" and self._is_permalink(attributes, text))
        )

    def _is_permalink(self, attributes: dict[str, str], text: str | None) -> bool:
        """A heading's link to itself ("Copyright¶" from Sphinx and MkDocs, "#" elsewhere): not
        part of the heading's title or of the text."""
        if "headerlink" in attributes.get("class", "").split():
            return True
        return (
            self._heading_level is not None
            and attributes.get("href", "").startswith("#")
            and (text or "").strip() in _PERMALINK_MARKS
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
        if text.strip() and (not self.line_marks or self.line_marks[-1].line != self._line):
            self.line_marks.append(LineMark(self.length, self._line))
        self.parts.append(text)
        self.length += len(text)

    def _strip_trailing_spaces(self) -> None:
        while self.parts and self.parts[-1].endswith((" ", "\t")):
            last = self.parts.pop()
            self.length -= len(last)
            kept = last.rstrip(" \t")
            if kept:
                # Put back without a new line mark: the text keeps the line it came from.
                self.parts.append(kept)
                self.length += len(kept)
                return

    def _finish_heading(self) -> None:
        if self._heading_level is not None and self._heading_offset is not None:
            title = heading_title("".join(self._heading_parts))
            if title:
                self.headings.append(Heading(self._heading_offset, self._heading_level, title))
        self._heading_level = None
        self._heading_offset = None
        self._heading_parts = []


class _MarkupLines:
    """Finds where a text node sits in the markup, to give it the line it starts on.

    libxml2 gives each element the line its start tag ends on, and nothing for text. A cursor
    walks the markup in document order: each element's start moves it past that tag when the
    tag is found ending on its line (so its attributes are not taken for text), else to the
    line's start; each text node is looked for from the cursor by its first run of MIN_ANCHOR
    or more letters, digits and spaces (which no page writes as entities), outside tags, and
    the cursor moves past the text. A node without such a run ("." or "@", often written
    "&#46;" and "&#64;") gets the cursor's line. A cursor found past an element's line was
    misled (the text read before an element precedes its tag), and goes back to that line.

    The text nodes used to be looked for whole, from a cursor that only moved forward: on a
    Sphinx page the "." of an address written "nas<span>&#46;</span>org" matched a full stop 17
    lines down, and every later text of the page was placed near its end. On 244 HTML manuals
    (Debian packages' documentation and Node.js's API reference; about 92,800 chunks of 120
    characters), chunks whose cited lines lack their first or last word: 4,130 before, 2 now,
    both code samples that fool the check (`bench/html_lines.py`).
    """

    # How far past the cursor a text node is looked for, beyond its own length.
    SLACK = 4096
    # The fewest letters, digits and spaces worth looking for, and how far into a text.
    MIN_ANCHOR = 3
    ANCHOR_WITHIN = 256
    # How many matches inside tags are passed over before the text is given the cursor's line.
    TAG_RETRIES = 8
    _ANCHOR = re.compile(rf"[A-Za-z0-9][A-Za-z0-9 ]{{{MIN_ANCHOR - 1},}}")

    def __init__(self, markup: str) -> None:
        self.markup = markup
        self._line_starts = [0, *(m.end() for m in re.finditer("\n", markup))]
        self.cursor = 0

    def enter(self, sourceline: int | None, tag: str) -> int:
        """An element starts on the line libxml2 gives, the line its start tag ends on: the
        cursor moves past that tag when it is found (its attributes are not text), else to the
        line's start."""
        if sourceline and sourceline < _LAST_KNOWN_LINE:
            line = min(sourceline, len(self._line_starts))
            line_start = self._line_starts[line - 1]
            line_end = (
                self._line_starts[line] if line < len(self._line_starts) else len(self.markup)
            )
            if self.cursor >= line_end:
                self.cursor = line_start  # misled: the text before the tag is above its end
            # The tag begins after the text read so far and ends on the line.
            begin = max(self.cursor, line_start - self.SLACK)
            self.cursor = max(self.cursor, line_start)
            for opened in _start_tag(tag).finditer(self.markup, begin, line_end):
                closed = _TAG_REST.match(self.markup, opened.end(), opened.end() + self.SLACK)
                end = closed.end() if closed is not None else opened.end()
                if end > line_end:
                    break
                if self.line_at(end - 1) == line:
                    self.cursor = end
                    break
        return self.line_at(self.cursor)

    def _in_tag(self, offset: int) -> bool:
        opened = self.markup.rfind("<", max(0, offset - self.SLACK), offset)
        return (
            opened >= 0
            and self.markup.find(">", opened, offset) < 0
            and _TAG_START.match(self.markup, opened) is not None
        )

    def line_at(self, offset: int) -> int:
        return bisect.bisect_right(self._line_starts, offset)

    def locate(self, text: str) -> int:
        """The line on which text starts, moving the cursor past it when found."""
        anchor = self._ANCHOR.search(text, 0, self.ANCHOR_WITHIN)
        if anchor is None:
            return self.line_at(self.cursor)
        needle = anchor.group()[:64].rstrip()
        limit = self.cursor + len(text) + self.SLACK
        found = self.markup.find(needle, self.cursor, limit)
        # Not inside a tag: "code" in "</code>", a title attribute that repeats the text.
        passed = 0
        while found >= 0 and self._in_tag(found):
            passed += 1
            found = self.markup.find(needle, found + 1, limit) if passed <= self.TAG_RETRIES else -1
        if found < 0:
            return self.line_at(self.cursor)
        # Past the text: its length from the anchor on is its extent in the markup, or a lower
        # bound of it when the markup writes some of its characters as entities.
        self.cursor = found + len(text) - anchor.start()
        # The text's lines before its anchor's (leading white space, say) come first.
        return max(1, self.line_at(found) - text.count("\n", 0, anchor.start()))


# libxml2 keeps an element's line in 16 bits: past this one it reports this one, whatever the
# line, and text further down is placed by the cursor alone.
_LAST_KNOWN_LINE = 65_535
_TAG_START = re.compile(r"</?[A-Za-z]")
# The rest of a start tag after its name: attributes, quoted values holding any ">", then ">".
_TAG_REST = re.compile(r"""(?:[^>"']|"[^"]*"|'[^']*')*>""")


@functools.lru_cache(maxsize=256)
def _start_tag(tag: str) -> re.Pattern[str]:
    return re.compile(rf"<{re.escape(tag)}(?=[\s/>])", re.IGNORECASE)


def extract_html(
    markup: str, budget: Budget
) -> tuple[str, tuple[Heading, ...], tuple[LineMark, ...]]:
    """Return the reading text of an HTML page, its h1-h6 headings and its line marks."""
    # libxml2 parses in linear time and recovers from broken markup; html.parser goes
    # quadratic on inputs such as thousands of unclosed "<!--".
    builder = _TextBuilder()
    parser = etree.HTMLParser(no_network=True, remove_comments=True, remove_pis=True)
    markup = normalize_text(markup)
    root = None
    try:
        for start in range(0, len(markup), _FEED_SIZE):
            budget.check_time()
            parser.feed(markup[start : start + _FEED_SIZE])
        root = parser.close()
    except etree.LxmlError:
        # Raised when nothing parseable was found (blank or markup-free input); no text at all
        # means an empty document.
        root = None
    if root is not None:
        _walk(root, builder, _MarkupLines(markup), budget)
    text, headings, marks = builder.text_and_headings()
    budget.add_chars(len(text))
    return text, headings, marks


def _walk(root: Any, builder: _TextBuilder, lines: _MarkupLines, budget: Budget) -> None:
    """Replays the tree as parse events, in document order, with the line of each text."""
    for number, (event, element) in enumerate(etree.iterwalk(root, events=("start", "end"))):
        if number % 1000 == 0:
            budget.check_time()
            # Bound the output early: markup can be small while its text is not.
            if builder.length > budget.limits.max_chars:
                budget.add_chars(builder.length)
        if not isinstance(element.tag, str):
            if event == "end" and element.tail:
                builder.data_at(element.tail, lines.locate(element.tail))
            continue
        if event == "start":
            lines.enter(element.sourceline, element.tag)
            builder.start(element.tag, element.attrib, element.text)
            if element.text:
                builder.data_at(element.text, lines.locate(element.text))
        else:
            builder.end(element.tag)
            if element.tail:
                builder.data_at(element.tail, lines.locate(element.tail))
