"""Passages of real English prose for the `real` bench corpus: the machine's manual pages.

The synthetic corpora decide how fast search is at scale, but not how well HNSW finds the
neighbours of real embeddings, whose distribution neither random nor clustered vectors
capture, nor how full text behaves on real language. Debian installs thousands of manual
pages (/usr/share/man, free licences), written by many authors about many programs: enough
for 100k+ passages without downloading anything.

The roff source is turned into text here, crudely (requests dropped, the text arguments of
font macros kept, escapes replaced), not with groff: rendering 20,000 pages takes tens of
minutes, and a benchmark needs prose, not a faithful layout. Passages are whole paragraphs
joined until they reach about PASSAGE_CHARS characters, split at sentence ends when longer.
Which pages, in which order, is fixed by their paths, so the same machine gives the same
corpus.
"""

from __future__ import annotations

import gzip
import re
from collections.abc import Iterator
from pathlib import Path

MAN_ROOT = Path("/usr/share/man")
PASSAGE_CHARS = 400
MIN_PASSAGE_CHARS = 150

# Requests that start a new paragraph.
_BREAKS = {"PP", "P", "LP", "SH", "SS", "TP", "IP", "HP", "sp", "br", "TH", "Sh", "Pp", "It"}
# Font and section macros whose arguments are text.
_TEXT_MACROS = {"B", "I", "BR", "BI", "IB", "IR", "RB", "RI", "SM", "SB", "SH", "SS", "Nm", "Nd"}
_ESCAPES = [
    (re.compile(r"\\f(\[[^\]]*\]|\(..|.)"), ""),  # font changes
    (re.compile(r"\\s[+-]?\d"), ""),  # size changes
    (re.compile(r"\\\*(\[[^\]]*\]|\(..|.)"), ""),  # strings
    (re.compile(r"\\\((em|en)"), " - "),
    (re.compile(r"\\\(lq|\\\(rq|\\\(dq"), '"'),
    (re.compile(r"\\\(oq|\\\(aq|\\\(cq"), "'"),
    (re.compile(r"\\\(..|\\\[[^\]]*\]"), ""),  # other special characters
    (re.compile(r"\\[-]"), "-"),
    (re.compile(r"\\e"), "\\\\"),
    (re.compile(r"\\[&/,|^%:c]"), ""),
    (re.compile(r"\\ "), " "),
    (re.compile(r'\\".*$'), ""),  # comments
]
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")


def pages(root: Path = MAN_ROOT) -> list[Path]:
    """The English manual pages, in a fixed order (sections man1..man8, by name)."""
    return sorted(p for p in root.glob("man[1-8]/*.gz") if p.is_file())


def paragraphs(source: str) -> Iterator[str]:
    """The text of a roff page, a paragraph at a time."""
    current: list[str] = []
    for line in source.splitlines():
        if line.startswith((".", "'")):
            name, _, rest = line[1:].strip().partition(" ")
            if name in _BREAKS and current:
                yield " ".join(current)
                current = []
            if name not in _TEXT_MACROS:
                continue
            line = rest.replace('"', "")
        for pattern, replacement in _ESCAPES:
            line = pattern.sub(replacement, line)
        line = line.strip()
        if line:
            current.append(line)
        elif current:
            yield " ".join(current)
            current = []
    if current:
        yield " ".join(current)


def prose(paragraph: str) -> bool:
    """Whether a paragraph reads as text (not a table of options or a synopsis)."""
    words = paragraph.split()
    if len(words) < 8:
        return False
    letters = sum(c.isalpha() for c in paragraph)
    return letters > 0.6 * len(paragraph)


def passages(root: Path = MAN_ROOT) -> Iterator[tuple[str, str]]:
    """(page name, passage) pairs: prose paragraphs of each page, joined or split to about
    PASSAGE_CHARS characters."""
    for path in pages(root):
        try:
            source = gzip.decompress(path.read_bytes()).decode("utf-8", "replace")
        except (OSError, EOFError, gzip.BadGzipFile):
            continue
        page = path.name.removesuffix(".gz")
        buffer = ""
        for paragraph in filter(prose, paragraphs(source)):
            for sentence_run in split(paragraph):
                buffer = f"{buffer} {sentence_run}".strip()
                if len(buffer) >= PASSAGE_CHARS:
                    yield page, buffer
                    buffer = ""
        if len(buffer) >= MIN_PASSAGE_CHARS:
            yield page, buffer


def split(paragraph: str) -> Iterator[str]:
    """A long paragraph in runs of sentences of at most about PASSAGE_CHARS characters."""
    if len(paragraph) <= PASSAGE_CHARS:
        yield paragraph
        return
    run = ""
    for sentence in _SENTENCE_END.split(paragraph):
        if run and len(run) + len(sentence) > PASSAGE_CHARS:
            yield run
            run = ""
        run = f"{run} {sentence}".strip()
    if run:
        yield run


def question(passage: str) -> str:
    """A question-sized piece of a passage: its first sentence, at most 25 words."""
    first = _SENTENCE_END.split(passage, maxsplit=1)[0]
    return " ".join(first.split()[:25])
