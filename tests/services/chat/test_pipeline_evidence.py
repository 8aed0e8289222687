"""An answer's evidence is prepared after its first delta, and its failures still surface."""

from __future__ import annotations

import asyncio
import gc
import threading
from collections.abc import AsyncIterator

import pytest

from services.assistants.domain import create_assistant
from services.chat.pipeline import AnswerDelta, AnswerSpan, ChatEngine, ChatInput, RetrievalStats
from services.citations import RetrievedChunk, ScoreKind
from services.conversations.presenter import CitationPresenter
from services.conversations.store import Turn
from services.errors import Unavailable
from services.evidence.builder import EvidenceBuilder
from services.llm.base import Finished, GenerationEvent, GenerationRequest, TextPiece
from services.retrieval.embeddings import LocalEmbedder

PARIS = "Paris is the capital of France. It sits on the Seine."
CHUNK = RetrievedChunk(
    chunk_id="c1",
    document_id="d1",
    document_name="paris.md",
    content_type="text/markdown",
    chunk_index=0,
    text=PARIS,
    score=0.9,
    score_kind=ScoreKind.FUSED,
)


class Retrieved(ChatEngine):
    """The pipeline with one fixed source instead of a search (the search is tested apart)."""

    async def retrieve(self, tenant_id, assistant_id, question, settings, early=None):
        if early is not None:
            early.cancel()
        return [CHUNK], RetrievalStats(chunks_returned=1), None


class Model:
    """A scripted model: its pieces, then Finished or a failure; it logs what it does."""

    name = "scripted"

    def __init__(self, log: list[str], pieces: list[str], fail: bool = False) -> None:
        self.log, self.pieces, self.fail = log, pieces, fail

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationEvent]:
        self.log.append("model asked")
        for piece in self.pieces:
            yield TextPiece(piece)
            await asyncio.sleep(0)
        if self.fail:
            raise Unavailable("the language model failed while answering")
        yield Finished()


class Builder:
    """The engine's own evidence builder, logging when an answer's evidence is built."""

    def __init__(self, log: list[str], fail: bool = False) -> None:
        self.log, self.fail = log, fail
        self.called = threading.Event()
        self.inner: EvidenceBuilder | None = None

    def for_answer(self, sources, chunks, *, attribute=True):
        self.log.append("evidence built")
        self.called.set()
        if self.fail:
            raise RuntimeError("evidence failed")
        assert self.inner is not None
        return self.inner.for_answer(sources, chunks, attribute=attribute)


@pytest.fixture
def assistant(db, tenant) -> str:
    return db.transact(lambda s: create_assistant(s, tenant, "evidence order", {})).id


def engine(db, model: Model, builder: Builder) -> ChatEngine:
    made = Retrieved(
        db,
        embedder=LocalEmbedder(),
        generator=model,
        presenter=CitationPresenter(db, None),  # type: ignore[arg-type]
    )
    builder.inner, made.evidence = made.evidence, builder  # type: ignore[assignment]
    return made


def ask(assistant: str) -> ChatInput:
    return ChatInput(assistant, "", [Turn("user", "What is the capital of France?")])


async def test_the_evidence_is_built_after_the_first_delta_and_still_judges(
    db, tenant, assistant
) -> None:
    log: list[str] = []
    model = Model(log, ["Paris is ", "the capital ", "of France [1]. ", "It sits on the Seine."])
    events = engine(db, model, Builder(log)).answer(tenant, ask(assistant))
    spans = []
    async for event in events:
        if isinstance(event, AnswerDelta) and "first delta" not in log:
            log.append("first delta")
        if isinstance(event, AnswerSpan):
            spans.append(event.span)
            break  # the stream is closed here: nothing more is needed
    await events.aclose()
    assert log == ["model asked", "first delta", "evidence built"]
    # The sentence cited [1] was judged with the evidence built after the first delta.
    assert spans and spans[0].evidence


async def test_a_failure_to_build_the_evidence_fails_the_answer(db, tenant, assistant) -> None:
    log: list[str] = []
    model = Model(log, ["Paris is the capital of France [1]. ", "More."])
    events = engine(db, model, Builder(log, fail=True)).answer(tenant, ask(assistant))
    with pytest.raises(RuntimeError, match="evidence failed"):
        async for _ in events:
            pass
    assert log == ["model asked", "evidence built"]


async def test_a_model_that_fails_first_is_what_the_answer_reports(db, tenant, assistant) -> None:
    loop = asyncio.get_running_loop()
    reported: list[dict] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _, context: reported.append(context))
    try:
        log: list[str] = []
        model = Model(log, ["Paris is "], fail=True)
        builder = Builder(log, fail=True)
        events = engine(db, model, builder).answer(tenant, ask(assistant))
        with pytest.raises(Unavailable):
            async for _ in events:
                pass
        # The evidence started after the first delta failed too; nobody awaited it, and its
        # failure is not reported as lost once it has been collected.
        assert await asyncio.to_thread(builder.called.wait, 30)
        for _ in range(5):
            await asyncio.sleep(0)  # the thread's outcome reaches its task
        del events
        gc.collect()
        await asyncio.sleep(0)
    finally:
        loop.set_exception_handler(previous)
    assert log == ["model asked", "evidence built"]
    assert reported == []


async def test_a_client_that_leaves_during_the_evidence_build_is_let_go_at_once(
    db, tenant, assistant
) -> None:
    log: list[str] = []
    release = threading.Event()

    class Slow(Builder):
        def for_answer(self, sources, chunks, *, attribute=True):
            release.wait(30)  # still building when the client leaves
            return super().for_answer(sources, chunks, attribute=attribute)

    model = Model(log, ["Paris is ", "the capital ", "of France [1]. "])
    builder = Slow(log)
    events = engine(db, model, builder).answer(tenant, ask(assistant))
    first = await anext(events)
    assert isinstance(first, AnswerDelta)
    await anext(events)  # the evidence build has started by now
    # Closing does not wait for the build; the model's stream is closed with the answer.
    await asyncio.wait_for(events.aclose(), 10)
    assert not builder.called.is_set()
    release.set()
    assert await asyncio.to_thread(builder.called.wait, 30)
    assert log == ["model asked", "evidence built"]
