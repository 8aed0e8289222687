"""Splits chunk text into the statements an extractive answer may quote.

Structure comes first: fenced code, headings, table rows, list items and paragraphs are told
apart line by line. Prose paragraphs then go through nupunkt, a Punkt sentence segmenter
trained on legal and general English (it knows "Sec.", "et seq.", "v.", "e.g."). What comes out
is filtered: a heading, a table row, a question, a clause cut off at the chunk's edge or a
fragment without enough words is not a statement. A short code block (a command) is kept with
the sentence that introduces it, so an install question can be answered with the command.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import nupunkt

from services.citations import neutralize_markers

MAX_STATEMENT_CHARS = 1000
MIN_WORDS = 4
MAX_CODE_LINES = 4
MAX_CODE_LINE_CHARS = 160

WORD = re.compile(r"[^\W_]+", re.UNICODE)
_FENCE = re.compile(r"^\s{0,3}(`{3,}|~{3,})\s*(\{[\w-]+\})?")
# MyST/Sphinx directives in a fence: these hold code, the others ({note}, {caution}) prose.
_CODE_DIRECTIVES = frozenset({"{code}", "{code-block}", "{code-cell}", "{sourcecode}"})
_ATX_HEADING = re.compile(r"^\s{0,3}#{1,6}(\s|$)")
_RULE = re.compile(r"^\s*([-=*_~+#.:|]\s*){3,}$")
_BULLET = re.compile(r"^\s*(?:[-*+•▪‣◦]|\d{1,3}[.)]|\(?[a-zA-Z]{1,4}\)|\(\d{1,3}\))\s+")
_PROMPT = re.compile(r"^\s*(?:\$|>>>)\s+(\S.*)$")
# Words a command line starts with, for an indented block that a colon introduces.
_COMMANDS = frozenset(
    re.split(
        r"\s+",
        "apt apt-get brew cargo cd conda curl docker dnf git go make npm npx pip pip3 pipx pnpm "
        "poetry python python3 sudo uv uvx wget yarn yum",
    )
)
# A section number or list enumerator at the start of a sentence: "1.1.", "4.", "(a)", "b.".
_ENUMERATOR = re.compile(r"^(?:\d+(?:\.\d+)*\.?|\(?[a-z]{1,4}\)|\(\d{1,3}\)|[a-zA-Z]\.)\s+")
_LINK = re.compile(r"!?\[([^\]\n]*)\]\([^)\s]*\)")
_EMPHASIS = re.compile(r"(\*\*|__)(?=\S)(.+?)(?<=\S)\1")
_LABEL = re.compile(r"^[A-Z]{3,}[A-Z ]*:")
# A statement ends with a full stop, or is a list item of a legal text: "...; and", "...; or".
_ENDS_STATEMENT = re.compile(r"(?:[.!]['\"”’)\]]*|;(?:\s+(?:and|or))?)$")
LIST_ITEM_END = re.compile(r"\s*;(?:\s+(?:and|or))?$")


@dataclass(frozen=True)
class Statement:
    """A sentence an answer may quote: `text` as shown, `match_text` as compared."""

    text: str
    match_text: str
    position: int
    code: str = ""  # the inline-code rendering of a command block, after its intro


@dataclass
class _Block:
    kind: str  # "prose", "code" or "heading"
    lines: list[str]
    first: bool = False  # the chunk's first block: it may start mid-sentence
    last: bool = False  # the chunk's last block: it may end mid-sentence
    item: bool = False  # a list item: "(1) assert copyright ..." continues the sentence before


def statements_of(text: str) -> list[Statement]:
    """The quotable statements of a chunk, in order."""
    blocks = _blocks(text)
    found: list[Statement] = []
    heading = ""
    for i, block in enumerate(blocks):
        if block.kind == "heading":
            heading = " ".join(block.lines)
            continue
        if block.kind == "code":
            intro = ""
            before = blocks[i - 1] if i else None
            if before is not None and before.kind == "prose":
                sentences = _sentences(" ".join(before.lines))
                if sentences and sentences[-1].rstrip().endswith(":"):
                    intro = _clean(sentences[-1]).rstrip(": ")
            code = _inline_code(block.lines)
            if code and (intro or heading):
                shown = intro or heading
                # Compared by meaning through its heading where it has one ("Install Clippy"
                # says more than "Once you have rustup, run the following command:").
                match = " ".join([heading or intro, *block.lines])
                found.append(Statement(f"{shown}: {code}", match, len(found), code))
            continue
        sentences = _sentences(" ".join(block.lines))
        for j, raw in enumerate(sentences):
            sentence = _clean(raw)
            # A chunk can start or end in the middle of a sentence (chunks overlap).
            cut_start = block.first and j == 0 and not _starts_sentence(raw)
            cut_end = block.last and j == len(sentences) - 1 and not _ENDS_STATEMENT.search(raw)
            # A paragraph may open with a name spelt in lower case ("pip's caching ...").
            opens = j == 0 and not block.first and not block.item
            if cut_start or cut_end or not is_statement(sentence, opens_paragraph=opens):
                continue
            found.append(Statement(sentence, sentence, len(found)))
    return found


def is_statement(sentence: str, *, opens_paragraph: bool = False) -> bool:
    """Whether a sentence reads as a statement rather than a heading, question or fragment.

    Inside a paragraph a sentence must start with a capital, a digit or code; the paragraph's
    first sentence may start with a lower-case word, as names like pip or npm do.
    """
    words = WORD.findall(sentence)
    if len(words) < MIN_WORDS or len(sentence) > MAX_STATEMENT_CHARS:
        return False
    starts = _starts_sentence(sentence) or (opens_paragraph and sentence[:1].islower())
    if not starts or not _ENDS_STATEMENT.search(sentence):
        return False
    if _LABEL.match(sentence):
        return False  # "APPENDIX: How to apply ..." is a heading
    # Title Case or ALL CAPS lines are headings, whatever their punctuation.
    lower = [w for w in words if w[0].islower()]
    return len(lower) >= 2 and len(lower) >= 0.4 * len(words)


def _starts_sentence(text: str) -> bool:
    first = text.lstrip("\"'“‘(*_`")[:1]
    return bool(first) and (first.isupper() or first.isdigit() or text.lstrip()[:1] == "`")


def _blocks(text: str) -> list[_Block]:
    blocks: list[_Block] = []
    paragraph: list[str] = []
    lines = text.splitlines()
    item = False

    def close() -> None:
        nonlocal item
        if paragraph:
            blocks.append(_Block("prose", paragraph.copy(), item=item))
            paragraph.clear()
        item = False

    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        fence = _FENCE.match(line)
        if fence:
            close()
            mark = fence.group(1)
            body = []
            i += 1
            while i < len(lines) and not lines[i].strip().startswith(mark):
                body.append(lines[i])
                i += 1
            directive = fence.group(2)
            if directive and directive not in _CODE_DIRECTIVES:
                # An admonition or a tab: its body is text like any other (its options,
                # ":class: ...", are not), and may hold fences of its own.
                inner = [b for b in body if not b.strip().startswith(":")]
                blocks.extend(_blocks("\n".join(inner)))
            else:
                blocks.append(_Block("code", body))
            i += 1
            continue
        following = lines[i + 1].strip() if i + 1 < len(lines) else ""
        if stripped and not paragraph and re.fullmatch(r"=+|-+", following):
            close()  # a setext heading: its underline comes next
            blocks.append(_Block("heading", [stripped]))
            i += 2
            continue
        prompt = _PROMPT.match(line)
        if not stripped or _RULE.match(stripped):
            close()
        elif _ATX_HEADING.match(line):
            close()
            blocks.append(_Block("heading", [stripped.lstrip("#").strip().rstrip("#").strip()]))
        elif stripped.startswith("|") or stripped.count("|") >= 2:
            close()  # a table row
        elif prompt:
            close()
            blocks.append(_Block("code", [prompt.group(1)]))
        elif _is_indented_command(line, paragraph, blocks):
            close()
            blocks.append(_Block("code", [stripped]))
        elif _BULLET.match(line):
            close()
            item = True
            paragraph.append(_BULLET.sub("", line, count=1).strip())
        else:
            paragraph.append(stripped)
        i += 1
    close()
    for block in blocks:
        if block.kind == "prose":
            block.first = block is blocks[0]
            block.last = block is blocks[-1]
    return blocks


def _is_indented_command(line: str, paragraph: list[str], blocks: list[_Block]) -> bool:
    if not line.startswith(("    ", "\t")):
        return False
    first = line.split()[0]
    if first not in _COMMANDS:
        return False
    before = paragraph[-1] if paragraph else (blocks[-1].lines[-1] if blocks else "")
    return before.rstrip().endswith(":") or bool(blocks and blocks[-1].kind == "code")


def _sentences(paragraph: str) -> list[str]:
    """nupunkt's sentences, with its splits inside enumerations and numbering undone."""
    merged: list[str] = []
    carry = ""
    for piece in nupunkt.sent_tokenize(paragraph):
        piece = piece.strip()
        if not piece:
            continue
        if not re.search(r"[^\W\d_]{2}", piece):
            carry += piece + " "  # "1.1." or "(a)": numbering for the sentence that follows
            continue
        piece = carry + piece
        carry = ""
        if merged and piece[0].islower():
            merged[-1] += " " + piece  # "... Work; ii." / "moral rights ..." is one sentence
        else:
            merged.append(piece)
    if carry and merged:
        merged[-1] += " " + carry.strip()
    return merged


def _clean(sentence: str) -> str:
    text = LIST_ITEM_END.sub(".", " ".join(sentence.split()))
    text = _ENUMERATOR.sub("", text, count=1)
    text = _LINK.sub(r"\1", text)
    text = _EMPHASIS.sub(r"\2", text)
    return neutralize_markers(text)


def _inline_code(lines: list[str]) -> str:
    """A short command block as inline code spans, or "" when it is not short."""
    kept = [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]
    if not kept or len(kept) > MAX_CODE_LINES or any(len(c) > MAX_CODE_LINE_CHARS for c in kept):
        return ""
    spans = []
    for line in kept:
        line = _PROMPT.sub(r"\1", line)
        tick = "``" if "`" in line else "`"
        pad = " " if tick == "``" else ""
        spans.append(f"{tick}{pad}{line}{pad}{tick}")
    return ", then ".join(spans)
