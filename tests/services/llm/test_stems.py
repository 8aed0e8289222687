"""Stems stay right when many threads stem at once (answers are composed in worker threads)."""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor

from services.llm.stems import stem_words

WORDS = [
    "warranties",
    "licensing",
    "conveying",
    "propagation",
    "distributions",
    "modifications",
] * 400


def test_threads_stemming_at_once_get_the_same_stems() -> None:
    expected = stem_words(WORDS)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible
    try:
        with ThreadPoolExecutor(4) as pool:
            results = list(pool.map(lambda _: stem_words(WORDS), range(16)))
    finally:
        sys.setswitchinterval(interval)
    assert all(result == expected for result in results)
