"""Excerpts: the part of a chunk that matches the question, cut at word boundaries.

Written here: an excerpt is provenance, a window whose offsets point into the chunk's own text,
chosen for the question's words with a sliding window over sentence starts. Summarisers and
highlighters in packages return new text or HTML, not a span of the original.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import re

ELLIPSIS = "..."

# Sentence ends followed by what starts a sentence; good enough to pick a window, which is
# all this is used for (the window is then cut at word boundaries anyway).
_SENTENCE_GAP = re.compile(
    r"(?<=[.!?:;])\s+(?=[\"'“(\[]?[A-Z0-9])"  # a sentence end, then a capital or a digit
    r"|\s+(?=\d{1,3}(?:\.\d+)*\.\s)"  # a numbered clause: "2.1. ..."
)
_WORD = re.compile(r"\w+")
_NON_SPACE = re.compile(r"\S+")
_STOPWORDS = frozenset(
    {
        "a", "about", "after", "all", "also", "am", "an", "and", "any", "are", "as", "at", "be",
        "been", "before", "being", "but", "by", "can", "could", "did", "do", "does", "doing",
        "for", "from", "had", "has", "have", "how", "i", "if", "in", "into", "is", "it", "its",
        "may", "me", "might", "must", "my", "no", "not", "of", "on", "or", "our", "shall",
        "should", "so", "than", "that", "the", "their", "them", "then", "there", "these",
        "they", "this", "those", "to", "under", "up", "upon", "us", "was", "we", "were", "what",
        "when", "where", "which", "while", "who", "whom", "why", "will", "with", "would", "you",
        "your",
    }
)  # fmt: skip


@functools.lru_cache(maxsize=1 << 16)
def stem(word: str) -> str:
    """A light suffix strip, so "warranties" meets "warranty" and "terminated" "terminate"."""
    w = word.lower()
    if len(w) <= 3:
        return w
    if w.endswith("ies") and len(w) > 4:
        w = w[:-3] + "y"
    elif w.endswith("sses"):
        w = w[:-2]
    elif w.endswith("s") and not w.endswith(("ss", "us", "is")):
        w = w[:-1]
    for suffix in ("ing", "ed"):
        if w.endswith(suffix) and len(w) - len(suffix) >= 3:
            w = w[: -len(suffix)]
            break
    if w.endswith("e") and len(w) > 3:
        w = w[:-1]
    if w.endswith("y") and len(w) > 3:
        w = w[:-1] + "i"
    return w


@functools.lru_cache(maxsize=256)
def terms(text: str) -> frozenset[str]:
    """The text's topic words, stemmed. Kept for the last questions: an answer asks for the
    excerpts of all its sources with the same question."""
    return frozenset(stem(w) for w in _WORD.findall(text) if w.lower() not in _STOPWORDS)


def make_excerpt(text: str, limit: int, query: str = "") -> str:
    """The chunk's text with whitespace collapsed, cut to at most limit code points.

    With a query, the excerpt is the run of whole sentences that shares the most words with it
    (words compared after a light stemming), starting with ELLIPSIS when it does not start the
    chunk. A cut text ends at a word boundary followed by ELLIPSIS, and the ellipses count
    toward the limit. A single word longer than the limit is cut mid-word. Below 4 code points
    there is no room for an ellipsis, so the text is cut hard.
    """
    flat = " ".join(text.split())
    if len(flat) <= limit:
        return flat
    if limit <= len(ELLIPSIS):
        return flat[:limit]
    wanted = terms(query) if query else frozenset()
    start = _best_window_start(flat, wanted, limit) if wanted else 0
    if start == 0:
        return _cut(flat, limit)
    return ELLIPSIS + _cut(flat[start:], limit - len(ELLIPSIS))


def _cut(flat: str, limit: int) -> str:
    if len(flat) <= limit:
        return flat
    if limit <= len(ELLIPSIS):
        return flat[:limit]
    room = limit - len(ELLIPSIS)
    head = flat[:room]
    if flat[room] != " ":
        space = head.rfind(" ")
        if space > 0:
            head = head[:space]
    head = head.rstrip(" ,;:-–—")
    return (head or flat[:room]) + ELLIPSIS


# Chunks whose word layout is kept between questions (about 11 kB each for chunks of manual
# pages, 44 MB at most): the same chunks come back for related questions, and finding their
# words, stems and sentence starts again was most of the cost of an excerpt.
LAYOUT_CACHE = 4096


Token = tuple[int, int, str]  # a topic word's start, end and stem


@functools.lru_cache(maxsize=LAYOUT_CACHE)
def _layout(
    flat: str,
) -> tuple[tuple[int, ...], frozenset[int], dict[str, tuple[Token, ...]]]:
    """A flat text's word starts, sentence starts, and its topic words by stem, each stem's
    in text order."""
    # flat has single spaces between words (make_excerpt joins them so).
    starts = tuple(itertools.accumulate((len(w) + 1 for w in flat.split(" ")), initial=0))[:-1]
    sentences = frozenset({0, *(gap.end() for gap in _SENTENCE_GAP.finditer(flat))})
    by_stem: dict[str, list[Token]] = {}
    for m in _WORD.finditer(flat):
        if m.group().lower() not in _STOPWORDS:
            term = stem(m.group())
            by_stem.setdefault(term, []).append((m.start(), m.end(), term))
    return starts, sentences, {term: tuple(tokens) for term, tokens in by_stem.items()}


def _best_window_start(flat: str, wanted: frozenset[str], limit: int) -> int:
    """Where the excerpt covering the most question words starts; 0 when nothing matches.

    Candidates are word starts; a sentence start wins a tie, then the earlier one. A window
    that fits from the chunk's start anyway keeps the start (no leading ellipsis).
    """
    room = max(limit - 2 * len(ELLIPSIS), 1)
    words, sentence_starts, by_stem = _layout(flat)
    # Only the question's words count, so only they are looked up (most of a chunk is not).
    found = [by_stem[term] for term in wanted if term in by_stem]
    if not found:
        return 0
    # The start is kept when the words that end within the first limit (less the ellipsis)
    # are as many as the best window's, and no window holds more than all of them: when each
    # one's first place ends there, no window need be tried: 775 of the 1,957 window searches
    # for the sources of 200 questions on bench/corpus.py's manual pages, which took the
    # excerpts from 32 to 24 us each, the same excerpts.
    if all(places[0][1] <= limit - len(ELLIPSIS) for places in found):
        return 0
    tokens = sorted(token for places in found for token in places)
    # The window's words change only where a token leaves it (the start passes the token's
    # start) or enters it (the end reaches the token's end). Between two such places every
    # start covers the same words, and the best of them is a sentence start or else the
    # first: so only those starts are tried, not every word of the chunk.
    places = {0}
    for token_start, token_end, _ in tokens:
        places.add(token_start + 1)
        places.add(token_end - room)
    starts = {words[i] for p in places if (i := bisect.bisect_left(words, p)) < len(words)}
    starts.update(sentence_starts)
    # One pass: the window's tokens are those that start at or after the candidate start and
    # end within room of it. Both ends only move forward, so each token enters and leaves once
    # (a word start is never inside a token, so a token before it has already entered).
    counts: dict[str, int] = {}
    first = last = 0
    best_key, best_start = (0, False, 0), 0
    for start in sorted(starts):
        while last < len(tokens) and tokens[last][1] <= start + room:
            term = tokens[last][2]
            counts[term] = counts.get(term, 0) + 1
            last += 1
        while first < last and tokens[first][0] < start:
            term = tokens[first][2]
            counts[term] -= 1
            if not counts[term]:
                del counts[term]
            first += 1
        key = (len(counts), start in sentence_starts, -start)
        if key > best_key:
            best_key, best_start = key, start
    if best_key[0] == 0:
        return 0
    head = {term for _, end, term in tokens if end <= limit - len(ELLIPSIS)}
    return 0 if len(head) >= best_key[0] else best_start
