"""Locates the cited sentences of a final answer."""

from __future__ import annotations

import re
from collections.abc import Sequence

from services.citations.extract import Marker
from services.citations.types import CitationSpan

_TERMINATOR_RUN = re.compile(r"[.!?…。！？]+")
_CJK_TERMINATORS = frozenset("。！？")
# Closing quotes, brackets and emphasis that belong to the sentence they follow.
_CLOSERS = frozenset("\"'”’)»」』*_")
# List bullets, numbering, block quotes and heading marks are not part of a sentence.
_LINE_PREFIX = re.compile(r"[ \t]*(?:(?:[-*+•]|\d{1,9}[.)]|#{1,6}|>)[ \t]+)*")
_WORD_BEFORE = re.compile(r"(\w+(?:\.\w+)*)\Z")
_NEXT_VISIBLE = re.compile(r"[ \t]*(\S)?")
# Words after which a period does not end the sentence (compared lower-case, without the dot).
_ABBREVIATIONS = frozenset(
    {
        "al", "approx", "ca", "cf", "ch", "dr", "e.g", "eq", "fig", "figs", "i.e", "incl",
        "jr", "mr", "mrs", "ms", "p", "pp", "prof", "ref", "sec", "sr", "st", "viz", "vol", "vs",
    }
)  # fmt: skip


def build_spans(text: str, markers: Sequence[Marker]) -> tuple[CitationSpan, ...]:
    """One span per sentence of text that cites at least one valid source.

    markers are positioned in text (Extraction.markers). A marker cites the sentence it sits
    in; markers right after a sentence's end ("Foo.[1]", "Foo. [1][2]") belong to that
    sentence, and a line holding only markers belongs to the sentence before it.
    """
    return tuple(span for span in answer_sentences(text, markers) if span.source_indices)


def answer_sentences(text: str, markers: Sequence[Marker]) -> tuple[CitationSpan, ...]:
    """Every sentence of the answer, cited or not, in order, as spans (see build_spans).

    A sentence without markers has no source indices. Offsets come in code points and in
    UTF-8 bytes.
    """
    kept = [m for m in markers if m.end > m.start]
    at = {m.start: m for m in kept}
    sentences: list[list[int]] = []  # [start, end] pairs
    for start, end in _sentences(text, at, {m.end for m in kept}):
        sentences.append([start, end])
    # Attach every marker to its sentence, then fold marker-only sentences into the one before.
    cited: list[tuple[int, int, list[Marker]]] = []
    order = iter(sorted(kept, key=lambda m: m.start))
    pending = next(order, None)
    for start, end in sentences:
        inside: list[Marker] = []
        while pending is not None and pending.start < end:
            if pending.start >= start:
                inside.append(pending)
            pending = next(order, None)
        if inside and cited and not _has_words(text, start, end, inside):
            prev_start, _, prev_markers = cited[-1]
            cited[-1] = (prev_start, end, prev_markers + inside)
        else:
            cited.append((start, end, inside))
    spans: list[CitationSpan] = []
    bytes_at = ByteOffsets(text)
    for start, end, inside in cited:
        indices = tuple(sorted({i for m in inside for i in m.indices}))
        if not indices and not _has_words(text, start, end, inside):
            continue  # a line of punctuation or of invalid markers states nothing
        cited_text = _without_markers(text, start, end, inside)
        spans.append(
            CitationSpan(
                start,
                end,
                indices,
                cited_text,
                start_byte=bytes_at(start),
                end_byte=bytes_at(end),
            )
        )
    return tuple(spans)


def sentence_ranges(text: str) -> list[tuple[int, int]]:
    """The sentences of plain text (no markers) as [start, end) code-point ranges, trimmed."""
    return _sentences(text, {}, set())


class ByteOffsets:
    """Converts code-point offsets of one text into UTF-8 byte offsets, ascending or not."""

    def __init__(self, text: str) -> None:
        self._text = text
        self._cp = 0
        self._byte = 0

    def __call__(self, offset: int) -> int:
        if offset < self._cp:
            self._cp = self._byte = 0
        self._byte += len(self._text[self._cp : offset].encode("utf-8", "surrogatepass"))
        self._cp = offset
        return self._byte


def _sentences(
    text: str, marker_at: dict[int, Marker], marker_ends: set[int]
) -> list[tuple[int, int]]:
    """Sentence ranges, trimmed, in order. Every line break ends a sentence."""
    out: list[tuple[int, int]] = []
    line_start = 0
    n = len(text)
    while line_start <= n:
        line_end = text.find("\n", line_start)
        if line_end < 0:
            line_end = n
        start = _LINE_PREFIX.match(text, line_start, line_end).end()
        search = start
        while True:
            run = _TERMINATOR_RUN.search(text, search, line_end)
            if run is None:
                break
            end = run.end()
            while end < line_end and text[end] in _CLOSERS:
                end += 1
            absorbed = False
            while True:
                k = end
                while k < line_end and text[k] in " \t":
                    k += 1
                marker = marker_at.get(k)
                if marker is None or k >= line_end:
                    break
                end, absorbed = marker.end, True
            # "Foo [1]. bar": a period right after a marker always ends the sentence.
            before = run.start()
            while before > line_start and text[before - 1] in " \t":
                before -= 1
            if before in marker_ends or _ends_sentence(
                text, run, end, line_start, line_end, absorbed
            ):
                _add(out, text, start, end)
                start = end
            search = end
        _add(out, text, start, line_end)
        line_start = line_end + 1
    return out


def _ends_sentence(
    text: str, run: re.Match[str], end: int, line_start: int, line_end: int, absorbed: bool
) -> bool:
    last = run.group()[-1]
    if last in _CJK_TERMINATORS:
        return True
    if end < line_end and not absorbed and not text[end].isspace():
        return False  # "3.14", "e.g.x", "file.txt"
    if last in ".…":
        if run.group() == ".":
            word = _WORD_BEFORE.search(text, line_start, run.start())
            if word is not None:
                w = word.group(1)
                if w.lower() in _ABBREVIATIONS or (len(w) == 1 and w.isalpha()):
                    return False
        following = _NEXT_VISIBLE.match(text, end, line_end).group(1)
        if following is not None and following.islower():
            return False
    return True


def _add(out: list[tuple[int, int]], text: str, start: int, end: int) -> None:
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    if start < end:
        out.append((start, end))


def _has_words(text: str, start: int, end: int, markers: list[Marker]) -> bool:
    pos = start
    for m in markers:
        if any(ch.isalnum() for ch in text[pos : m.start]):
            return True
        pos = m.end
    return any(ch.isalnum() for ch in text[pos:end])


def _without_markers(text: str, start: int, end: int, markers: list[Marker]) -> str:
    """The sentence without its markers, and without the spaces that only set them apart."""
    parts: list[str] = []
    last = ""  # the last character kept so far
    pos = start
    for m in markers:
        before = text[pos : m.start].rstrip(" \t")
        if before:
            parts.append(before)
            last = before[-1]
        pos = m.end
        right = text[pos : pos + 1]
        if last and (last.isalnum() or last in ",;:") and right.isalnum():
            parts.append(" ")  # "Foo[1]bar" -> "Foo bar"
            last = " "
    parts.append(text[pos:end])
    return " ".join("".join(parts).split())
