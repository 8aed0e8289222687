"""Closing an answer's stream closes the generator, and with it the upstream, at once."""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator

from services.assistants.domain import create_assistant
from services.chat.pipeline import AnswerDelta, ChatEngine, ChatInput
from services.conversations.presenter import CitationPresenter
from services.conversations.store import Turn
from services.llm.base import GenerationEvent, GenerationRequest, TextPiece


class EndlessGenerator:
    """Streams forever and records when it is closed, as an upstream connection would."""

    def __init__(self) -> None:
        self.closed = False

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationEvent]:
        try:
            while True:
                yield TextPiece("more ")
        finally:
            self.closed = True


async def test_closing_the_answer_closes_the_generator_before_any_gc(db, tenant) -> None:
    assistant = db.transact(lambda s: create_assistant(s, tenant, "closing", {"enable_rag": False}))
    generator = EndlessGenerator()
    engine = ChatEngine(
        db, embedder=None, generator=generator, presenter=CitationPresenter(db, None)
    )  # type: ignore[arg-type]
    events = engine.answer(tenant, ChatInput(assistant.id, "", [Turn("user", "Hello there")]))
    first = await anext(events)
    assert isinstance(first, AnswerDelta)
    gc.disable()  # the generator must be closed by the pipeline itself, not by a collection
    try:
        await events.aclose()
        assert generator.closed
    finally:
        gc.enable()
