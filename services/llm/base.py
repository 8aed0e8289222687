"""What every generator takes and yields."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from services.citations import CitationSource


class FinishReason(StrEnum):
    STOP = "STOP"
    LENGTH = "LENGTH"
    CONTENT_FILTER = "CONTENT_FILTER"


class Retrieval(StrEnum):
    """Whether retrieval ran for the request, and if not, why."""

    RAN = "RAN"
    GATED = "GATED"  # the message needs no documents, as with a greeting
    DISABLED = "DISABLED"


@dataclass(frozen=True)
class PromptMessage:
    role: str  # "system", "user" or "assistant", as in the OpenAI chat API
    content: str


@dataclass(frozen=True)
class GenerationRequest:
    messages: Sequence[PromptMessage]
    # The numbered sources behind the prompt; a generator that composes its answer from
    # sources (the extractive one) reads them here, an LLM reads them in the prompt.
    sources: Sequence[CitationSource] = ()
    # The full text of each source, aligned with sources (a source carries only an excerpt).
    source_texts: Sequence[str] = ()
    question: str = ""
    # The question's vector from retrieval (same embedder), when it was embedded: a generator
    # that ranks by meaning (the extractive one) need not embed the question again.
    question_vector: Sequence[float] | None = None
    retrieval: Retrieval = Retrieval.RAN
    model: str = ""
    temperature: float = 0.0
    max_output_tokens: int = 512
    citations: bool = True


@dataclass(frozen=True)
class TextPiece:
    text: str


@dataclass(frozen=True)
class Finished:
    reason: FinishReason = FinishReason.STOP
    prompt_tokens: int = 0
    completion_tokens: int = 0


GenerationEvent = TextPiece | Finished


class Generator(Protocol):
    name: str

    def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationEvent]:
        """Yields text pieces, then exactly one Finished.

        Raises services.errors.Unavailable (or a subclass) when the upstream fails or refuses,
        so the caller never shows a made-up answer. Closing the iterator early (the client
        cancelled) must close the upstream request at once.
        """
        ...


def estimate_tokens(text: str) -> int:
    """A token count for upstreams that report none: about four characters a token."""
    return (len(text) + 3) // 4
