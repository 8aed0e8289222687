"""Excerpts show the sentences that match the question, cut at word boundaries."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from services.citations import RetrievedChunk, ScoreKind, build_manifest, make_excerpt
from services.citations.excerpt import ELLIPSIS, stem

TERMINATION = (
    "8. Termination. You may not propagate or modify a covered work except as expressly "
    "provided under this License. Any attempt otherwise to propagate or modify it is void, "
    "and will automatically terminate your rights under this License. However, if you cease "
    "all violation of this License, then your license is reinstated provisionally. The "
    "copyright holder has 60 days after the cessation to notify you of the violation. "
    "Disclaimer of warranties: the program is provided as is."
)


def test_the_excerpt_shows_the_sentence_that_matches_the_question() -> None:
    excerpt = make_excerpt(TERMINATION, 120, "How many days after the cessation can they notify?")
    assert excerpt.startswith(ELLIPSIS)
    assert "60 days after the cessation" in excerpt
    assert len(excerpt) <= 120
    # Without a question it is the start of the chunk, as before.
    assert make_excerpt(TERMINATION, 120).startswith("8. Termination.")


def test_word_forms_meet() -> None:
    assert stem("warranties") == stem("warranty")
    assert stem("terminated") == stem("terminate") == stem("terminates")
    excerpt = make_excerpt(TERMINATION, 80, "What warranty is given?")
    assert "warranties" in excerpt


def test_a_question_that_matches_the_start_keeps_the_start() -> None:
    assert make_excerpt(TERMINATION, 100, "termination").startswith("8. Termination.")
    assert make_excerpt(TERMINATION, 100, "zebra giraffe") == make_excerpt(TERMINATION, 100)


def test_the_manifest_uses_the_question_for_excerpts() -> None:
    hit = RetrievedChunk(
        chunk_id="c",
        document_id="d",
        document_name="gpl.txt",
        content_type="text/plain",
        chunk_index=0,
        text=TERMINATION,
        score=0.5,
        score_kind=ScoreKind.FUSED,
    )
    [source] = build_manifest([hit], excerpt_chars=120, query="notify cessation days").sources
    assert "60 days" in source.excerpt


@settings(max_examples=300)
@given(st.text(max_size=400), st.text(max_size=60), st.integers(min_value=0, max_value=300))
def test_excerpts_stay_within_the_limit_and_quote_the_text(text, query, limit) -> None:
    excerpt = make_excerpt(text, limit, query)
    assert len(excerpt) <= limit
    flat = " ".join(text.split())
    core = excerpt.removeprefix(ELLIPSIS).removesuffix(ELLIPSIS)
    assert core in flat
