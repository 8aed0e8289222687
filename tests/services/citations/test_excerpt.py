"""Excerpts show the sentences that match the question, cut at word boundaries."""

from __future__ import annotations

import random
import re

from hypothesis import given, settings
from hypothesis import strategies as st

from services.citations import RetrievedChunk, ScoreKind, build_manifest, excerpt, make_excerpt
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


def _best_start_by_checking_every_window(flat: str, wanted: set[str], limit: int) -> int:
    # The definition, window by window: the one-pass search must agree with it.
    room = max(limit - 2 * len(excerpt.ELLIPSIS), 1)
    sentence_starts = {0, *(g.end() for g in excerpt._SENTENCE_GAP.finditer(flat))}
    tokens = [
        (m.start(), m.end(), excerpt.stem(m.group()))
        for m in excerpt._WORD.finditer(flat)
        if m.group().lower() not in excerpt._STOPWORDS
    ]

    def covered(start: int, width: int) -> int:
        return len({t for s, e, t in tokens if s >= start and e <= start + width and t in wanted})

    best_key, best_start = (0, False, 0), 0
    for word in re.finditer(r"\S+", flat):
        key = (covered(word.start(), room), word.start() in sentence_starts, -word.start())
        if key > best_key:
            best_key, best_start = key, word.start()
    if best_key[0] == 0 or covered(0, limit - len(excerpt.ELLIPSIS)) >= best_key[0]:
        return 0
    return best_start


def test_the_one_pass_window_search_finds_the_window_every_check_finds() -> None:
    rng = random.Random(7)
    words = re.findall(
        r"\S+",
        "the warranty shall terminate. Licence 2.1. fees apply; The Party may not assign "
        "rights. warranties terminated licence fee Apply parties! assign (see Section 3)",
    )
    moved = 0
    for _ in range(400):
        flat = " ".join(rng.choice(words) for _ in range(rng.randint(5, 120)))
        wanted = excerpt.terms(" ".join(rng.choice(words) for _ in range(rng.randint(1, 4))))
        limit = rng.randint(10, 300)
        expected = _best_start_by_checking_every_window(flat, wanted, limit)
        assert excerpt._best_window_start(flat, wanted, limit) == expected, (flat, wanted, limit)
        moved += expected > 0
    assert moved > 50  # the comparison covered windows away from the start, not only 0
