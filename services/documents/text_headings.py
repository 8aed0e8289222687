"""Headings of plain-text documents: numbered, titled sections and set-off title lines.

Plain text has no markup, so a heading is recognised by its shape: a line standing alone
between blank lines that is numbered and titled ("1. Definitions", "2.1 Grants", "Section 3 -
Termination", "ARTICLE IV"), in capitals ("TERMS AND CONDITIONS"), or centred by indentation
("Preamble"); a line underlined with "=", "-" or "~" as long as it, as READMEs and specs in
plain text (and reStructuredText) write it; or a numbered section whose short title runs into
its first sentence on the same line ("2. Grant of Copyright License. Subject to ..."), as
licences and contracts often write.
"""

from __future__ import annotations

import re

from services.documents.extracted import Heading, heading_title

MAX_HEADING_CHARS = 90
MAX_HEADING_WORDS = 12
MAX_RUN_IN_TITLE_WORDS = 8
CENTRED_INDENT = 8

_NUMBERED = re.compile(r"(?P<number>\d{1,3}(?:\.\d{1,3}){0,4})\.?[ \t]+(?P<title>\S.*)")
_ROMAN = re.compile(r"(?P<number>[IVXLC]{1,6})\.[ \t]+(?P<title>[A-Z].*)")
_NAMED = re.compile(
    r"(?P<kind>article|section|chapter|part|appendix|schedule|exhibit|annex)"
    r"[ \t]+(?P<number>[0-9]{1,3}(?:\.[0-9]{1,3})*|[IVXLC]{1,6}|[A-Z])\b\.?(?P<rest>.*)",
    re.IGNORECASE,
)
# A run-in title: a few capitalised words ended by a full stop, then the section's text.
_RUN_IN = re.compile(r"(?P<title>[A-Z][^.:;!?]{0,80}?)\.[ \t]+(?=[A-Z\"“(])")
_SMALL_WORDS = frozenset(
    {
        "a", "an", "and", "as", "at", "be", "by", "for", "from", "in", "into", "is", "its",
        "not", "of", "on", "or", "that", "the", "these", "this", "to", "with", "without",
        "under", "upon",
    }
)  # fmt: skip
_SENTENCE_END = (",", ";", ":")
# An underline and the level it gives: "TRIGGERS\n========", "Introduction\n------------".
_UNDERLINE = re.compile(r"(?P<mark>[=~-])(?P=mark){2,}")
_UNDERLINE_LEVELS = {"=": 1, "-": 2, "~": 3}


def text_headings(text: str) -> tuple[Heading, ...]:
    """Headings found by shape; offsets are line starts in text."""
    lines = text.split("\n")
    headings: list[Heading] = []
    offset = 0
    for index, line in enumerate(lines):
        start = offset
        offset += len(line) + 1
        stripped = line.strip()
        if not stripped or len(stripped) > MAX_HEADING_CHARS * 2:
            continue
        before_blank = index == 0 or not lines[index - 1].strip()
        if not before_blank:
            continue
        if (underlined := _underlined(stripped, lines, index)) is not None:
            if title := heading_title(stripped):
                headings.append(Heading(start, underlined, title))
            continue
        after_blank = index + 1 == len(lines) or not lines[index + 1].strip()
        found = _standalone(line, stripped) if after_blank else None
        if found is None:
            found = _run_in(stripped)
        if found is not None:
            level, title = found
            title = heading_title(title)
            if title:
                headings.append(Heading(start, level, title))
    return tuple(headings)


def _underlined(stripped: str, lines: list[str], index: int) -> int | None:
    """The level of a title whose next line underlines it, about its length, before a blank
    line or the end; None for any other line. Without the blank line, table headers over a
    rule passed for titles; a sentence over a rule is not one either."""
    if index + 1 >= len(lines) or len(stripped.split()) > MAX_HEADING_WORDS:
        return None
    if stripped.endswith((".", ",", ";")):
        return None
    underline = _UNDERLINE.fullmatch(lines[index + 1].strip())
    if underline is None or len(underline.group()) < 0.8 * len(stripped):
        return None
    if index + 2 < len(lines) and lines[index + 2].strip():
        return None
    return _UNDERLINE_LEVELS[underline.group("mark")]


def _standalone(line: str, stripped: str) -> tuple[int, str] | None:
    """A line alone between blank lines that looks like a heading, with its level."""
    if len(stripped) > MAX_HEADING_CHARS or len(stripped.split()) > MAX_HEADING_WORDS:
        return None
    named = _NAMED.fullmatch(stripped)
    if named is not None and _is_title(named.group("rest").strip(" -–—:.")):
        kind = named.group("kind").lower()
        return (2 if kind == "section" else 1), stripped.rstrip(":")
    numbered = _NUMBERED.fullmatch(stripped) or _ROMAN.fullmatch(stripped)
    if numbered is not None:
        title = numbered.group("title").rstrip()
        if _is_title(title.rstrip(".")) and not title.endswith(_SENTENCE_END):
            depth = numbered.group("number").count(".") + 1
            return (1 + depth if numbered.re is _NUMBERED else 1), stripped
        return None
    letters = [c for c in stripped if c.isalpha()]
    if len(letters) >= 4 and all(c.isupper() for c in letters) and not stripped.endswith(","):
        return 1, stripped
    indent = len(line) - len(line.lstrip(" "))
    if indent >= CENTRED_INDENT and _is_title(stripped) and not stripped.endswith(_SENTENCE_END):
        return 1, stripped
    return None


def _run_in(stripped: str) -> tuple[int, str] | None:
    """A numbered section whose title runs into its first sentence on the same line."""
    numbered = _NUMBERED.fullmatch(stripped)
    if numbered is None:
        return None
    run_in = _RUN_IN.match(numbered.group("title"))
    if run_in is None:
        return None
    title = run_in.group("title")
    if len(title.split()) > MAX_RUN_IN_TITLE_WORDS or not _is_title(title):
        return None
    depth = numbered.group("number").count(".") + 1
    return 1 + depth, f"{numbered.group('number')}. {title}"


def _is_title(text: str) -> bool:
    """Words that read as a title: each starts with a capital or digit, bar small words."""
    words = re.findall(r"[^\s\-–—/]+", text)
    if not words or len(words) > MAX_HEADING_WORDS:
        return False
    if not (words[0][0].isupper() or words[0][0].isdigit() or words[0][0] in "\"'“("):
        return False
    for word in words[1:]:
        head = word.lstrip("\"'“(")[:1]
        if not head:
            continue
        if head.isupper() or head.isdigit() or word.lower().strip("\"'”),.") in _SMALL_WORDS:
            continue
        if not head.isalpha():
            continue
        return False
    return True
