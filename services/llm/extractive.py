"""The embedded default generator: answers with the source sentences that best match the question.

It is deterministic, needs no model, and cites every sentence it uses with [N], so the whole
chat path, citations included, runs and is testable with no LLM at all.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from services.llm.base import (
    Finished,
    GenerationEvent,
    GenerationRequest,
    Retrieval,
    TextPiece,
    estimate_tokens,
)

NOTHING_FOUND = "I could not find anything relevant to your question in this assistant's documents."
GREETING = "Hello! I answer questions from this assistant's documents. What would you like to know?"
NO_RETRIEVAL = (
    "Retrieval is turned off for this assistant, and the built-in generator can only answer "
    "from documents. Configure an LLM to chat without them."
)
MAX_SENTENCES = 3
RELATIVE_FLOOR = 0.5
MAX_SENTENCE_CHARS = 400

WORD = re.compile(r"[^\W_]+", re.UNICODE)
# A sentence ends at . ! ? before a capital or digit, or where a paragraph ends; a single
# newline is only the source's line wrapping.
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[\"'(\[]?[A-Z0-9])|\n\s*\n")
# Numbered markers inside a document would read as citations of ours.
MARKER_LIKE = re.compile(r"[\[【]\s*[0-9０-９][0-9０-９\s,，、\-–—]*[\]】]")
# A plain word list reads better than a 70-line literal.
STOPWORDS = frozenset(
    re.split(
        r"\s+",
        """a an and are as at be by can could did do does for from had has have how i if in is it
    its me my of on or our should so that the their them there these they this to was we were
    what when where which who whom why will with would you your about into than then also any
    all tell please explain describe get much many""",
    )
)


def terms(text: str) -> list[str]:
    return [stem(w) for w in WORD.findall(text.lower()) if w not in STOPWORDS]


def stem(word: str) -> str:
    # A light suffix strip: enough for "days"/"day" or "installing"/"install" to meet.
    for suffix in ("ing", "ed", "es", "s"):
        if len(word) > len(suffix) + 2 and word.endswith(suffix):
            return word[: -len(suffix)]
    return word


@dataclass(frozen=True)
class Candidate:
    source_index: int  # 1-based, as in the prompt
    position: int
    text: str
    score: float


def sentences_of(text: str) -> list[str]:
    kept = []
    in_fence = False
    lines = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith(("```", "~~~")):
            in_fence = not in_fence
            continue
        # Headings, fences and table rules are structure, not statements.
        if in_fence or stripped.startswith("#") or set(stripped) <= set("-=|:* "):
            lines.append("")
            continue
        if stripped.startswith(("-", "*", ">", "•")):
            lines.append("")  # a list item stands alone
        lines.append(stripped.lstrip("-*>• ").strip())
    for piece in SENTENCE_END.split("\n".join(lines)):
        sentence = " ".join(MARKER_LIKE.sub("", piece).split())
        if len(WORD.findall(sentence)) >= 3 and len(sentence) <= MAX_SENTENCE_CHARS:
            kept.append(sentence)
    return kept


def rank(question: str, texts: Sequence[str]) -> list[Candidate]:
    wanted = set(terms(question))
    if not wanted:
        return []
    per_source = [sentences_of(t) for t in texts]
    all_sentences = [s for sentences in per_source for s in sentences]
    doc_freq = Counter(t for s in all_sentences for t in set(terms(s)))
    total = max(len(all_sentences), 1)
    candidates = []
    for index, sentences in enumerate(per_source, start=1):
        for position, sentence in enumerate(sentences):
            found = wanted & set(terms(sentence))
            if not found:
                continue
            # idf-weighted overlap, nudged toward sources retrieval ranked higher.
            score = sum(math.log(1 + total / doc_freq[t]) for t in found)
            score *= 1 + 0.1 / index
            candidates.append(Candidate(index, position, sentence, score))
    return sorted(candidates, key=lambda c: (-c.score, c.source_index, c.position))


def compose(request: GenerationRequest) -> str:
    if request.retrieval is Retrieval.GATED:
        return GREETING
    if request.retrieval is Retrieval.DISABLED:
        return NO_RETRIEVAL
    chosen: list[Candidate] = []
    ranked = rank(request.question, request.source_texts)
    for candidate in ranked:
        # Sentences far weaker than the best match are noise, not support.
        if candidate.score < RELATIVE_FLOOR * ranked[0].score:
            break
        if candidate.text not in {c.text for c in chosen}:
            chosen.append(candidate)
        if len(chosen) == MAX_SENTENCES:
            break
    if not chosen:
        return NOTHING_FOUND
    chosen.sort(key=lambda c: (c.source_index, c.position))
    parts = []
    for c in chosen:
        sentence = c.text if c.text[-1] in ".!?" else c.text + "."
        parts.append(
            f"{sentence[:-1]} [{c.source_index}]{sentence[-1]}" if request.citations else sentence
        )
    return " ".join(parts)


class ExtractiveGenerator:
    name = "extractive"

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationEvent]:
        answer = compose(request)
        # Word-sized pieces, so clients see a stream just as they would from a model.
        for piece in re.findall(r"\S+\s*", answer):
            yield TextPiece(piece)
        prompt = "".join(m.content for m in request.messages)
        yield Finished(
            prompt_tokens=estimate_tokens(prompt), completion_tokens=estimate_tokens(answer)
        )
