"""English Snowball stems that many threads can ask for at once.

A snowballstemmer object keeps its working state in itself, so two threads sharing one get
wrong stems or an IndexError; extractive answers are composed in worker threads, so each
thread gets its own stemmer.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import snowballstemmer

_local = threading.local()


def _stemmer() -> snowballstemmer.stemmer:
    stemmer = getattr(_local, "stemmer", None)
    if stemmer is None:
        stemmer = _local.stemmer = snowballstemmer.stemmer("english")
    return stemmer


def stem_word(word: str) -> str:
    return _stemmer().stemWord(word)


def stem_words(words: Sequence[str]) -> list[str]:
    return _stemmer().stemWords(words)
