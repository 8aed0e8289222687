"""Does a passage support a sentence? Pure functions over text and two embedding cosines.

Hand-written on purpose. No package that installs here ships an entailment (NLI) model:
the small cross-encoders and NLI checkpoints are published on model hubs, and Footnote never
downloads weights at run time. What does ship is the local MiniLM embedder, which measures
topical closeness but is blind to the traps that matter most in a citation: a changed number,
a flipped negation, a swapped name. So the score combines the embedding cosine with lexical
coverage of the sentence by the quote, and explicit checks for numbers, negation, antonyms
and names; the weights and thresholds are calibrated on eval/claims.jsonl (docs/quality.md).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from services.citations import SupportVerdict

_WORD = re.compile(r"[^\W_]+(?:['’][^\W_]+)?", re.UNICODE)
_NUMBER = re.compile(r"(?<![\w.])\d+(?:[.,:]\d+)*(?![\w])|\d+")
_CODE_TOKEN = re.compile(r"`([^`]+)`|\b(\w+(?:[._/:-]\w+)+(?:\(\))?|\w+_\w*|\w+\(\))")
_CAPITALISED = re.compile(r"\b[A-Z][\w.+-]*[A-Za-z0-9]")
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u9fff\uac00-\ud7af]")

_STOPWORD_TEXT = """
    a an the and or of to in on at by for with from as is are was were be been being it its
    this that these those there their they them he she his her you your we our us i me my which
    who whom whose what when where how why if then than so such also only just can could would
    should will shall may might must do does did done has have had having not no into onto over
    under about after before up down out off all any each every both either other some more
    most very own same too again further once here s t
"""
STOPWORDS = frozenset(_STOPWORD_TEXT.split())
_NEGATION_TEXT = "not no never without cannot none neither nor nothing nobody n't"
NEGATIONS = frozenset(_NEGATION_TEXT.split())
# How many content words after a negation it covers ("does not terminate the licenses").
NEGATION_SCOPE = 4
# A negation reaches no further than its clause.
_CLAUSE_END = re.compile(r"[.;:!?。；：！？]\s|[,，]\s+(?:but|and|while|whereas)\b")
# Words whose swap reverses a statement ("may" -> "must" is a modality flip in a licence).
_ANTONYM_PAIRS = (
    ("longest", "shortest"), ("long", "short"), ("before", "after"), ("more", "less"),
    ("more", "fewer"), ("increase", "decrease"), ("allow", "forbid"), ("allow", "prohibit"),
    ("permit", "prohibit"), ("required", "optional"), ("must", "may"), ("first", "last"),
    ("minimum", "maximum"), ("enable", "disable"), ("include", "exclude"), ("above", "below"),
    ("higher", "lower"), ("larger", "smaller"), ("earlier", "later"), ("always", "never"),
    ("true", "false"), ("accept", "reject"), ("add", "remove"), ("start", "end"),
    ("upper", "lower"), ("input", "output"), ("success", "failure"), ("inside", "outside"),
    ("static", "dynamic"), ("system", "regular"), ("mandatory", "optional"), ("old", "new"),
    ("older", "newer"), ("oldest", "newest"), ("compress", "decompress"),
    ("deflate", "inflate"), ("read", "write"), ("private", "public"), ("lowest", "highest"),
)  # fmt: skip
ANTONYMS: dict[str, frozenset[str]] = {}
for _a, _b in _ANTONYM_PAIRS:
    ANTONYMS[_a] = ANTONYMS.get(_a, frozenset()) | {_b}
    ANTONYMS[_b] = ANTONYMS.get(_b, frozenset()) | {_a}
_NUMBER_WORDS = {
    "zero": "0", "one": "1", "two": "2", "three": "3", "four": "4", "five": "5", "six": "6",
    "seven": "7", "eight": "8", "nine": "9", "ten": "10", "eleven": "11", "twelve": "12",
    "fifteen": "15", "twenty": "20", "thirty": "30", "sixty": "60", "ninety": "90",
    "hundred": "100", "thousand": "1000", "once": "1", "twice": "2", "single": "1",
}  # fmt: skip
_SUFFIXES = ("ations", "ation", "ings", "ing", "edly", "ed", "ies", "es", "ly", "s")


@functools.lru_cache(maxsize=65536)
def stem(word: str) -> str:
    """A light stemmer: strips one common English suffix so "licensed" meets "licenses"."""
    if len(word) <= 3:
        return word
    for suffix in _SUFFIXES:
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            base = word[: -len(suffix)]
            if suffix == "ies":
                return base + "y"
            if base.endswith("e"):
                base = base[:-1]
            return base
    return word[:-1] if word.endswith("e") else word


@functools.lru_cache(maxsize=8192)
def words(text: str) -> tuple[str, ...]:
    """Lower-case words; CJK text, which has no spaces, counts one word per character."""
    out: list[str] = []
    for match in _WORD.finditer(text.lower()):
        token = match.group().replace("’", "'")
        if _CJK.search(token):
            out.extend(ch for ch in token if not ch.isspace())
        elif token.endswith("n't"):
            out.extend((token[:-3], "n't"))
        else:
            out.append(token)
    return tuple(out)


@functools.lru_cache(maxsize=8192)
def content_terms(text: str) -> frozenset[str]:
    """The stemmed words of text that carry meaning (stop words and numbers left out)."""
    return frozenset(stem(w) for w in words(text) if w not in STOPWORDS and not w.isdigit())


def numbers(text: str) -> set[str]:
    """Numbers written in text, digits or small number words, normalised ("1,000" -> "1000")."""
    found = {m.group().replace(",", "").rstrip(".") for m in _NUMBER.finditer(text)}
    found.update(_NUMBER_WORDS[w] for w in words(text) if w in _NUMBER_WORDS)
    return {n.lstrip("0") or "0" for n in found}


def negated_terms(text: str) -> set[str]:
    """Stemmed content words that follow a negation closely enough to be what it negates."""
    out: set[str] = set()
    for clause in _CLAUSE_END.split(text):
        left = 0
        for w in words(clause):
            if w in NEGATIONS:
                left = NEGATION_SCOPE
            elif left and w not in STOPWORDS:
                out.add(stem(w))
                left -= 1
    return out


def names(text: str) -> set[str]:
    """Names and code tokens: capitalised words past a sentence's first word, `code`, a.b."""
    found: set[str] = set()
    for m in _CODE_TOKEN.finditer(text):
        found.add((m.group(1) or m.group(2)).lower().strip("()"))
    for m in _CAPITALISED.finditer(text):
        start = m.start()
        before = text[:start].rstrip()
        if not before or before[-1] in ".!?:;\"'“(" or before.endswith("- "):
            continue  # a capital that only starts a sentence or clause
        found.add(m.group().lower())
    return {n for n in found if n and n not in STOPWORDS}


@dataclass(frozen=True, slots=True)
class Features:
    """What the checks found for one (sentence, quote) pair."""

    cosine: float  # embedding cosine of sentence and quote, in [-1, 1]
    coverage: float  # share of the sentence's content words found in the quote
    number_changed: bool  # the sentence has a number the quote lacks, and the quote has others
    number_missing: bool  # the sentence has a number, and the quote has none at all
    negation_mismatch: bool  # one side negates and the other does not
    antonym: bool  # the sentence uses the opposite of a word the quote uses
    missing_names: int  # names or code tokens of the sentence absent from the quote


@dataclass(frozen=True, slots=True)
class Calibration:
    """Weights and thresholds of support_score and verdict_for; fitted on eval/claims.jsonl."""

    cosine_weight: float = 0.4
    cosine_floor: float = 0.4  # a cosine at or below this counts as 0
    negation_penalty: float = 0.2
    antonym_penalty: float = 0.1
    name_penalty: float = 0.2
    number_missing_penalty: float = 0.15
    supported: float = 0.5
    partial: float = 0.35


CALIBRATION = Calibration()


def features(sentence: str, quote: str, cosine: float) -> Features:
    """Compare a sentence with a candidate quote; cosine comes from the embedder."""
    claim_terms = content_terms(sentence)
    quote_terms = content_terms(quote)
    coverage = len(claim_terms & quote_terms) / len(claim_terms) if claim_terms else 0.0
    claim_numbers, quote_numbers = numbers(sentence), numbers(quote)
    absent = claim_numbers - quote_numbers
    claim_words, quote_words = set(words(sentence)), set(words(quote))
    antonym = any(
        w not in quote_words and ANTONYMS[w] & quote_words for w in claim_words if w in ANTONYMS
    )
    quote_lower = quote.lower()
    missing = sum(1 for n in names(sentence) if n not in quote_lower)
    return Features(
        cosine=cosine,
        coverage=coverage,
        number_changed=bool(absent) and bool(quote_numbers),
        number_missing=bool(absent) and not quote_numbers,
        negation_mismatch=_negation_mismatch(sentence, quote, claim_terms, quote_terms),
        antonym=antonym,
        missing_names=missing,
    )


def _negation_mismatch(
    sentence: str, quote: str, claim_terms: frozenset[str], quote_terms: frozenset[str]
) -> bool:
    """A word the two share is negated on one side only."""
    shared = claim_terms & quote_terms
    claim_negated = negated_terms(sentence) & shared
    quote_negated = negated_terms(quote) & shared
    return bool(claim_negated ^ quote_negated)


def relevance(f: Features, c: Calibration = CALIBRATION) -> float:
    """How close a quote is to the sentence, before the checks for contradictions."""
    cosine = max(0.0, (f.cosine - c.cosine_floor) / (1.0 - c.cosine_floor))
    return c.cosine_weight * cosine + (1.0 - c.cosine_weight) * f.coverage


def support_score(f: Features, c: Calibration = CALIBRATION) -> float:
    """The support of a quote for a sentence in [0, 1]; higher is better supported."""
    score = relevance(f, c)
    if f.negation_mismatch:
        score -= c.negation_penalty
    if f.antonym:
        score -= c.antonym_penalty
    if f.number_missing:
        score -= c.number_missing_penalty
    score -= c.name_penalty * min(f.missing_names, 2)
    if f.number_changed:
        score = min(score, c.partial - 0.01) * 0.5
    return min(1.0, max(0.0, score))


def verdict_for(score: float, c: Calibration = CALIBRATION) -> SupportVerdict:
    if score >= c.supported:
        return SupportVerdict.SUPPORTED
    if score >= c.partial:
        return SupportVerdict.PARTIAL
    return SupportVerdict.UNSUPPORTED


# Sentences that state nothing a source could back.
_NOT_A_CLAIM = re.compile(
    r"^\s*(?:hi|hello|hey|thanks|thank you|you're welcome|good (?:morning|afternoon|evening)|"
    r"sure|certainly|of course|great question|i hope (?:this|that) helps|let me know|"
    r"feel free|happy to help|here is|here are|here's|in summary|to summari[sz]e)\b",
    re.IGNORECASE,
)
_ABSTAINS = re.compile(
    r"\b(?:(?:the |these |provided |given )?(?:documents?|sources?|context|passages?|texts?)"
    r"\s+(?:do(?:es)?n[o']t|do(?:es)? not|did not|didn't|never)\s+(?:say|mention|state|cover|"
    r"contain|specify|include|provide|address|describe|explain|discuss)|"
    r"(?:i|we) (?:do not|don't|cannot|can't|could not|couldn't) (?:know|find|say|tell|answer)|"
    r"(?:no|not enough) information|not (?:mentioned|stated|specified|covered) in|"
    r"is not (?:clear|known) from)",
    re.IGNORECASE,
)


# Lines of code or of a table that the sentence splitter hands over like prose.
_CODE_LIKE = re.compile(
    r"^\s*(?:```|\||(?:def|class|import|from|return|print|const|let|var|func|fn)\b)|"
    r"[{};]\s*$|\s(?:=|==|!=|=>|->|\+=|:=)\s|\w\(\S*\)\s*$"
)


def is_claim(sentence: str) -> bool:
    """True for a sentence that states something: not a greeting, a question or an abstention."""
    text = sentence.strip()
    if not text or text.endswith(("?", "？")):
        return False
    if _CODE_LIKE.search(text):
        return False
    if _NOT_A_CLAIM.match(text) and len(words(text)) <= 8:
        return False
    if _ABSTAINS.search(text):
        return False
    if text.endswith(":"):
        return False  # a lead-in to a list, which the items carry
    return len(content_terms(text)) >= 2
