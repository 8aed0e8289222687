"""Does a passage support a sentence? Pure functions over text and one embedding cosine.

Hand-written on purpose. No package on PyPI that we found ships an entailment (NLI) model that
fits the budget: the small cross-encoders and NLI checkpoints are published on model hubs, and
Footnote never downloads weights at run time; the one packaged NLI model measured here took
about 800 ms a pair, forty times the 20 ms a sentence may cost. What does ship are embedders
(static token vectors by default, services/evidence/static.py; MiniLM optionally), which
measure topical closeness but are blind to the traps that matter most in a citation: a
changed number, a flipped negation, a swapped name, an added clause. So the score is a small,
explainable formula:

    relevance = w * cosine' + (1 - w) * coverage   (or coverage alone, once it is near 1)
    score     = relevance - penalties, then capped by what the checks below found

- ``cosine'`` is the embedding cosine rescaled so that the floor counts as 0.
- ``coverage`` is the share of the sentence's content words (Snowball stems, stop words out)
  found in the quote, each word weighted by its rarity in English (wordfreq's Zipf frequency,
  an IDF that needs no corpus of our own): missing "python-decouple" costs more than missing
  "uses". A quote holding nearly all of the weighted words backs the sentence whatever the
  cosine (a copy needs no embedding).
- Contradictions, checked against the quote and the sentence either side of it, since a
  negation one sentence away still speaks to the claim:
  * a negation mismatch: a word the sentence and the passage share is the head of a negation
    ("not", "no", "never", "without", "fails to", "instead of") on one side only, unless the
    other side negates it too ("unless", a negating prefix), or uses it as it stands as often
    in the same sentence without negating next to it what the claim puts there;
  * a polarity mismatch: the passage sentence closest to the claim holds an odd number of
    negations and the claim an even one, or the reverse (weaker, so a small penalty);
  * an antonym: the sentence uses the opposite of a word the passage uses, from a short list
    (must/may, before/after, longest/shortest) or by a negating prefix (in-, un-, non-, dis-);
  * a name swap: a rare name or word of the sentence (a code token, a dotted or hyphenated
    name, a capitalised or plain word uncommon in English) is absent from the passage and
    from the document's own name and heading (acronyms of capitalised words count as
    present), while the rest of its clause is covered: the slot is there, the name in it
    differs ("python-decouple reads .env files" against python-dotenv); or a proper name
    whose last word the passage uses in a name of its own while the words before it appear
    nowhere ("the Free Software Foundation" against "Mozilla Foundation");
  * a number of the sentence that the passage does not hold while it holds others.
  Each has a penalty, and any of them but the polarity caps the score under PARTIAL: a high
  cosine says the passage is about the same thing, not that it says the same thing.
- Partial support: the sentence is split into clauses (commas, semicolons, "and", "but",
  "because", "which" ...). When one clause is well covered and another barely at all, or
  their coverage differs widely, and nothing above contradicts, the verdict is PARTIAL
  whatever the overall score: that is what an added, unsupported part looks like. A number or
  a rare name that only sits in an uncovered clause is part of the addition, not a change or a
  swap (a name costs a small penalty).

The weights and thresholds were fitted on the training split of eval/claims.jsonl and are
reported on both splits in docs/quality.md. The score never falls as the cosine rises, which
the builder relies on to skip embeddings whose value cannot change a verdict.
"""

from __future__ import annotations

import functools
import re
from collections import Counter
from dataclasses import dataclass

from services.citations import SupportVerdict
from services.citations.spans import sentence_ranges
from services.evidence.static import word_vectors
from services.llm.stems import stem_word

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
# Words that negate what follows them. "instead of X" denies X as surely as "not X".
_NEGATION_TEXT = "not no never without cannot none neither nor nothing n't instead"
NEGATIONS = frozenset(_NEGATION_TEXT.split())
_FAIL = frozenset({"fail", "fails", "failed", "failing"})  # "fails to notify" = "does not"
# Words skipped when looking for what a negation negates ("is not to be", "does not have").
_AUXILIARY_TEXT = "be been being is are was were do does did have has had to need needs"
_AUXILIARIES = frozenset(_AUXILIARY_TEXT.split())
# The negated word must sit within this many content words after the negation on the other side
# for the two to agree; on the side being checked, only the first (the head) counts.
NEGATION_SCOPE = 4
# A negation reaches no further than its clause.
_CLAUSE_END = re.compile(
    r"[.;:!?。；：！？]\s|[,，]\s+(?:but|and|while|whereas)\b|\s[—–-]\s|\s?—\s?"
)
# Where a sentence splits into the clauses that partial support is judged on.
_CLAUSE_SPLIT = re.compile(
    r"\s*[;:,，；]\s+|\s+(?:and|but|while|whereas|because|although|since|so that|which|"
    r"instead of|as well as)\s+",
    re.IGNORECASE,
)
# A clause needs this many content words of its own; shorter pieces join their neighbour.
_MIN_CLAUSE_TERMS = 3
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
    ("high", "low"), ("faster", "slower"), ("fast", "slow"), ("enabled", "disabled"),
    ("all", "some"), ("all", "none"), ("always", "sometimes"),
)  # fmt: skip
ANTONYMS: dict[str, frozenset[str]] = {}
for _a, _b in _ANTONYM_PAIRS:
    ANTONYMS[_a] = ANTONYMS.get(_a, frozenset()) | {_b}
    ANTONYMS[_b] = ANTONYMS.get(_b, frozenset()) | {_a}
_NEGATING_PREFIXES = ("in", "un", "non", "dis", "im", "ir")
_NUMBER_WORDS = {
    "zero": "0", "one": "1", "two": "2", "three": "3", "four": "4", "five": "5", "six": "6",
    "seven": "7", "eight": "8", "nine": "9", "ten": "10", "eleven": "11", "twelve": "12",
    "fifteen": "15", "twenty": "20", "thirty": "30", "sixty": "60", "ninety": "90",
    "hundred": "100", "thousand": "1000", "once": "1", "twice": "2", "single": "1",
}  # fmt: skip
# A word at or above this Zipf frequency is common English ("license" 4.6, "the" 7.7); a name
# made only of such words is not rare enough to call a swap.
RARE_ZIPF = 3.5
RARE_WORD_ZIPF = 3.0  # a plain word this rare ("gzip", "daemon") is held like a name
# A claim word missing from the quote counts half when a quote word's static vector is this
# close to its own, and fully from SYNONYM_FULL.
SYNONYM_COSINE = 0.5
SYNONYM_FULL = 0.75


@functools.lru_cache(maxsize=65536)
def stem(word: str) -> str:
    """The Snowball (Porter 2) stem, as extractive answers use: "licensed" meets "licenses"."""
    return stem_word(word)


@functools.lru_cache(maxsize=65536)
def zipf(word: str) -> float:
    """How common a word is in English, 0 (unknown) to about 8 ("the"), from wordfreq."""
    # Imported on first use: wordfreq takes about a second to import and load its table, which
    # only a process that judges evidence should pay (EvidenceBuilder warms it up).
    from wordfreq import zipf_frequency

    return zipf_frequency(word, "en")


@functools.lru_cache(maxsize=65536)
def rarity(word: str) -> float:
    """The weight of a word in coverage: 0.5 for the commonest words up to 2.5 for rare ones."""
    return min(2.5, max(0.5, (6.5 - zipf(word)) / 1.5))


def warm_up() -> None:
    """Load wordfreq's table now (about half a second) rather than in the first answer."""
    zipf("license")


@functools.lru_cache(maxsize=8192)
def words(text: str) -> tuple[str, ...]:
    """Lower-case words; CJK text, which has no spaces, counts one word per character."""
    out: list[str] = []
    lowered = text.lower()
    cjk = _CJK.search(lowered) is not None  # most text has none: skip the test per word
    for match in _WORD.finditer(lowered):
        token = match.group()
        if "’" in token:
            token = token.replace("’", "'")
        if cjk and _CJK.search(token):
            out.extend(ch for ch in token if not ch.isspace())
        elif token.endswith("n't"):
            out.extend((token[:-3], "n't"))
        else:
            out.append(token)
    return tuple(out)


def _is_content(w: str) -> bool:
    return w not in STOPWORDS and w not in NEGATIONS and not w.isdigit()


@functools.lru_cache(maxsize=8192)
def content_words(text: str) -> dict[str, str]:
    """The content words of text as {stem: first word with that stem}, in order."""
    out: dict[str, str] = {}
    for w in words(text):
        if _is_content(w):
            out.setdefault(stem(w), w)
    return out


@functools.lru_cache(maxsize=8192)
def content_terms(text: str) -> frozenset[str]:
    """The stemmed words of text that carry meaning (stop words and numbers left out)."""
    return frozenset(content_words(text))


def numbers(text: str) -> set[str]:
    """Numbers written in text, digits or small number words, normalised ("1,000" -> "1000")."""
    found = {m.group().replace(",", "").rstrip(".") for m in _NUMBER.finditer(text)}
    found.update(_NUMBER_WORDS[w] for w in words(text) if w in _NUMBER_WORDS)
    return {n.lstrip("0") or "0" for n in found}


# "None" inside a sentence is a value (`None`, "maps to None"), not a negation.
_NONE_VALUE = re.compile(r"(?<=[`'\"(\[{=])None\b|(?<=[^\s.!?:;]\s)None\b")
_CODE_SPAN = re.compile(r"`[^`]*`")
# "unless X" bounds a negation as "not X" does ("do NOT disable it unless you cache X"): a
# word in its scope is not negated by the other side alone. It heads no negation itself.
_SCOPE_ONLY = frozenset({"unless"})


def _negation_words(text: str) -> tuple[str, ...]:
    return words(_NONE_VALUE.sub("nil", text))


def _negates(ws: tuple[str, ...], i: int) -> bool:
    w = ws[i]
    return w in NEGATIONS or (w in _FAIL and ws[i + 1 : i + 2] == ("to",))


@functools.lru_cache(maxsize=8192)
def negations(
    text: str, scope: int = NEGATION_SCOPE, *, bounding: bool = False
) -> tuple[tuple[str, ...], ...]:
    """For each negation, the stems of the first `scope` content words after it, within its
    clause (the first is its head). With bounding, "unless" counts as a negation too."""
    out: list[tuple[str, ...]] = []
    for clause in _CLAUSE_END.split(text):
        ws = _negation_words(clause)
        for i in range(len(ws)):
            if not (_negates(ws, i) or (bounding and ws[i] in _SCOPE_ONLY)):
                continue
            taken: list[str] = []
            for x in ws[i + 1 : i + 7]:
                if x in STOPWORDS or x in _AUXILIARIES or x in NEGATIONS or len(x) <= 2:
                    continue
                if x.isdigit():
                    continue
                taken.append(stem(x))
                if len(taken) >= scope:
                    break
            if taken:
                out.append(tuple(taken))
    return tuple(out)


@functools.lru_cache(maxsize=8192)
def negated_terms(
    text: str, scope: int = NEGATION_SCOPE, *, bounding: bool = False
) -> frozenset[str]:
    """Stems of the first `scope` content words after each negation, within its clause."""
    return frozenset(t for n in negations(text, scope, bounding=bounding) for t in n)


def _plain_uses(text: str) -> Counter[str]:
    """How often each stem of text is used outside a negation's head (code spans left out:
    `override=False` is not the word "override" used as it stands)."""
    prose = _CODE_SPAN.sub(" ", text)
    uses = Counter(stem(w) for w in _negation_words(prose) if _is_content(w))
    uses.subtract(n[0] for n in negations(prose))
    return uses


def _negation_count(text: str) -> int:
    ws = _negation_words(text)
    return sum(1 for i, w in enumerate(ws) if _negates(ws, i) and w not in ("instead", "nor"))


@functools.lru_cache(maxsize=8192)
def clauses(text: str) -> tuple[str, ...]:
    """The clauses of a sentence; a piece with fewer than three content words joins the last."""
    out: list[str] = []
    for part in _CLAUSE_SPLIT.split(text):
        if not part or not part.strip():
            continue
        if out and len(content_terms(part)) < _MIN_CLAUSE_TERMS:
            out[-1] = f"{out[-1]} {part}"
        else:
            out.append(part)
    if len(out) > 1 and len(content_terms(out[0])) < _MIN_CLAUSE_TERMS:
        out[:2] = [f"{out[0]} {out[1]}"]
    return tuple(out)


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


def is_rare_name(name: str) -> bool:
    """An identifier (a.b, a_b, f(), digits inside) or a name with a word rare in English."""
    if re.fullmatch(r"[\d.,:…-]+", name):
        return False  # a number: the number check speaks for it
    if re.search(r"[_.()/]|\d", name):
        return True
    parts = [p for p in re.split(r"[\W_]+", name) if p]
    return bool(parts) and min(zipf(p) for p in parts) < RARE_ZIPF


def _acronyms(text: str) -> set[str]:
    """Initials of runs of capitalised words: "Lesser General Public License" gives "lgpl"."""
    found: set[str] = set()
    run: list[str] = []
    for token in [*re.findall(r"[A-Za-z][\w-]*", text), "."]:
        if token[0].isupper():
            run.append(token[0].lower())
            continue
        for i in range(len(run)):
            for j in range(i + 2, len(run) + 1):
                found.add("".join(run[i:j]))
        run = []
    return found


def missing_names(
    sentence: str, passage: str, context: str = "", extra: tuple[str, ...] = ()
) -> list[str]:
    """Names of the sentence (and the extra words given) absent from the passage and context.

    context is the document's name and heading. A name also counts as present when each of its
    parts is there, when it is the acronym of capitalised words of the passage, or when a part
    of five letters or more begins a word of the passage ("os.environ" and "environment").
    """
    haystack = f"{passage} {context}".lower()
    passage_words = set(words(passage))
    passage_stems = {stem(w) for w in passage_words}
    acronyms: set[str] | None = None
    out = []
    for name in sorted(names(sentence) | set(extra)):
        if name in haystack:
            continue
        parts = [p for p in re.split(r"[\W_]+", name) if p]
        if name.isalpha() and stem(name) in passage_stems:
            continue  # "UIDs" and "UID"
        # A dotted name is there when its long parts are: "os.environ" in "the environment".
        long_parts = [p for p in parts if len(p) > 2] if "." in name else parts
        if long_parts and all(
            p in haystack or (len(p) >= 5 and any(w.startswith(p) for w in passage_words))
            for p in long_parts
        ):
            continue
        if name.isalpha():
            acronyms = _acronyms(passage) if acronyms is None else acronyms
            if name in acronyms:
                continue
        out.append(name)
    return out


@dataclass(frozen=True, slots=True)
class Features:
    """What the checks found for one (sentence, quote) pair."""

    cosine: float  # embedding cosine of sentence and quote, in [-1, 1]
    coverage: float  # rarity-weighted share of the sentence's content words found in the quote
    clause_coverage: tuple[float, ...]  # the same per clause of the sentence
    number_changed: bool  # the sentence has a number the quote lacks, and the quote has others
    number_missing: bool  # the sentence has a number, and the quote has none at all
    negation_mismatch: bool  # a shared word is negated on one side only
    polarity_mismatch: bool  # the closest passage sentence and the claim differ in negation parity
    antonym: bool  # the sentence uses the opposite of a word the passage uses
    missing_names: int  # names or code tokens of the sentence absent from the passage
    name_swap: bool  # a rare name is missing from an otherwise covered clause
    added_name: bool  # a rare name is missing, and its clause is not covered either


@dataclass(frozen=True, slots=True)
class Calibration:
    """Weights and thresholds of support_score and verdict_for; fitted on eval/claims.jsonl.

    The defaults are fitted for the static embedder's cosines (services/evidence/static.py);
    LOCAL_CALIBRATION for the local MiniLM model's, which lean on the cosine more.
    """

    cosine_weight: float = 0.4
    cosine_floor: float = 0.3  # a cosine at or below this counts as 0
    negation_penalty: float = 0.6
    polarity_penalty: float = 0.1
    antonym_penalty: float = 0.6
    swap_penalty: float = 0.4
    added_name_penalty: float = 0.2
    number_missing_penalty: float = 0.2
    # A quote holding this share of the sentence's weighted words backs it whatever the cosine.
    copy_coverage: float = 0.9
    contradiction_cap: float = 0.2  # the highest score a contradicted sentence may keep
    clause_gap: float = 0.45  # clauses this far apart in coverage also make a PARTIAL
    clause_low: float = 0.2  # a clause covered below this is not supported ...
    clause_high: float = 0.75  # ... while another covered at or above this is: PARTIAL
    supported: float = 0.425
    partial: float = 0.375


CALIBRATION = Calibration()
LOCAL_CALIBRATION = Calibration(cosine_weight=0.8)
# A clause whose words, names aside, are covered this well holds the slot of a swapped name.
_SWAP_COVERAGE = 0.6
# A clause covered less than this is an added part: a number in it is new, not changed.
_ADDED_CLAUSE = 0.35


def _weighted(terms: dict[str, str], present: dict[str, str]) -> float:
    """The rarity-weighted share of terms found in present, a word not found counting in part
    when a word of present is close to it by static vector ("cost" for "price"): half at
    SYNONYM_COSINE, fully from SYNONYM_FULL (static vectors have no context, so a close word
    earns half until it is very close)."""
    total = sum(rarity(w) for w in terms.values())
    if not total:
        return 0.0
    found = sum(rarity(w) for s, w in terms.items() if s in present)
    missing = [w for s, w in terms.items() if s not in present]
    if missing and present:
        others = list(present.values())
        vectors = word_vectors(missing + others)
        best = (vectors[: len(missing)] @ vectors[len(missing) :].T).max(axis=1)
        for w, cosine in zip(missing, best.tolist(), strict=True):
            if cosine >= SYNONYM_COSINE:
                span = SYNONYM_FULL - SYNONYM_COSINE
                found += rarity(w) * min(1.0, 0.5 + 0.5 * (cosine - SYNONYM_COSINE) / span)
    return found / total


def features(
    sentence: str, quote: str, cosine: float, *, around: str = "", context: str = ""
) -> Features:
    """Compare a sentence with a candidate quote; cosine comes from the embedder.

    around is the quote with its neighbouring sentences (the quote alone when empty): the checks
    for contradictions and names read it, coverage reads the quote only. context is the
    document's name and heading, where a name the sentence uses may be found.
    """
    around = around or quote
    claim_words = content_words(sentence)
    around_terms = content_terms(around)
    parts = clauses(sentence)
    quote_words = content_words(quote)
    clause_cov = tuple(_weighted(content_words(c), quote_words) for c in parts)
    claim_numbers, quote_numbers = numbers(sentence), numbers(quote)
    absent = claim_numbers - quote_numbers
    if len(parts) > 1 and absent:
        # A number in a clause the quote does not cover is part of an addition, not a change.
        absent = set().union(
            *(
                numbers(c) & absent
                for c, cov in zip(parts, clause_cov, strict=True)
                if cov >= _ADDED_CLAUSE
            )
        )
    # An opposite word inside a clause the quote does not cover is part of an addition.
    covered_text = " ".join(
        c
        for c, cov in zip(parts, clause_cov, strict=True)
        if cov >= _ADDED_CLAUSE or len(parts) == 1
    )
    covered = set(words(covered_text))
    missing = missing_names(sentence, around, context)
    # Plain words rare in English ("gzip", "daemon") are held like names.
    rare_words = tuple(
        w
        for s, w in claim_words.items()
        if s not in around_terms and w.isalpha() and len(w) > 2 and zipf(w) < RARE_WORD_ZIPF
    )
    rare = [n for n in missing_names(sentence, around, context, rare_words) if is_rare_name(n)]
    swap, added = _name_slots(parts, rare, around_terms)
    swap = swap or _proper_name_swap(sentence, around, context)
    return Features(
        cosine=cosine,
        coverage=_weighted(claim_words, quote_words),
        clause_coverage=clause_cov,
        number_changed=bool(absent) and bool(quote_numbers),
        number_missing=bool(absent) and not quote_numbers,
        negation_mismatch=_negation_mismatch(
            sentence, around, frozenset(claim_words), around_terms
        ),
        polarity_mismatch=_polarity_mismatch(sentence, around, frozenset(claim_words)),
        antonym=_antonym(set(words(sentence)), set(words(around)), covered),
        missing_names=len(missing),
        name_swap=swap,
        added_name=added,
    )


def _negation_mismatch(
    sentence: str, passage: str, claim_terms: frozenset[str], passage_terms: frozenset[str]
) -> bool:
    """A word both sides use heads a negation on one side, and the other does not negate it.

    A word the passage negates is not contradicted by a claim that uses it as it stands when
    the passage's sentence uses it so as often too, and the claim does not put next to it
    what the passage negates with it: "termination ... does not terminate the licenses of
    parties" against "when rights are terminated, people keep their licenses", but "on Your own
    behalf, not on behalf of any Contributor" against "on behalf of the Contributors". A word
    with a negating prefix on the other side ("cannot map", "unmappable") is negated there too.
    """
    shared = claim_terms & passage_terms
    claim_scope = negated_terms(sentence, bounding=True)
    passage_scope = negated_terms(passage, bounding=True)
    claim_uses = _plain_uses(sentence)
    for a, b in _sentence_ranges(passage):
        piece = passage[a:b]
        piece_uses: Counter[str] | None = None
        for negation in negations(piece):
            head = negation[0]
            if head not in shared or head in claim_scope or _prefix_negated(head, sentence):
                continue
            piece_uses = _plain_uses(piece) if piece_uses is None else piece_uses
            if claim_uses[head] > piece_uses[head]:
                return True
            if set(_after(sentence, head)) & set(negation[1:]):
                return True
    return any(
        n[0] in shared and n[0] not in passage_scope and not _prefix_negated(n[0], passage)
        for n in negations(sentence)
    )


def _after(text: str, term: str, scope: int = NEGATION_SCOPE) -> list[str]:
    """Stems of the content words that follow each use of the stem term in text."""
    ws = [stem(w) for w in words(text) if _is_content(w)]
    return [t for i, w in enumerate(ws) if w == term for t in ws[i + 1 : i + 1 + scope]]


def _prefix_negated(term: str, text: str) -> bool:
    """text holds the stem term behind a negating prefix: "map" in "unmappable"."""
    if len(term) < 3:
        return False
    return any(
        w.startswith(prefix) and w[len(prefix) :].startswith(term)
        for w in words(text)
        for prefix in _NEGATING_PREFIXES
    )


@functools.lru_cache(maxsize=4096)
def _sentence_ranges(text: str) -> tuple[tuple[int, int], ...]:
    """The sentences of a passage, or the whole of it; the same passage is read for every
    sentence of an answer."""
    return tuple(sentence_ranges(text)) or ((0, len(text)),)


def _polarity_mismatch(sentence: str, passage: str, claim_terms: frozenset[str]) -> bool:
    """The passage sentence sharing most words with the claim differs in negation parity."""
    best, overlap = passage, -1
    for a, b in _sentence_ranges(passage):
        shared = len(content_terms(passage[a:b]) & claim_terms)
        if shared > overlap:
            best, overlap = passage[a:b], shared
    return _negation_count(sentence) % 2 != _negation_count(best) % 2


def _antonym(claim_words: set[str], passage_words: set[str], covered: set[str]) -> bool:
    """A word of a covered clause whose opposite the passage uses and the claim does not."""
    claim_stems = {stem(w) for w in claim_words}
    for w in (claim_words & covered) - passage_words:
        # The opposite counts only when the claim does not use it too ("written ... read").
        if any(stem(a) not in claim_stems for a in ANTONYMS.get(w, frozenset()) & passage_words):
            return True
        for prefix in _NEGATING_PREFIXES:
            if prefix + w in passage_words:
                return True
            if (
                w.startswith(prefix)
                and len(w) - len(prefix) >= 4
                and w[len(prefix) :] in passage_words
            ):
                return True
    return False


_PROPER_NAME = re.compile(r"\b[A-Z][\w-]*(?:\s+[A-Z][\w-]*)+")


def _proper_name_swap(sentence: str, passage: str, context: str = "") -> bool:
    """A proper name of the sentence whose last word the passage uses in a name of its own,
    while the words before it appear nowhere: "the Apache License" where the passage lists
    "the GNU General Public License", "the Free Software Foundation" for "Mozilla Foundation".
    """
    haystack = f"{passage} {context}".lower()
    theirs = {m.group().split()[-1].lower() for m in _PROPER_NAME.finditer(passage)}
    for m in _PROPER_NAME.finditer(sentence):
        before = sentence[: m.start()].rstrip()
        parts = m.group().split()
        if not before or before[-1] in ".!?:;\"'“(":
            parts = parts[1:]  # the sentence's first word is capitalised anyway
        if len(parts) < 2 or parts[-1].lower() not in theirs:
            continue
        modifiers = [p.lower() for p in parts[:-1] if p.lower() not in STOPWORDS]
        if modifiers and not any(re.search(rf"\b{re.escape(p)}\b", haystack) for p in modifiers):
            return True
    return False


def _name_slots(
    parts: tuple[str, ...], rare: list[str], passage_terms: frozenset[str]
) -> tuple[bool, bool]:
    """(a rare name sits in a clause the passage otherwise covers, one sits in an uncovered one)."""
    swap = added = False
    for clause in parts:
        lowered = clause.lower()
        here = [n for n in rare if n in lowered]
        if not here:
            continue
        name_stems = {stem(p) for n in here for p in re.split(r"[\W_]+", n) if p}
        rest = [s for s in content_words(clause) if s not in name_stems]
        if rest and sum(s in passage_terms for s in rest) / len(rest) >= _SWAP_COVERAGE:
            swap = True
        else:
            added = True
    return swap, added


def _rescaled_cosine(f: Features, c: Calibration) -> float:
    return max(0.0, (f.cosine - c.cosine_floor) / (1.0 - c.cosine_floor))


def relevance(f: Features, c: Calibration = CALIBRATION) -> float:
    """How close a quote is to the sentence, before the checks for contradictions."""
    mixed = c.cosine_weight * _rescaled_cosine(f, c) + (1.0 - c.cosine_weight) * f.coverage
    return max(mixed, f.coverage) if f.coverage >= c.copy_coverage else mixed


def contradicted(f: Features) -> bool:
    """A check found the passage saying something else than the sentence."""
    return f.negation_mismatch or f.antonym or f.name_swap or f.number_changed


def support_score(f: Features, c: Calibration = CALIBRATION) -> float:
    """The support of a quote for a sentence in [0, 1]; higher is better supported."""
    score = relevance(f, c)
    score -= c.negation_penalty * f.negation_mismatch + c.polarity_penalty * f.polarity_mismatch
    score -= c.antonym_penalty * f.antonym + c.swap_penalty * f.name_swap
    score -= c.added_name_penalty * f.added_name + c.number_missing_penalty * f.number_missing
    cov = f.clause_coverage
    if contradicted(f):
        score = min(score, c.contradiction_cap)
    elif len(cov) > 1 and (
        min(cov) < c.clause_low <= c.clause_high <= max(cov) or max(cov) - min(cov) >= c.clause_gap
    ):
        # One clause is backed and another is not: an added part, so PARTIAL.
        score = min(max(score, c.partial), c.supported - 0.01)
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
