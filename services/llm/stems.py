"""English Snowball stems that many threads can ask for at once.

A stemmer object keeps its working state in itself, so two threads sharing one get wrong stems
or an IndexError; extractive answers are composed in worker threads, so each thread gets its
own stemmer. snowballstemmer hands out PyStemmer's compiled stemmer when it is installed (a
dependency: 15x as fast, the same stems), its own pure-Python one otherwise. A word's stem
depends on the word alone and the same words come back in every answer, so stems are kept:
stemming them again was most of the CPU of composing an extractive answer.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Sequence

import snowballstemmer

_local = threading.local()


def _stemmer() -> snowballstemmer.stemmer:
    stemmer = getattr(_local, "stemmer", None)
    if stemmer is None:
        stemmer = _local.stemmer = snowballstemmer.stemmer("english")
    return stemmer


# Distinct words whose stems are kept: a few megabytes at most.
STEM_CACHE_SIZE = 1 << 16


@functools.lru_cache(maxsize=STEM_CACHE_SIZE)
def stem_word(word: str) -> str:
    return _stemmer().stemWord(word)


def stem_words(words: Sequence[str]) -> list[str]:
    return [stem_word(w) for w in words]
