"""Finds the sentences of a streamed answer that are complete, so their evidence can be sent."""

from __future__ import annotations

import re
from collections.abc import Sequence

from services.citations import CitationSpan, Marker, answer_sentences

_TERMINATOR = re.compile(r"[.!?…。！？\n]")


class SentenceTracker:
    """Reports each sentence of a growing answer once, when the sentence after it has begun.

    A sentence is complete once a later sentence holds words: by then the markers that follow
    it ("Foo. [1]") and the character after its full stop have arrived, so the final text
    splits it the same way.
    """

    def __init__(self) -> None:
        self._reported_end = 0

    def complete(self, text: str, markers: Sequence[Marker]) -> list[CitationSpan]:
        if not _TERMINATOR.search(text, self._reported_end):
            return []  # the sentence under way has not ended yet
        sentences = answer_sentences(text, markers)
        fresh = [s for s in sentences[:-1] if s.start >= self._reported_end]
        if fresh:
            self._reported_end = fresh[-1].end
        return fresh
