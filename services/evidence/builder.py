"""Evidence for the sentences of one answer: quotes, scores, verdicts, attribution.

An EvidenceBuilder is shared by the server; for_answer() gives an AnswerEvidence that holds
one answer's sources and caches the vectors of its sentences and candidate quotes, so a
sentence judged while streaming is not embedded again when the answer is finished.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np

from services.citations import (
    CitationOrigin,
    Citations,
    CitationSource,
    CitationSpan,
    Evidence,
    Marker,
    RetrievedChunk,
    SupportVerdict,
)
from services.citations.spans import answer_sentences
from services.evidence.quotes import Window, quote_location, sentences_of, windows_of
from services.evidence.scorer import (
    CALIBRATION,
    LOCAL_CALIBRATION,
    Calibration,
    Features,
    content_terms,
    features,
    is_claim,
    relevance,
    support_score,
    verdict_for,
    warm_up,
)
from services.retrieval.embeddings import EmbeddingError

log = logging.getLogger(__name__)

# Candidate quotes embedded per source: the best ones by word overlap with the sentence.
WINDOWS_PER_SOURCE = 2
# A source the sentence does not cite is only considered when its best quote covers at least
# this share of the sentence's content words; below it, no calibrated score reaches PARTIAL.
MIN_COVERAGE = 0.25
# At most this many sources the sentence does not cite are embedded and scored.
MAX_OTHER_SOURCES = 3
# A source is attributed to a sentence the model did not mark only when its quote holds at
# least this share of the sentence's weighted words, or all of one of its clauses: attribution
# claims a support the model never claimed, and a sentence that only shares its subject with a
# passage ("The adduser package also ships a graphical user manager" against "The adduser
# package includes the adduser and deluser commands") reached SUPPORTED on the cosine and the
# subject's words.
ATTRIBUTION_COVERAGE = 0.6
# At most this many sources are attributed to one sentence.
MAX_ATTRIBUTED = 2
# Chunks whose sentence layout is kept between answers (a few kilobytes each).
LAYOUT_CACHE = 1024

_RANK = {SupportVerdict.SUPPORTED: 3, SupportVerdict.PARTIAL: 2, SupportVerdict.UNSUPPORTED: 1}


class TextEmbedder(Protocol):
    def embed_documents(self, texts: Sequence[str]) -> list[list[float]]: ...


@dataclass(frozen=True, slots=True)
class Judgement:
    """What one sentence of the answer became: a span, an uncited claim, or neither."""

    sentence: CitationSpan
    span: CitationSpan | None = None  # cited by a marker, or attributed
    uncited: CitationSpan | None = None  # a claim that no given source supports


@dataclass(eq=False)
class _Source:
    index: int
    text: str
    chunk: RetrievedChunk
    sentences: tuple[tuple[int, int], ...]
    windows: tuple[Window, ...]
    sentence_terms: tuple[frozenset[str], ...]
    context: str  # the document's name and the chunk's heading, where names are looked up

    def around(self, window: Window) -> str:
        """The window with one sentence either side: where a nearby negation still counts."""
        first = self.sentences[max(0, window.first - 1)][0]
        last = self.sentences[min(len(self.sentences) - 1, window.last + 1)][1]
        return self.text[first:last]


class EvidenceBuilder:
    """Scores answers against their sources with one embedder and its calibration."""

    def __init__(self, embedder: TextEmbedder, calibration: Calibration = CALIBRATION) -> None:
        self.embedder = embedder
        self.calibration = calibration
        warm_up()

    def for_answer(
        self,
        sources: Sequence[CitationSource],
        chunks: Sequence[RetrievedChunk],
        *,
        attribute: bool = True,
    ) -> AnswerEvidence:
        return AnswerEvidence(self, sources, chunks, attribute=attribute)


class AnswerEvidence:
    """One answer's evidence; judge() may be called as sentences complete, then finish()."""

    def __init__(
        self,
        builder: EvidenceBuilder,
        sources: Sequence[CitationSource],
        chunks: Sequence[RetrievedChunk],
        *,
        attribute: bool,
    ) -> None:
        self._builder = builder
        self._attribute = attribute
        self._sources: dict[int, _Source] = {}
        for source, chunk in zip(sources, chunks, strict=True):
            ranges, windows, terms = _layout(chunk.text)
            self._sources[source.index] = _Source(
                index=source.index,
                text=chunk.text,
                chunk=chunk,
                sentences=ranges,
                windows=windows,
                sentence_terms=terms,
                context=f"{chunk.document_name} {chunk.location.heading}",
            )
        self._vectors: dict[str, np.ndarray] = {}
        self._features: dict[tuple[str, int, int, int], tuple[Features, float | None, float]] = {}
        self._done: dict[tuple[int, int, str, tuple[int, ...]], Judgement] = {}
        self._lock = threading.Lock()

    def judge(self, sentences: Sequence[CitationSpan]) -> list[Judgement]:
        """Judge sentences of the answer (from answer_sentences), embedding in two batches.

        First each sentence against the sources it cites; then, only for claims those leave
        short of SUPPORTED, against the other sources, for attribution and uncited claims.
        """
        with self._lock:
            todo = [s for s in sentences if _key(s) not in self._done]
            plans = [self._plan(s) for s in todo]
            self._embed_plans(
                [(s, {src: w for src, w in plan.items() if src.index in s.source_indices})
                 for s, plan in zip(todo, plans, strict=True) if plan]
            )  # fmt: skip
            model = [self._model_evidence(s, plan) for s, plan in zip(todo, plans, strict=True)]
            wanted = [
                (s, {src: w for src, w in plan.items() if src.index not in s.source_indices}, found)
                for s, plan, found in zip(todo, plans, model, strict=True)
                if plan and not any(e.verdict == SupportVerdict.SUPPORTED for e in found)
            ]
            self._embed_plans([(s, self._could_raise(s, plan, found)) for s, plan, found in wanted])
            needed = {_key(s) for s, _, _ in wanted}
            for sentence, plan, found in zip(todo, plans, model, strict=True):
                others = []
                if _key(sentence) in needed:
                    others = [
                        self._evidence(sentence, src, w, CitationOrigin.ATTRIBUTED)
                        for src, w in sorted(plan.items(), key=lambda item: item[0].index)
                        if src.index not in sentence.source_indices
                    ]
                self._done[_key(sentence)] = self._decide(sentence, found, others)
            return [self._done[_key(s)] for s in sentences]

    def finish(self, text: str, markers: Sequence[Marker], citations: Citations) -> Citations:
        """The citations with every span's evidence, the attributions and the uncited claims."""
        judged = self.judge(answer_sentences(text, markers))
        spans = tuple(j.span for j in judged if j.span is not None)
        uncited = tuple(j.uncited for j in judged if j.uncited is not None)
        referenced = set(citations.referenced_indices)
        attributed = sorted(
            {
                e.source_index
                for span in spans
                for e in span.evidence
                if e.origin == CitationOrigin.ATTRIBUTED
            }
            - referenced
        )
        return replace(
            citations,
            spans=spans,
            uncited_claims=uncited,
            attributed_indices=tuple(attributed),
        )

    # -- internals ----------------------------------------------------------------------------

    def _plan(self, sentence: CitationSpan) -> dict[_Source, list[Window]]:
        """The sources worth scoring for a sentence, each with its best candidate windows."""
        cited = set(sentence.source_indices)
        claim = is_claim(sentence.cited_text)
        if not cited and not claim:
            return {}
        terms = content_terms(sentence.cited_text)
        plan: dict[_Source, list[Window]] = {}
        others: list[tuple[float, _Source, list[Window]]] = []
        for source in self._sources.values():
            if source.index not in cited and not claim:
                continue
            ranked = _rank_windows(source, terms)
            if not ranked:
                continue
            best, windows = ranked[0][0], [w for _, w in ranked[:WINDOWS_PER_SOURCE]]
            if source.index in cited:
                plan[source] = windows
            elif best >= MIN_COVERAGE:
                others.append((best, source, windows))
        others.sort(key=lambda item: (-item[0], item[1].index))
        for _, source, windows in others[:MAX_OTHER_SOURCES]:
            plan[source] = windows
        return plan

    def _embed(self, texts: list[str]) -> None:
        if not texts:
            return
        try:
            vectors = self._builder.embedder.embed_documents(texts)
        except EmbeddingError:
            # Evidence must not cost the answer: without vectors the checks score with the
            # lowest cosine, which can only understate support.
            log.warning("evidence scored without embeddings: the embedder failed", exc_info=True)
            return
        for text, vector in zip(texts, vectors, strict=True):
            self._vectors[text] = np.asarray(vector, dtype=np.float32)

    def _window_vector(self, source: _Source, window: Window) -> np.ndarray | None:
        parts = [
            self._vectors.get(source.text[a:b])
            for a, b in source.sentences[window.first : window.last + 1]
        ]
        if any(part is None for part in parts):
            return None
        total = np.sum(parts, axis=0)
        norm = float(np.linalg.norm(total))
        return total / norm if norm > 0 else total

    def _evidence(
        self, sentence: CitationSpan, source: _Source, windows: list[Window], origin: CitationOrigin
    ) -> Evidence:
        calibration = self._builder.calibration
        scored: list[tuple[float, float, Window]] = []
        for window in windows:
            f, settled, _ = self._settled(sentence, source, window)
            if settled is None:
                claim_vector = self._vectors.get(sentence.cited_text)
                window_vector = self._window_vector(source, window)
                if claim_vector is not None and window_vector is not None:
                    f = replace(f, cosine=float(np.dot(claim_vector, window_vector)))
            score = support_score(f, calibration) if settled is None else settled
            if origin == CitationOrigin.ATTRIBUTED and not _attributable(f, calibration):
                score = min(score, calibration.partial - 0.01)
            scored.append((score, relevance(f, calibration), window))
        score, _, window = max(scored, key=lambda item: item[0])
        if score < calibration.partial:
            # Nothing supports the sentence: show the passage closest to it, penalties aside.
            score, _, window = max(scored, key=lambda item: item[1])
        return Evidence(
            source_index=source.index,
            quote=source.text[window.start : window.end],
            location=quote_location(source.chunk, window.start, window.end),
            support_score=round(score, 4),
            verdict=verdict_for(score, calibration),
            origin=origin,
        )

    def _settled(
        self, sentence: CitationSpan, source: _Source, window: Window
    ) -> tuple[Features, float | None, float]:
        """The checks' features, the score when they settle the verdict whatever the cosine, and
        the highest score any cosine could give.

        The score rises with the cosine, so if the lowest and the highest cosine give the same
        verdict, embedding cannot change it; the score is then the middle of that range. This is
        exact, not an approximation, and it spares most embeddings: a sentence copied from its
        source, a changed number, a source that shares no words with the sentence.
        """
        key = (sentence.cited_text, source.index, window.start, window.end)
        held = self._features.get(key)
        if held is None:
            calibration = self._builder.calibration
            quote = source.text[window.start : window.end]
            f = features(
                sentence.cited_text,
                quote,
                -1.0,
                around=source.around(window),
                context=source.context,
            )
            low = support_score(f, calibration)
            high = support_score(replace(f, cosine=1.0), calibration)
            same = verdict_for(low, calibration) == verdict_for(high, calibration)
            held = self._features[key] = (f, (low + high) / 2 if same else None, high)
        return held

    def _could_raise(
        self, sentence: CitationSpan, plan: dict[_Source, list[Window]], found: list[Evidence]
    ) -> dict[_Source, list[Window]]:
        """The windows of other sources worth embedding for attribution.

        Only those whose best possible verdict (at cosine 1) is above the best verdict already
        known without the embedder, from the cited sources or from another source's settled
        window. A sentence copied from one source is attributed to it without embedding the
        rest to look for a second source that could at most tie with it.
        """
        calibration = self._builder.calibration
        floor = max((_RANK[e.verdict] for e in found), default=0)
        ceilings: list[tuple[_Source, Window, int]] = []
        for source, windows in plan.items():
            for w in windows:
                f, settled, high = self._settled(sentence, source, w)
                if not _attributable(f, calibration):
                    continue  # never attributed, whatever its cosine: no embedding needed
                if settled is not None:
                    floor = max(floor, _RANK[verdict_for(settled, calibration)])
                else:
                    ceilings.append((source, w, _RANK[verdict_for(high, calibration)]))
        worth: dict[_Source, list[Window]] = {}
        for source, w, ceiling in ceilings:
            if ceiling > floor:
                worth.setdefault(source, []).append(w)
        return worth

    def _embed_plans(self, plans: list[tuple[CitationSpan, dict[_Source, list[Window]]]]) -> None:
        texts: set[str] = set()
        for sentence, plan in plans:
            for source, windows in plan.items():
                for w in windows:
                    if self._settled(sentence, source, w)[1] is not None:
                        continue
                    texts.add(sentence.cited_text)
                    texts.update(
                        source.text[a:b] for a, b in source.sentences[w.first : w.last + 1]
                    )
        self._embed([t for t in sorted(texts) if t not in self._vectors])

    def _model_evidence(
        self, sentence: CitationSpan, plan: dict[_Source, list[Window]]
    ) -> list[Evidence]:
        return [
            self._evidence(sentence, src, w, CitationOrigin.MODEL)
            for src, w in sorted(plan.items(), key=lambda item: item[0].index)
            if src.index in sentence.source_indices
        ]

    def _decide(
        self, sentence: CitationSpan, model: list[Evidence], others: list[Evidence]
    ) -> Judgement:
        claim = is_claim(sentence.cited_text)
        model_rank = max((_RANK[e.verdict] for e in model), default=0)
        better = [
            e
            for e in others
            if e.verdict != SupportVerdict.UNSUPPORTED and _RANK[e.verdict] > model_rank
        ]
        attributed: list[Evidence] = []
        if self._attribute and better and claim:
            top = max(_RANK[e.verdict] for e in better)
            attributed = sorted(
                (e for e in better if _RANK[e.verdict] == top),
                key=lambda e: (-e.support_score, e.source_index),
            )[:MAX_ATTRIBUTED]
        if sentence.source_indices:
            best = max(model, key=lambda e: (_RANK[e.verdict], e.support_score), default=None)
            span = replace(
                sentence,
                evidence=tuple(model) + tuple(sorted(attributed, key=lambda e: e.source_index)),
                verdict=best.verdict if best else SupportVerdict.UNSPECIFIED,
                support_score=best.support_score if best else 0.0,
            )
            return Judgement(sentence, span=span)
        if attributed:
            best = attributed[0]
            span = replace(
                sentence,
                source_indices=tuple(sorted(e.source_index for e in attributed)),
                evidence=tuple(sorted(attributed, key=lambda e: e.source_index)),
                verdict=best.verdict,
                support_score=best.support_score,
            )
            return Judgement(sentence, span=span)
        if better or not claim:
            return Judgement(sentence)  # not a claim, or supported while attribution is off
        return Judgement(sentence, uncited=replace(sentence, verdict=SupportVerdict.UNSUPPORTED))


def evidence_builder(embedder: str = "static") -> EvidenceBuilder:
    """The builder for FOOTNOTE_EVIDENCE_EMBEDDER: "static" (WordLlama, about 0.1 ms a
    sentence) or "local" (MiniLM, 13-20 ms a sentence, verdicts a little closer to the labels),
    each with the calibration fitted on its own cosines. Whatever retrieval embeds with."""
    if embedder == "static":
        from services.evidence.static import StaticEmbedder

        static = StaticEmbedder()
        static.load()  # a tenth of a second, better spent now than in the first answer
        return EvidenceBuilder(static, CALIBRATION)
    if embedder == "local":
        from services.retrieval.embeddings import LocalEmbedder

        return EvidenceBuilder(LocalEmbedder(), LOCAL_CALIBRATION)
    raise ValueError(f"unknown evidence embedder {embedder!r}: expected static or local")


@functools.lru_cache(maxsize=LAYOUT_CACHE)
def _layout(
    text: str,
) -> tuple[tuple[tuple[int, int], ...], tuple[Window, ...], tuple[frozenset[str], ...]]:
    """A chunk's sentences, candidate windows and sentence words; the same chunk comes back
    in answer after answer, and splitting it costs more than judging a sentence. Tuples, since
    every answer that cites the chunk shares them."""
    ranges = sentences_of(text)
    return (
        tuple(ranges),
        tuple(windows_of(ranges, text)),
        tuple(content_terms(text[a:b]) for a, b in ranges),
    )


def _attributable(f: Features, calibration: Calibration) -> bool:
    """The quote holds most of the sentence's weighted words, or all of one of its clauses."""
    clause_best = max(f.clause_coverage, default=0.0)
    return f.coverage >= ATTRIBUTION_COVERAGE or clause_best >= calibration.clause_high


def _key(span: CitationSpan) -> tuple[int, int, str, tuple[int, ...]]:
    return (span.start, span.end, span.cited_text, span.source_indices)


def _rank_windows(source: _Source, terms: frozenset[str]) -> list[tuple[float, Window]]:
    """Windows by the share of the sentence's words they hold; shorter windows win ties."""
    if not terms:
        return [(0.0, w) for w in source.windows[:WINDOWS_PER_SOURCE]]
    scored = []
    for w in source.windows:
        held: set[str] = set()
        for i in range(w.first, w.last + 1):
            held |= source.sentence_terms[i] & terms
        coverage = len(held) / len(terms)
        scored.append((coverage - 0.03 * (w.last - w.first), w))
    scored.sort(key=lambda item: (-item[0], item[1].start, item[1].end))
    return [(max(0.0, c), w) for c, w in scored]
