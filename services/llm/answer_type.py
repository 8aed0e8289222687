"""What kind of answer a question asks for, and whether a sentence can be one.

Question-answering systems have long checked a candidate answer against the type the question
expects (a person for "who", a date for "when"). The extractive generator checks the type that
English marks unambiguously and that a close paraphrase most often lacks: a quantity. "How many
days do I have to...", "What is the maximum size of...", "Which version..." can only be answered
by a sentence that states a number, "how many days" by one that says how many days, a size by a
number of bytes, a version by a version number. A sentence on the same subject without one
matches such a question's words and meaning well, which is exactly how an extractive answer
ends up citing a source that does not say.

The second check is for names the sources never use: a question about `windowBits` cannot be
answered from sources that do not contain the word, however close their sentences are.

Hand-written because it is a few patterns over English questions; no library we know of ships
a question classifier without a model download.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Sequence
from dataclasses import dataclass

from services.llm.stems import stem_word, stem_words


def _stems(words: str) -> frozenset[str]:
    return frozenset(stem_words(words.split()))


class Kind(enum.Enum):
    NUMBER = "number"  # any number: "How many UIDs...", "What is the maximum..."
    UNIT = "unit"  # a number and the unit the question names: "How many days..." -> "30 days"
    SIZE = "size"  # a number of bytes: "How much memory...", "What buffer size..."
    LENGTH = "length"  # a time or a length: "How long must the offer stay valid?"
    VERSION = "version"  # a version number: "Which version...", "What is the minimum version"


_AUXILIARIES = (
    "can|could|do|does|did|is|are|was|were|will|would|shall|should|must|may|might|have|has|had"
)
# "how many days", "how much memory" (not "how much can I charge", which asks for a manner), and
# the words after it up to the verb: "how many mantissa bits" asks for bits.
_HOW_MANY = re.compile(rf"\bhow\s+(many|much)\s+(?!(?:{_AUXILIARIES}|of)\b)([^\W\d_]+)", re.I)
_NOUN_AFTER = re.compile(rf"\s+(?!(?:{_AUXILIARIES}|of|per|in|for|to|on|at|by)\b)([^\W\d_]+)", re.I)
_NOUN_WORDS = 3
_HOW = re.compile(r"\bhow\s+(long|large|big|small|old|far|high|wide|fast)\b", re.I)
_WHAT_NOUN = re.compile(
    r"""\b(?:what|which)\s+(?:(?:is|are|was|were)\s+)?(?:the\s+)?(?:[^\W_][\w.+-]*\s+){0,3}?
        (size|sizes|version|versions|percentage|port|limit|range|amount|length|count|timeout
        |duration|threshold)\b""",
    re.I | re.X,
)
_SUPERLATIVE = re.compile(
    r"\b(?:what|which)\s+(?:is|are|was|were)\s+the\s+(?:default\s+)?"
    r"(?:minimum|maximum|largest|smallest|highest|lowest|max|min)\b",
    re.I,
)
_NUMERIC = re.compile(r"\b(?:numeric|numerical|number\s+of)\b", re.I)

_UNITS = _stems(
    "seconds minutes hours days weeks months years bytes kilobytes megabytes gigabytes bits "
    "characters lines pages percent times"
)
_CHANGES = _stems("introduced added removed deprecated dropped replaced renamed new since changed")
_SIZE_NOUNS = _stems("memory disk space quota storage size ram cache buffer")
_TIME_NOUNS = _stems("time delay timeout duration")

# A number standing alone: "30", "0.21", "128K", "three"; not the 2 of "deflateInit2".
_DIGITS = r"(?<![^\W\d_])(?<![\d.])\d+(?:[.,]\d+)*"
_WORDS = (
    r"\b(?:two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|fifteen|twenty|thirty"
    r"|forty|fifty|sixty|seventy|eighty|ninety|hundred|thousand|million|billion|dozen)\b"
)
_NUMBER = re.compile(rf"{_DIGITS}|{_WORDS}", re.I)
_REFERENCE = re.compile(
    r"\b(?:sections?|articles?|clauses?|chapters?|paragraphs?|steps?|exhibit|appendix)\s*$|§\s*$",
    re.I,
)
# A number of bytes: "256K", "16 GB", "two bytes", or a constant's ("ASN1_MAX_NAME_SIZE bytes",
# as C manuals give buffer sizes). A bare multiplier before a plural noun counts that noun
# instead: "64K UIDs", "10M rows" are not sizes.
_CONSTANT = r"(?-i:\b[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+\b)"
_SIZE = re.compile(
    rf"(?:{_DIGITS}|{_WORDS}|\bone\b|{_CONSTANT})[\s-]*"
    r"(?:[KMGT]i?B\b|[KMGT]i?\b(?!\s+(?!bytes\b)[^\W\d_]{2,}s\b)"
    r"|bytes?\b|kilobytes?|megabytes?|gigabytes?|terabytes?)",
    re.I,
)
_TIME_OR_LENGTH = re.compile(
    rf"(?:{_DIGITS}|{_WORDS}|\bone\b|\ba\b|\ba\s+few\b|\bfew\b|\bseveral\b)[\s-]*"
    r"(?:seconds?|minutes?|hours?|days?|weeks?"
    r"|months?|years?|characters?|bytes?|lines?|words?)\b"
    r"|\bas\s+long\s+as\b|\b(?:perpetual(?:ly)?|indefinitely|forever)\b",
    re.I,
)
_NO_LIMIT = re.compile(
    r"\b(?:unlimited|unbounded|no\s+(?:limit|maximum|minimum|upper\s+limit|lower\s+limit))\b",
    re.I,
)
# A version: "0.21", "v2", "version 3", a name and its number ("PostgreSQL 16", "Rust 1.29"),
# or one given in words ("any later version").
_VERSION = re.compile(
    r"(?<![\w.])v?\d+\.\d+(?:\.\d+)*\b|\b(?:version|v)\s*\d+"
    r"|\b(?!(?:section|article|clause|chapter|step|exhibit|appendix)\b)(?-i:[A-Z])[\w+#-]*\s+\d+(?:\.\d+)*\b"
    r"|\b(?:any|later|latest|earlier|newer|older|same|current)\s+version\b",
    re.I,
)
_WORD = re.compile(r"[^\W\d_]+")

# A name as code spells it: camelCase ("windowBits", "deflateInit2") or snake_case.
_IDENTIFIER = re.compile(
    r"\b(?:[a-z]+(?:[A-Z][a-z0-9]+)+|[A-Za-z][A-Za-z0-9]*_[A-Za-z0-9_]*[A-Za-z0-9])\b"
)


@dataclass(frozen=True)
class Expected:
    """The kind of quantity a question asks for, and its unit's stem for Kind.UNIT.

    `change` is set for a version at which something changed ("Which version introduced
    treemagic?"): the answer must say that something changed there, not only name a version
    ("This is version 0.21 of the specification").
    """

    kind: Kind
    unit: str = ""
    change: bool = False
    # The versions the question names itself ("Python 3" in "Which Python 3 version..."): a
    # sentence naming only those does not say which.
    given: frozenset[str] = frozenset()

    def met_by(self, sentence: str) -> bool:
        if _NO_LIMIT.search(sentence) and self.kind is not Kind.VERSION:
            return True  # "there is no maximum" answers "what is the maximum ..."
        if self.kind is Kind.SIZE:
            return bool(_SIZE.search(sentence))
        if self.kind is Kind.LENGTH:
            return bool(_TIME_OR_LENGTH.search(sentence))
        if self.kind is Kind.VERSION:
            named = {_spelled(v) for v in _VERSION.findall(sentence)} - self.given
            return bool(named) and (not self.change or _changes(sentence))
        if not _states_number(sentence):
            return False
        if self.kind is Kind.UNIT:
            return self.unit in stem_words([w.lower() for w in _WORD.findall(sentence)])
        return True


def _spelled(version: str) -> str:
    return " ".join(version.lower().split())


def _changes(text: str) -> bool:
    """Whether a text says something changed: introduced, added, removed, deprecated..."""
    return not _CHANGES.isdisjoint(stem_words([w.lower() for w in _WORD.findall(text)]))


def _states_number(sentence: str) -> bool:
    """A number that is not a cross-reference: "Section 10.2" points, "30 days" counts."""
    return any(
        not _REFERENCE.search(sentence, 0, number.start()) for number in _NUMBER.finditer(sentence)
    )


def expected_answer(question: str) -> Expected | None:
    """What quantity the question asks for, or None when it asks for something else."""
    if how_many := _HOW_MANY.search(question):
        for noun in _nouns_after(question, how_many):
            if noun in _UNITS:
                return Expected(Kind.UNIT, noun)
            if noun in _SIZE_NOUNS:
                return Expected(Kind.SIZE)
            if noun in _TIME_NOUNS:
                return Expected(Kind.LENGTH)
        return Expected(Kind.NUMBER)
    if how := _HOW.search(question):
        word = how.group(1).lower()
        if word == "long":
            return Expected(Kind.LENGTH)
        if word in ("large", "big", "small"):
            return Expected(Kind.SIZE)
        return Expected(Kind.NUMBER)
    if noun := _WHAT_NOUN.search(question):
        word = noun.group(1).lower()
        if word.startswith("size"):
            return Expected(Kind.SIZE)
        if word.startswith("version"):
            given = frozenset(_spelled(v) for v in _VERSION.findall(question))
            return Expected(Kind.VERSION, change=_changes(question), given=given)
        if word in ("timeout", "duration"):
            return Expected(Kind.LENGTH)
        return Expected(Kind.NUMBER)
    if _SUPERLATIVE.search(question) or _NUMERIC.search(question):
        return Expected(Kind.NUMBER)
    return None


def _nouns_after(question: str, how_many: re.Match[str]) -> list[str]:
    """The stems of the words "how many" asks about, up to _NOUN_WORDS and the first verb or
    preposition: "how many days", "how many mantissa bits"."""
    stems = [stem_word(how_many.group(2).lower())]
    at = how_many.end()
    while len(stems) < _NOUN_WORDS and (word := _NOUN_AFTER.match(question, at)):
        stems.append(stem_word(word.group(1).lower()))
        at = word.end()
    return stems


def unknown_names(question: str, texts: Sequence[str]) -> list[str]:
    """The code names in the question (camelCase or snake_case) that no text contains."""
    names = dict.fromkeys(_IDENTIFIER.findall(question))
    if not names:
        return []
    haystack = "\n".join(texts).lower()
    return [name for name in names if name.lower() not in haystack]
