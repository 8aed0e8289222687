"""The embedded default generator: answers with the source sentences that best match the question.

It needs no language model, cites every sentence it uses with [N], and is deterministic: the
same question over the same sources gives the same answer and citations. Sentences come from
services.llm.sentences (statements only: no headings, table rows or fragments). Each is scored
by meaning (cosine similarity to the question under the injected embedder, when there is one)
and by shared words (Snowball stems, weighted by rarity). The best one comes first; more
follow only from the same document unless another document matches nearly as well; the answer
holds at most MAX_SENTENCES sentences and about MAX_ANSWER_CHARS characters. When even the best
sentence is weak evidence, the answer says that the documents do not say, and cites nothing.
"""

from __future__ import annotations

import asyncio
import functools
import math
import re
import threading
from array import array
from collections import Counter, OrderedDict
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from services.llm.answer_type import Expected, expected_answer, unknown_names
from services.llm.base import (
    Finished,
    GenerationEvent,
    GenerationRequest,
    Retrieval,
    TextPiece,
    estimate_tokens,
)
from services.llm.sentences import WORD, Statement, statements_of
from services.llm.stems import stem_words

NOTHING_FOUND = (
    "The documents do not say: I could not find anything relevant to your question in this "
    "assistant's documents."
)
GREETING = "Hello! I answer questions from this assistant's documents. What would you like to know?"
NO_RETRIEVAL = (
    "Retrieval is turned off for this assistant, and the built-in generator can only answer "
    "from documents. Configure an LLM to chat without them."
)
MAX_SENTENCES = 3
MAX_ANSWER_CHARS = 700
# A further sentence must score at least this share of the best one; one from another document
# must nearly match it, or the answer would read as if one document said both.
SAME_DOCUMENT_FLOOR = 0.8
OTHER_DOCUMENT_FLOOR = 0.95
# ... or, scoring at least SAME_DOCUMENT_FLOOR, when it holds question words worth this share
# of the question that the answer so far lacks.
NEW_PART_SHARE = 0.2
# Weights of meaning and shared words in a sentence's score, and the scores below which the
# best sentence is too weak to answer with: calibrated on questions over licence texts and
# READMEs, half of which the documents cannot answer (docs/llm.md, "Calibration").
SEMANTIC_WEIGHT = 0.65
LEXICAL_WEIGHT = 0.35
MIN_SCORE = 0.37
MIN_LEXICAL_SCORE = 0.5  # without an embedder: the share of the question's weight matched
CONTEXT_SHARE = 0.5
# A sentence that opens by pointing back ("This will...", "It also...") reads poorly alone.
ANAPHORA_PENALTY = 0.9
ANAPHORA = re.compile(r"^(?:This|That|These|Those|It|They|Such|He|She)\b")
# "How do I install X?" is best answered with the command, when a source gives one.
HOW_TO = re.compile(r"^\s*how\s+(?:do|can|to|should|would|does)\b", re.IGNORECASE)
COMMAND_BONUS = 1.15
_EXTENSION = re.compile(r"\.[A-Za-z0-9]{1,5}$")
# A question that asks for a quantity ranks sentences without one this much lower, and is not
# answered with one (services.llm.answer_type).
UNTYPED_PENALTY = 0.7
# At most this many statements are embedded per question, the best by shared words first.
MAX_EMBEDDED = 96
# Sentence vectors kept for later questions (about 3 KB each): the same chunks come back for
# related questions, and embedding their sentences was most of an answer's work.
SENTENCE_CACHE_SIZE = 8192
# Words that carry no topic, as a plain list.
STOPWORDS = frozenset(
    re.split(
        r"\s+",
        """a an and are as at be by can could did do does for from had has have how i if in is it
    its me my of on or our should so that the their them there these they this to was we were
    what when where which who whom why will with would you your about into than then also any
    all tell please explain describe get much many say says said document documents s t""".strip(),
    )
)


class SentenceEmbedder(Protocol):
    """What the generator needs of an embedder (services.retrieval.embeddings.Embedder)."""

    def embed_documents(self, texts: Sequence[str]) -> Sequence[Sequence[float]]: ...

    def embed_query(self, text: str) -> list[float]: ...


def terms(text: str) -> list[str]:
    """The stemmed topic words of a text: "Warranties" and "warranty" both give "warranti"."""
    words = [w for w in WORD.findall(text.lower()) if w not in STOPWORDS]
    return stem_words(words)


@dataclass(frozen=True)
class Candidate:
    source_index: int  # 1-based, as in the prompt
    document: str  # the document id, or the source index when unknown
    statement: Statement
    lexical: float  # the share of the question's term weight the sentence matches, 0..1
    semantic: float = 0.0  # cosine similarity to the question, 0..1
    score: float = 0.0
    named: bool = False  # the question names the document or section ("the Apache License")
    # The question's terms the sentence itself holds, each with its share of the question.
    found: tuple[tuple[str, float], ...] = ()

    @property
    def text(self) -> str:
        return self.statement.text


def candidates_of(request: GenerationRequest) -> list[Candidate]:
    """Every statement of every source, scored by shared words only."""
    wanted = Counter(terms(request.question))
    parsed = [_statements_with_terms(t) for t in request.source_texts]
    per_source = [[statement for statement, _ in ss] for ss in parsed]
    statement_terms = [[have for _, have in ss] for ss in parsed]
    doc_freq = Counter(t for ts in statement_terms for s in ts for t in s)
    total = sum(len(ts) for ts in statement_terms) + 1
    weight = {t: math.log(1 + total / (1 + doc_freq[t])) for t in wanted}
    wanted_weight = sum(weight.values()) or 1.0
    named_sources = _named_sources(request, set(wanted))
    found = []
    for index, (statements, term_sets) in enumerate(
        zip(per_source, statement_terms, strict=True), start=1
    ):
        if named_sources and index not in named_sources:
            continue
        document = _document_of(request, index)
        # A question word in the document's name or the section's heading ("What does the
        # Apache License say about warranties?") is half matched by each of its sentences, so
        # the other words decide between them.
        context = _context_terms(request, index)
        for statement, have in zip(statements, term_sets, strict=True):
            matched = sum(
                weight[t] * (1.0 if t in have else CONTEXT_SHARE if t in context else 0.0)
                for t in wanted
            )
            lexical = round(matched / wanted_weight, 6)
            named = any(t in context for t in wanted)
            own = tuple(sorted((t, weight[t] / wanted_weight) for t in wanted if t in have))
            found.append(Candidate(index, document, statement, lexical, named=named, found=own))
    return found


def _named_sources(request: GenerationRequest, wanted: set[str]) -> set[int]:
    """The sources of the document(s) the question names, when it names some of those given.

    A question term is a name when it is in some documents' names and not in all ("apache" of
    "apache-2.0.txt"); the sources whose names hold the most of them are the ones to answer
    from, so that a question about the Apache License is never answered from the GPL. Empty
    when the question names none of the documents, or all of them alike.
    """
    # The extension is no name: "Does the spec cover HTML files?" names no .html document.
    names = [set(terms(_EXTENSION.sub("", source.document_name))) for source in request.sources]
    distinctive = {
        t for t in wanted if any(t in n for n in names) and not all(t in n for n in names)
    }
    counts = [len(distinctive & n) for n in names]
    top = max(counts, default=0)
    return {i for i, count in enumerate(counts, start=1) if top and count == top}


@functools.lru_cache(maxsize=2048)
def _statements_with_terms(text: str) -> tuple[tuple[Statement, frozenset[str]], ...]:
    # A chunk's statements and their stems depend on its text alone, and the same chunks come
    # back for related questions: splitting them was most of what the cached vectors left.
    return tuple((s, frozenset(terms(f"{s.text} {s.match_text}"))) for s in statements_of(text))


def _context_terms(request: GenerationRequest, index: int) -> set[str]:
    if index > len(request.sources):
        return set()
    source = request.sources[index - 1]
    return set(terms(f"{source.document_name} {source.location.heading}"))


def _document_of(request: GenerationRequest, index: int) -> str:
    if index <= len(request.sources):
        return request.sources[index - 1].document_id or f"#{index}"
    return f"#{index}"


class SentenceVectors:
    """An embedder's vectors of sentences, the most recently used kept; safe across threads.

    A text's vector does not depend on its batch, so a kept one is the one a new run would
    give (the answer does not change).
    """

    def __init__(self, embedder: SentenceEmbedder, size: int = SENTENCE_CACHE_SIZE) -> None:
        self.embedder = embedder
        self.size = size
        self._kept: OrderedDict[str, array[float]] = OrderedDict()
        self._lock = threading.Lock()

    def embed_documents(self, texts: Sequence[str]) -> list[Sequence[float]]:
        found: dict[str, Sequence[float]] = {}
        with self._lock:
            for text in texts:
                if text in self._kept:
                    self._kept.move_to_end(text)
                    found[text] = self._kept[text]
        missing = list(dict.fromkeys(t for t in texts if t not in found))
        if missing:
            vectors = self.embedder.embed_documents(missing)
            with self._lock:
                for text, vector in zip(missing, vectors, strict=True):
                    found[text] = self._kept[text] = array("d", vector)
                while len(self._kept) > self.size:
                    self._kept.popitem(last=False)
        return [found[t] for t in texts]

    def embed_query(self, text: str) -> list[float]:
        return self.embedder.embed_query(text)


def score(
    question: str,
    candidates: list[Candidate],
    embedder: SentenceEmbedder | None,
    *,
    query_vector: Sequence[float] | None = None,
    expected: Expected | None = None,
) -> list[Candidate]:
    """Candidates with their final scores, best first; ties go to the earlier source and place.

    query_vector is the question's vector under embedder, when the caller has it already;
    expected is what the question asks for (expected_answer), which scales down statements
    that do not state it.
    """
    if embedder is None:
        scored = [_with(c, 0.0, c.lexical) for c in candidates]
    else:
        # Lexical order, then source order, picks which statements are worth embedding.
        order = sorted(candidates, key=lambda c: (-c.lexical, c.source_index, c.statement.position))
        shortlist = order[:MAX_EMBEDDED]
        vectors = embedder.embed_documents([c.statement.match_text for c in shortlist])
        query = query_vector if query_vector is not None else embedder.embed_query(question)
        scored = []
        for c, vector in zip(shortlist, vectors, strict=True):
            cosine = max(0.0, sum(a * b for a, b in zip(query, vector, strict=True)))
            # Rounded, so that float noise can never reorder equal scores.
            semantic = round(cosine, 6)
            value = SEMANTIC_WEIGHT * semantic + LEXICAL_WEIGHT * c.lexical
            scored.append(_with(c, semantic, value))
    how_to = bool(HOW_TO.match(question))
    scored = [_with(c, c.semantic, c.score * _shape(c.statement, how_to, expected)) for c in scored]
    return sorted(scored, key=lambda c: (-c.score, c.source_index, c.statement.position))


def _shape(statement: Statement, how_to: bool, expected: Expected | None) -> float:
    factor = ANAPHORA_PENALTY if ANAPHORA.match(statement.text) else 1.0
    if how_to and statement.code:
        factor *= COMMAND_BONUS
    if expected is not None and not expected.met_by(statement.text):
        factor *= UNTYPED_PENALTY
    return factor


def _with(c: Candidate, semantic: float, value: float) -> Candidate:
    return replace(c, semantic=semantic, score=round(value, 6))


def choose(
    ranked: list[Candidate], *, semantic: bool, expected: Expected | None = None
) -> list[Candidate]:
    """The sentences of the answer, in the order they are shown; [] when evidence is weak."""
    if not ranked:
        return []
    best = ranked[0]
    if best.score < (MIN_SCORE if semantic else MIN_LEXICAL_SCORE) or best.lexical == 0.0:
        return []
    if expected is not None and not expected.met_by(best.text):
        return []  # asked for a quantity, and no sentence that states one comes close
    chosen = [best]
    length = len(best.text)
    seen = {_fingerprint(best.text)}
    covered = {term for term, _ in best.found}
    for c in ranked[1:]:
        if len(chosen) == MAX_SENTENCES:
            break
        if c.score < SAME_DOCUMENT_FLOOR * best.score:
            break
        if c.document not in {x.document for x in chosen}:
            # Another document joins only if it is not the wrong one of those the question
            # names, and it answers as well, or answers a part the answer leaves open ("...,
            # and who approves a 1,500 EUR claim?").
            if best.named and not c.named:
                continue
            adds = sum(share for term, share in c.found if term not in covered)
            if c.score < OTHER_DOCUMENT_FLOOR * best.score and adds < NEW_PART_SHARE:
                continue
        if _fingerprint(c.text) in seen or length + len(c.text) > MAX_ANSWER_CHARS:
            continue
        seen.add(_fingerprint(c.text))
        covered.update(term for term, _ in c.found)
        chosen.append(c)
        length += len(c.text)
    # The best sentence first; the rest as they stand in their documents, this document first.
    rest = sorted(
        chosen[1:],
        key=lambda c: (c.document != best.document, c.source_index, c.statement.position),
    )
    return [best, *rest]


def _fingerprint(text: str) -> frozenset[str]:
    # Overlapping chunks repeat sentences, sometimes with different surrounding spaces.
    return frozenset(terms(text))


def render(chosen: Sequence[Candidate], *, citations: bool) -> str:
    parts = []
    for c in chosen:
        text = c.text.rstrip()
        if c.statement.code:
            body, end = text, "."
        else:
            match = re.search(r"[.!]['\"”’)\]]*$", text)
            body, end = (text[: match.start()], text[match.start() :]) if match else (text, ".")
        parts.append(f"{body} [{c.source_index}]{end}" if citations else f"{body}{end}")
    return " ".join(parts)


def compose(request: GenerationRequest, embedder: SentenceEmbedder | None = None) -> str:
    if request.retrieval is Retrieval.GATED:
        return GREETING
    if request.retrieval is Retrieval.DISABLED:
        return NO_RETRIEVAL
    if unknown_names(request.question, request.source_texts):
        return NOTHING_FOUND
    candidates = candidates_of(request)
    if not any(c.lexical for c in candidates):
        return NOTHING_FOUND
    expected = expected_answer(request.question)
    ranked = score(
        request.question,
        candidates,
        embedder,
        query_vector=request.question_vector,
        expected=expected,
    )
    chosen = choose(ranked, semantic=embedder is not None, expected=expected)
    if not chosen:
        return NOTHING_FOUND
    return render(chosen, citations=request.citations)


class ExtractiveGenerator:
    name = "extractive"

    def __init__(self, embedder: SentenceEmbedder | None = None) -> None:
        # Without an embedder sentences are ranked by shared words alone.
        self.embedder = SentenceVectors(embedder) if embedder is not None else None

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationEvent]:
        answer = await asyncio.to_thread(compose, request, self.embedder)
        # Word-sized pieces, so clients see a stream just as they would from a model.
        for piece in re.findall(r"\S+\s*", answer):
            yield TextPiece(piece)
        prompt = "".join(m.content for m in request.messages)
        yield Finished(
            prompt_tokens=estimate_tokens(prompt), completion_tokens=estimate_tokens(answer)
        )
