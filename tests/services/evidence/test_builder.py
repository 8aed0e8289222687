"""Evidence for whole answers: verdicts, attribution, uncited claims, streaming, storage."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.citations import (
    CitationOrigin,
    MarkerBuffer,
    RetrievedChunk,
    ScoreKind,
    SourceLocation,
    SupportVerdict,
    answer_sentences,
    build_manifest,
    extract,
    finalize_extraction,
)
from services.citations.types import CitationStyle
from services.conversations.snapshot import citations_from_json, citations_to_json
from services.evidence.builder import EvidenceBuilder
from services.evidence.scorer import LOCAL_CALIBRATION, words
from services.evidence.static import StaticEmbedder
from services.evidence.streaming import SentenceTracker
from services.retrieval.embeddings import EmbeddingError

DOCS = {
    "paris.md": "# Paris\n\nParis is the capital of France and sits on the Seine. "
    "The city had 2,100,000 inhabitants in 2020.\n",
    "tokyo.md": "# Tokyo\n\nTokyo is the capital of Japan and its largest city.\n",
    "berlin.md": "# Berlin\n\nBerlin is the capital of Germany and sits on the Spree.\n",
}


class WordHashEmbedder:
    """A deterministic stand-in: a bag of hashed words, so shared words mean a high cosine."""

    def __init__(self) -> None:
        self.calls: list[int] = []

    def embed_documents(self, texts: Sequence[str]) -> list[list[float]]:
        self.calls.append(len(texts))
        out = []
        for text in texts:
            v = [0.0] * 64
            for w in words(text):
                v[hashlib.sha256(w.encode()).digest()[0] % 64] += 1.0
            norm = math.sqrt(sum(x * x for x in v)) or 1.0
            out.append([x / norm for x in v])
        return out


def manifest():
    chunks = [
        RetrievedChunk(
            chunk_id=name,
            document_id=name,
            document_name=name,
            content_type="text/markdown",
            chunk_index=0,
            text=text,
            score=0.9 - 0.1 * i,
            score_kind=ScoreKind.FUSED,
            location=SourceLocation(0, len(text), 1, 3, 0, 0, name, 0, len(text.encode())),
        )
        for i, (name, text) in enumerate(DOCS.items())
    ]
    return build_manifest(chunks)


def number(m, name: str) -> int:
    return next(s.index for s in m.sources if s.document_name == name)


def answer_for(m) -> str:
    p, b, t = number(m, "paris.md"), number(m, "berlin.md"), number(m, "tokyo.md")
    return (
        f"Hello! Paris is the capital of France [{p}]. Berlin sits on the Spree [{p}]. "
        f"Tokyo is the capital of Japan and its largest city. "
        f"The moon is made of green cheese [{t}]. The Eiffel Tower was moved to Lyon. "
        f"Paris had 3,100,000 inhabitants in 2020 [{p}]. Do you want more? [{b}]"
    )


def judged(attribute: bool = True):
    m = manifest()
    text = answer_for(m)
    ex = extract(text, len(m.sources))
    _, base = finalize_extraction(ex, m.sources)
    evidence = EvidenceBuilder(WordHashEmbedder()).for_answer(
        m.sources, m.chunks, attribute=attribute
    )
    return m, ex, evidence, evidence.finish(ex.text, ex.markers, base)


def test_verdicts_attribution_and_uncited_claims() -> None:
    m, _, _, c = judged()
    p, b, t = number(m, "paris.md"), number(m, "berlin.md"), number(m, "tokyo.md")
    spans = {s.cited_text: s for s in c.spans}
    right = spans["Paris is the capital of France."]
    assert right.verdict == SupportVerdict.SUPPORTED
    assert [(e.source_index, e.origin) for e in right.evidence] == [(p, CitationOrigin.MODEL)]
    wrong = spans["Berlin sits on the Spree."]
    assert wrong.verdict == SupportVerdict.UNSUPPORTED and wrong.source_indices == (p,)
    assert [(e.source_index, e.origin) for e in wrong.evidence] == [
        (p, CitationOrigin.MODEL),
        (b, CitationOrigin.ATTRIBUTED),
    ]
    unmarked = spans["Tokyo is the capital of Japan and its largest city."]
    assert unmarked.source_indices == (t,)
    assert unmarked.evidence[0].origin == CitationOrigin.ATTRIBUTED
    assert spans["The moon is made of green cheese."].verdict == SupportVerdict.UNSUPPORTED
    assert spans["Paris had 3,100,000 inhabitants in 2020."].verdict == SupportVerdict.UNSUPPORTED
    assert [u.cited_text for u in c.uncited_claims] == ["The Eiffel Tower was moved to Lyon."]
    assert c.referenced_indices == tuple(sorted({p, t, b}))
    assert c.attributed_indices == ()  # berlin is cited by the last marker already
    for span in c.spans:
        for e in span.evidence:
            text = DOCS[m.sources[e.source_index - 1].document_name]
            assert text[e.location.start_offset : e.location.end_offset] == e.quote


def test_attribution_off_links_only_what_the_markers_cite() -> None:
    _, _, _, c = judged(attribute=False)
    assert all(e.origin == CitationOrigin.MODEL for s in c.spans for e in s.evidence)
    assert "Tokyo is the capital of Japan and its largest city." not in {
        s.cited_text for s in c.spans
    }
    assert [u.cited_text for u in c.uncited_claims] == ["The Eiffel Tower was moved to Lyon."]


@pytest.mark.parametrize("step", [1, 3, 7, 40])
def test_streamed_sentences_equal_the_final_spans(step: int) -> None:
    _, ex, evidence, final = judged()
    tracker = SentenceTracker()
    streamed = []
    text = ex.text
    for end in range(step, len(text) + step, step):
        prefix = text[: min(end, len(text))]
        markers = [mk for mk in ex.markers if mk.end <= len(prefix)]
        for j in evidence.judge(tracker.complete(prefix, markers)):
            if j.span is not None:
                streamed.append(j.span)
    # Every sentence but the last completes while streaming (the last, "Do you want more?
    # [n]", ends the answer), and each streamed span equals its final one.
    assert streamed == list(final.spans[:-1])


def test_sentences_judged_while_streaming_are_not_embedded_again() -> None:
    m = manifest()
    ex = extract(answer_for(m), len(m.sources))
    _, base = finalize_extraction(ex, m.sources)
    embedder = WordHashEmbedder()
    evidence = EvidenceBuilder(embedder).for_answer(m.sources, m.chunks)
    evidence.judge(answer_sentences(ex.text, ex.markers))
    calls = len(embedder.calls)
    evidence.finish(ex.text, ex.markers, base)
    assert len(embedder.calls) == calls


def test_the_snapshot_keeps_evidence_and_reads_old_snapshots() -> None:
    _, _, _, c = judged()
    raw = citations_to_json(c, CitationStyle.INLINE)
    back, style = citations_from_json(raw)
    assert back == c and style == CitationStyle.INLINE
    old = dict(raw)
    del old["uncited_claims"], old["attributed_indices"]
    old["spans"] = [
        {k: v for k, v in s.items() if k not in ("start_byte", "end_byte", "evidence", "verdict")}
        for s in raw["spans"]
    ]
    for source in old["sources"]:
        source["location"] = {
            k: v for k, v in source["location"].items() if k not in ("start_byte", "end_byte")
        }
    legacy, _ = citations_from_json(old)
    assert legacy.uncited_claims == () and legacy.attributed_indices == ()
    assert all(s.evidence == () and s.verdict == SupportVerdict.UNSPECIFIED for s in legacy.spans)
    assert [s.cited_text for s in legacy.spans] == [s.cited_text for s in c.spans]


class BrokenEmbedder:
    def embed_documents(self, texts: Sequence[str]) -> list[list[float]]:
        raise EmbeddingError("the model failed")


def test_a_failing_embedder_costs_the_scores_not_the_answer() -> None:
    m = manifest()
    ex = extract(answer_for(m), len(m.sources))
    _, base = finalize_extraction(ex, m.sources)
    c = (
        EvidenceBuilder(BrokenEmbedder())
        .for_answer(m.sources, m.chunks)
        .finish(ex.text, ex.markers, base)
    )
    spans = {s.cited_text: s for s in c.spans}
    # Settled without the cosine: a copied sentence and a changed number.
    assert spans["Paris is the capital of France."].verdict == SupportVerdict.SUPPORTED
    assert spans["Paris had 3,100,000 inhabitants in 2020."].verdict == SupportVerdict.UNSUPPORTED
    assert all(s.evidence for s in c.spans)


PIECES = st.sampled_from(
    [
        "Revenue grew", " by 3.5%", ".", " ", "[1]", "[2]", " [1][2]", "\n", "\n\n", "- ",
        "e.g. ", "Dr. Smith", " said so", "!", "?", "…", "。", "東京", "é", "🎉", "`a[1]`",
        "```\ncode [1]\n```\n", "3.", "14", "Mr", "foo", " bar", "[", "]", "1", "(x)",
    ]
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(st.lists(PIECES, max_size=40), st.lists(st.integers(1, 12), min_size=1, max_size=20))
def test_a_sentence_reported_while_streaming_is_final(pieces, steps) -> None:
    text = "".join(pieces)
    buffer = MarkerBuffer(2)
    tracker = SentenceTracker()
    reported = []
    i = k = 0
    while i < len(text):
        step = steps[k % len(steps)]
        buffer.feed(text[i : i + step])
        reported.extend(tracker.complete(buffer.output, buffer.markers))
        i, k = i + step, k + 1
    buffer.finish()
    result = buffer.result()
    final = answer_sentences(result.text, result.markers)
    assert all(s in final for s in reported)
    assert len(reported) == len({(s.start, s.end) for s in reported})


def _pair(texts: dict[str, str]):
    chunks = [
        RetrievedChunk(
            chunk_id=name,
            document_id=name,
            document_name=name,
            content_type="text/markdown",
            chunk_index=0,
            text=text,
            score=0.9,
            score_kind=ScoreKind.FUSED,
            location=SourceLocation(0, len(text), 1, 1, 0, 0, name, 0, len(text.encode())),
        )
        for name, text in texts.items()
    ]
    return build_manifest(chunks)


def test_attribution_embeds_nothing_a_copied_source_already_settles() -> None:
    m = _pair(
        {
            "a.md": "Paris is the capital of France and sits on the Seine.",
            "b.md": "France has Paris as its capital city, on the river Seine.",
        }
    )
    text = "Paris is the capital of France and sits on the Seine."
    ex = extract(text, len(m.sources))
    _, base = finalize_extraction(ex, m.sources)
    embedder = WordHashEmbedder()
    # The calibration that leans on the cosine, so that b's paraphrase needs an embedding.
    builder = EvidenceBuilder(embedder, LOCAL_CALIBRATION)
    c = builder.for_answer(m.sources, m.chunks).finish(ex.text, ex.markers, base)
    a = next(s.index for s in m.sources if s.document_name == "a.md")
    assert [s.source_indices for s in c.spans] == [(a,)]
    assert c.spans[0].verdict == SupportVerdict.SUPPORTED
    # b could at most tie with a, so its windows were not embedded.
    assert embedder.calls == []


def test_attribution_embeds_when_no_source_settles_the_verdict() -> None:
    m = _pair(
        {
            "a.md": "France has Paris as its capital city, on the river Seine.",
            "b.md": "Tokyo is the capital of Japan.",
        }
    )
    text = "Paris is the capital of France and sits on the Seine."
    ex = extract(text, len(m.sources))
    _, base = finalize_extraction(ex, m.sources)
    embedder = WordHashEmbedder()
    builder = EvidenceBuilder(embedder, LOCAL_CALIBRATION)
    builder.for_answer(m.sources, m.chunks).finish(ex.text, ex.markers, base)
    assert embedder.calls and embedder.calls[0] >= 2  # the sentence and a's window


def test_a_sentence_that_only_shares_a_passages_subject_is_not_attributed_to_it() -> None:
    m = _pair(
        {
            "adduser.md": "The adduser package includes the adduser and deluser commands for "
            "creating and removing users and groups.",
            "apt.md": "apt is the main command-line package manager for Debian.",
        }
    )
    made_up = "The adduser package also ships a graphical user manager."
    partial = (
        "The adduser package includes the adduser and deluser commands, and it was first "
        "written in 1997 by Guy Maor."
    )
    for text, attributed in ((made_up, False), (partial, True)):
        ex = extract(text, len(m.sources))
        _, base = finalize_extraction(ex, m.sources)
        c = EvidenceBuilder(StaticEmbedder()).for_answer(m.sources, m.chunks)
        done = c.finish(ex.text, ex.markers, base)
        assert bool(done.spans) is attributed, text
        assert bool(done.uncited_claims) is not attributed, text
