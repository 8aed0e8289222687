"""Finds citation markers in answer text, outside code, and rewrites or removes invalid ones.

One incremental scanner serves both the whole-text path (extract) and the streaming path
(stream.MarkerBuffer), so the two cannot disagree: the scanner only commits to a decision once
the text it has seen settles it, and otherwise stops and waits for more.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass

# A marker longer than this is prose, not a citation; it also bounds how much a stream holds back.
MAX_MARKER_CHARS = 64
# Four digits would turn years like [2024] into (invalid) citations.
MAX_NUMBER_DIGITS = 3

_CLOSE = {"[": "]", "【": "】"}
_DIGITS = {str(d): d for d in range(10)} | {chr(0xFF10 + d): d for d in range(10)}
_SEPARATORS = frozenset(",，、")
_DASHES = frozenset("-–—")
_ASCII_PUNCT = frozenset(string.punctuation)

# Characters at which the scanner has to look closer; everything between them is plain text.
# "]" only matters as the start of a link destination "](".
_INTEREST = re.compile(r"[\[【`\\\n]|\](?=\()")
MARKER_START = re.compile(r"[\[【]")
# A piece without these, fed mid-line, is plain text in every scanner state.
_PLAIN_UNSAFE = re.compile(r"[\[【`\\\n\]]")
_SIMPLE_MARKER = re.compile(r"\[([0-9]{1,3})\]")
_INDENT = re.compile(r"[ \t]*")
_PARENS = re.compile(r"[()\n]")
# The end of a line that could grow into a marker if the text after a removed marker joined it.
_OPEN_PREFIX = re.compile(r"[\[【][ 0-9０-９,，、\-–—]*\Z")
_FENCE_ONLY = re.compile(r"[ \t`~]*")

_PARTIAL = -1
_NONE = -2


@dataclass(frozen=True, slots=True)
class Marker:
    """A citation marker: where it sits in the output and in the input, and what it cites."""

    start: int
    end: int  # == start when the marker was removed
    indices: tuple[int, ...]  # valid source numbers, ascending, unique
    invalid: tuple[int, ...]  # numbers written outside 1..n_sources, ascending, unique
    source_start: int
    source_end: int
    text: str  # as it appears in the output ("" when removed)


@dataclass(frozen=True, slots=True)
class Extraction:
    """The output text and the markers found in it."""

    text: str  # the input, with invalid markers rewritten or removed when stripping
    markers: tuple[Marker, ...]
    referenced_indices: tuple[int, ...]
    invalid_indices: tuple[int, ...]


def extract(text: str, n_sources: int, *, strip_invalid: bool = False) -> Extraction:
    """Read every citation marker of a complete answer."""
    scanner = Scanner(n_sources, strip_invalid=strip_invalid)
    scanner.scan(text, 0, final=True)
    parts: list[str] = []
    markers: list[Marker] = []
    for item in scanner.drain():
        if isinstance(item, str):
            parts.append(item)
        else:
            parts.append(item.text)
            markers.append(item)
    return scanner.result("".join(parts), markers)


def _parse_marker(buf: str, i: int) -> tuple[int, list[tuple[int, int]]]:
    """Match the marker grammar at buf[i] ("[" or "【").

    Returns (end, items): end is the index after the closing bracket, _PARTIAL when buf ends
    while a marker is still possible, or _NONE. Items are (first, last) number pairs.
    Grammar: OPEN sp* ITEM (sp* SEP sp* ITEM)* sp* CLOSE, ITEM = NUM (sp* DASH sp* NUM)?,
    NUM = 1-3 digits, sp = " ".
    """
    close = _CLOSE[buf[i]]
    n = len(buf)
    limit = min(n, i + MAX_MARKER_CHARS)
    items: list[tuple[int, int]] = []
    # States: 0 expect item, 1 in first number, 2 after first number, 3 after dash,
    # 4 in second number, 5 after second number.
    state = 0
    first = num = digits = 0
    j = i + 1
    while j < limit:
        c = buf[j]
        d = _DIGITS.get(c)
        if state == 0:
            if c == " ":
                pass
            elif d is not None:
                state, num, digits = 1, d, 1
            else:
                return _NONE, items
        elif state in (1, 4) and d is not None:
            if digits == MAX_NUMBER_DIGITS:
                return _NONE, items
            num, digits = num * 10 + d, digits + 1
        elif state == 3:
            if c == " ":
                pass
            elif d is not None:
                state, first, num, digits = 4, num, d, 1
            else:
                return _NONE, items
        elif c == " ":
            state = 2 if state in (1, 2) else 5
        elif c in _DASHES and state in (1, 2):
            state = 3
        elif c in _SEPARATORS or c == close:
            items.append((num, num) if state in (1, 2) else (first, num))
            if c == close:
                return j + 1, items
            state = 0
        else:
            return _NONE, items
        j += 1
    return (_PARTIAL if j == n and n < i + MAX_MARKER_CHARS else _NONE), items


def _resolve(
    items: list[tuple[int, int]], n_sources: int
) -> tuple[list[int], list[int], list[str]]:
    """Split a marker's numbers into valid and invalid ones; also render its valid part."""
    valid: set[int] = set()
    invalid: set[int] = set()
    kept: list[str] = []
    for first, last in items:
        lo, hi = min(first, last), max(first, last)
        # A range cites what it covers inside 1..n; only the numbers actually written can be
        # invalid, so "[1-999]" reports 999 rather than 994 phantom numbers.
        for written in {lo, hi}:
            if not 1 <= written <= n_sources:
                invalid.add(written)
        a, b = max(lo, 1), min(hi, n_sources)
        if a > b:
            continue
        valid.update(range(a, b + 1))
        kept.append(str(a) if a == b else f"{a}-{b}")
    return sorted(valid), sorted(invalid), kept


class Scanner:
    """Incremental marker scanner; state carries across calls to scan().

    scan(buf, i, final) consumes buf from i as far as the text settles every decision, emits
    output items (str for plain text, Marker for markers) and returns where it stopped. With
    final=True it consumes everything, resolving open questions as the end of text would.
    """

    __slots__ = (
        "_base",
        "_fence",
        "_invalid",
        "_items",
        "_line_start",
        "_n",
        "_out_len",
        "_recent",
        "_referenced",
        "_strip",
    )

    def __init__(self, n_sources: int, *, strip_invalid: bool = False) -> None:
        if n_sources < 0:
            raise ValueError("n_sources must be >= 0")
        self._n = n_sources
        self._base = 0
        self._strip = strip_invalid
        self._fence: tuple[str, int] | None = None  # (char, length) of the open code fence
        self._line_start = True
        self._items: list[str | Marker] = []
        self._out_len = 0
        # The latest output, from which _tail() recovers the left context that decides whether
        # removing a marker is safe; kept as pieces because that question is rare.
        self._recent: list[str] = []
        self._referenced: set[int] = set()
        self._invalid: set[int] = set()

    def drain(self) -> list[str | Marker]:
        """Return and forget the output items emitted so far."""
        items, self._items = self._items, []
        return items

    def result(self, text: str, markers: list[Marker]) -> Extraction:
        return Extraction(
            text=text,
            markers=tuple(markers),
            referenced_indices=tuple(sorted(self._referenced)),
            invalid_indices=tuple(sorted(self._invalid)),
        )

    # -- output -------------------------------------------------------------------------

    def _emit(self, buf: str, a: int, b: int) -> None:
        if a < b:
            text = buf[a:b]
            self._items.append(text)
            self._track(text)

    def _track(self, text: str) -> None:
        self._out_len += len(text)
        self._recent.append(text)
        if len(self._recent) > 64:
            self._tail()

    def _tail(self) -> str:
        """The output's current line, its last MAX_MARKER_CHARS code points."""
        joined = "".join(self._recent)
        tail = joined[joined.rfind("\n") + 1 :][-MAX_MARKER_CHARS:]
        self._recent = [tail]
        return tail

    def pass_plain(self, text: str) -> bool:
        """Emit text directly if the scanner would pass it through untouched; a fast path
        for streamed pieces that hold no character the scanner looks at."""
        if self._line_start or _PLAIN_UNSAFE.search(text):
            return False
        self._track(text)
        return True

    # -- scanning -----------------------------------------------------------------------

    def scan(self, buf: str, i: int, final: bool, base: int = 0) -> int:
        """base is where buf starts in the whole input, for Marker.source_start."""
        self._base = base
        n = len(buf)
        p = i  # buf[i:p] is settled plain text not yet emitted
        while p < n:
            if self._fence is not None or self._line_start:
                self._emit(buf, i, p)
                if self._fence is not None:
                    q, settled = self._scan_fence(buf, p, final)
                else:
                    q, settled = self._open_fence(buf, p, final)
                i = p = q
                if not settled:
                    return p
                continue
            m = _INTEREST.search(buf, p)
            if m is None:
                if buf[-1] == "]" and not final:
                    # "](" may be split across pieces: wait for the next character.
                    self._emit(buf, i, n - 1)
                    return n - 1
                p = n
                break
            j = m.start()
            ch = buf[j]
            if ch == "\n":
                p = j + 1
                self._line_start = True
            elif ch == "\\":
                if j + 1 == n:
                    if final:
                        p = n
                        break
                    self._emit(buf, i, j)
                    return j
                # CommonMark escapes only ASCII punctuation: "\[1]" is literal text.
                p = j + 2 if buf[j + 1] in _ASCII_PUNCT else j + 1
            elif ch == "`":
                q = self._code_span(buf, j, final)
                if q is None:
                    self._emit(buf, i, j)
                    return j
                p = q
            elif ch == "]":
                q = self._link_destination(buf, j, final)
                if q is None:
                    self._emit(buf, i, j)
                    return j
                p = q
            else:
                self._emit(buf, i, j)
                q = self._marker(buf, j, final)
                if q is None:
                    return j
                i = j if q == j + 1 else q  # j + 1: not a marker, the bracket is plain text
                p = q
        self._emit(buf, i, p)
        return p

    def _open_fence(self, buf: str, p: int, final: bool) -> tuple[int, bool]:
        """At a line start: consume a fence opener line, or settle that there is none."""
        n = len(buf)
        j = _INDENT.match(buf, p).end()
        if j == n and not final:
            return p, False
        c = buf[j] if j < n else ""
        if c not in ("`", "~"):
            self._line_start = False
            return p, True
        k = j
        while k < n and buf[k] == c:
            k += 1
        if k == n and not final:
            return p, False
        eol = buf.find("\n", k)
        if k - j >= 3:
            if c == "~" or eol >= 0 or final:
                line_end = n if eol < 0 else eol
                # A backtick fence's info string holds no backtick, else it is inline code.
                if c == "~" or "`" not in buf[k:line_end]:
                    self._fence = (c, k - j)
                    end = n if eol < 0 else eol + 1
                    self._emit(buf, p, end)
                    self._line_start = eol >= 0
                    return end, True
            else:
                return p, False
        self._line_start = False
        return p, True

    def _scan_fence(self, buf: str, p: int, final: bool) -> tuple[int, bool]:
        """Inside a fenced block: consume code up to and including the closing fence line."""
        n = len(buf)
        assert self._fence is not None
        c, length = self._fence
        while p < n:
            if not self._line_start:
                eol = buf.find("\n", p)
                if eol < 0:
                    self._emit(buf, p, n)
                    return n, True
                self._emit(buf, p, eol + 1)
                p = eol + 1
                self._line_start = True
                continue
            j = _INDENT.match(buf, p).end()
            if j == n:
                if not final:
                    return p, False
                self._emit(buf, p, n)
                return n, True
            k = j
            while k < n and buf[k] == c:
                k += 1
            if k - j >= length:
                eol = buf.find("\n", k)
                line_end = n if eol < 0 else eol
                if not buf[k:line_end].strip(" \t\r"):
                    if eol < 0 and not final:
                        return p, False
                    end = n if eol < 0 else eol + 1
                    self._emit(buf, p, end)
                    self._fence = None
                    self._line_start = eol >= 0
                    return end, True
            elif k == n and not final:
                return p, False
            self._line_start = False
        return p, True

    def _code_span(self, buf: str, j: int, final: bool) -> int | None:
        """At a backtick run: the end of the code span it opens, the end of the run if it opens
        none, or None if the text so far cannot tell. Spans close on the same line."""
        n = len(buf)
        k = j
        while k < n and buf[k] == "`":
            k += 1
        if k == n and not final:
            return None
        length = k - j
        eol = buf.find("\n", k)
        line_end = n if eol < 0 else eol
        q = k
        while True:
            q = buf.find("`", q, line_end)
            if q < 0:
                break
            r = q
            while r < line_end and buf[r] == "`":
                r += 1
            if r == n and not final:
                return None  # the run may grow
            if r - q == length:
                return r
            q = r
        if eol < 0 and not final:
            return None
        return k

    def _link_destination(self, buf: str, j: int, final: bool) -> int | None:
        """At "](": the end of a link destination "(...)" on this line, or just past "](" if
        there is none, or None if the text so far cannot tell."""
        depth = 0
        for m in _PARENS.finditer(buf, j + 1):
            ch = m.group()
            if ch == "\n":
                return j + 2
            depth += 1 if ch == "(" else -1
            if depth == 0:
                return m.end()
        return j + 2 if final else None

    def _marker(self, buf: str, j: int, final: bool) -> int | None:
        """At "[" or "【": emit the marker and return its end, return j + 1 if there is none,
        or None if the text so far cannot tell."""
        n = len(buf)
        simple = _SIMPLE_MARKER.match(buf, j)
        if simple is not None:  # the common "[3]", without the general grammar
            number = int(simple[1])
            end, items = simple.end(), [(number, number)]
        else:
            end, items = _parse_marker(buf, j)
        if end == _PARTIAL:
            if not final:
                return None
            end = _NONE
        if end == _NONE:
            return j + 1
        if buf[j] == "[":
            if end == n and not final:
                return None
            if end < n and buf[end] == "(":
                return j + 1  # link text "[1](url)"; the "](" rule skips the destination
        valid, invalid, kept = _resolve(items, self._n)
        raw = buf[j:end]
        text = raw
        if invalid and self._strip:
            if kept:
                text = buf[j] + ", ".join(kept) + _CLOSE[buf[j]]
            else:
                safe = self._removal_safe(buf, end, final)
                if safe is None:
                    return None
                if safe:
                    text = ""
        marker = Marker(
            start=self._out_len,
            end=self._out_len + len(text),
            indices=tuple(valid),
            invalid=tuple(invalid),
            source_start=self._base + j,
            source_end=self._base + end,
            text=text,
        )
        self._items.append(marker)
        self._track(text)
        self._referenced.update(valid)
        self._invalid.update(invalid)
        return end

    def _removal_safe(self, buf: str, end: int, final: bool) -> bool | None:
        """Whether deleting a marker leaves the rest of the text reading as before.

        Deleting joins its neighbours, which must not create a marker ("[[99]1]"), a link
        ("[1]【99】(x)"), an escape, a longer backtick run or a code fence. When it would,
        the marker stays (still reported invalid), so stripping is idempotent.
        """
        tail = self._tail()
        if _OPEN_PREFIX.search(tail):
            return False
        slashes = len(tail) - len(tail.rstrip("\\"))
        if slashes % 2 or slashes == len(tail) > 0:
            return False  # a literal "\" before "【9】" would escape whatever follows it
        n = len(buf)
        if end == n:
            return True if final else None
        right = buf[end]
        if tail.endswith("]") and right == "(":
            return False
        if right == "`" and tail.endswith("`"):
            return False
        if _FENCE_ONLY.fullmatch(tail):
            k = _INDENT.match(buf, end).end()
            if k == n:
                return True if final else None
            if buf[k] in "`~":
                return False
        return True
