"""Early retrieval: what is started before the assistant is loaded, and how it is let go."""

from __future__ import annotations

import asyncio
import gc
import threading
from collections.abc import Awaitable, Callable

import pytest

from services.assistants.domain import AssistantSettings, create_assistant
from services.chat import early as early_retrieval
from services.chat.early import EarlyStarter, SearchPlan
from services.chat.pipeline import ChatEngine, ChatInput
from services.conversations.presenter import CitationPresenter
from services.conversations.store import Turn
from services.llm.base import Finished, GenerationRequest, TextPiece

QUESTION = "What does the license say about warranties?"


async def test_a_failed_embedding_of_a_dropped_early_search_is_not_reported_as_lost() -> None:
    loop = asyncio.get_running_loop()
    reported: list[dict] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _, context: reported.append(context))
    try:
        embedding = loop.create_future()

        async def embed(_: str) -> list[float]:
            return await embedding

        async def search(plan: SearchPlan, vector) -> list[str]:
            await vector
            return ["chunk"]

        starter = EarlyStarter()
        starter.remember("t", "a", AssistantSettings(enable_retrieval_gate=False, top_k=8))
        early = starter.start("t", "a", QUESTION, embed, search)
        assert early.plan == SearchPlan(8, early.plan.score_threshold)
        # The loaded settings ask for another search: the early one is dropped, and the search
        # run again on the loaded settings meets the embedding's failure.
        assert early.searched_with(SearchPlan(4, early.plan.score_threshold)) is None
        embedding.set_exception(RuntimeError("embedder down"))
        with pytest.raises(RuntimeError):
            await early.vector
        await asyncio.sleep(0.01)
        del early
        gc.collect()
        await asyncio.sleep(0)
    finally:
        loop.set_exception_handler(previous)
    assert reported == []


async def test_the_early_search_is_used_only_for_the_plan_it_ran_on() -> None:
    async def embed(_: str) -> list[float]:
        return [1.0]

    async def search(plan: SearchPlan, vector) -> list[float]:
        return [*(await vector), plan.top_k]

    starter = EarlyStarter()
    first = starter.start("t", "a", QUESTION, embed, search)
    assert first.search is None  # nothing known about the assistant yet: only the vector
    assert await first.vector == [1.0]
    starter.remember("t", "a", AssistantSettings(enable_retrieval_gate=False, top_k=5))
    second = starter.start("t", "a", QUESTION, embed, search)
    started = second.searched_with(second.plan)
    assert started is not None and await started == [1.0, 5]


class Held:
    """An embedder that holds each run until released, logging when it is done."""

    name = "held"
    dim = 384

    def __init__(self, log: list[str]) -> None:
        self.log = log
        self.release = threading.Event()

    def embed_documents(self, texts):
        assert self.release.wait(10)
        self.log.append("embedded")
        return [[1.0] + [0.0] * 383 for _ in texts]

    def embed_query(self, text):
        return self.embed_documents([text])[0]

    def embed_queries(self, texts):
        return self.embed_documents(texts)


class Reads:
    """The database, logging each time an answer loads its assistant."""

    def __init__(self, db, log: list[str]) -> None:
        self.db, self.log = db, log

    def __getattr__(self, name):
        return getattr(self.db, name)

    async def run_read(self, fn):
        if fn.__qualname__ == "ChatEngine.answer.<locals>.read":
            self.log.append("assistant read")
        return await self.db.run_read(fn)

    async def run_autocommit(self, fn):
        if fn.__qualname__.startswith("ChatEngine.answer.<locals>.load"):
            self.log.append("assistant read")
        return await self.db.run_autocommit(fn)


class Silent:
    name = "silent"

    async def generate(self, request: GenerationRequest):
        yield TextPiece("Nothing to go on.")
        yield Finished()


def order_engine(
    db, tenant, monkeypatch, wait: float
) -> tuple[list[str], Held, Callable[[str], Awaitable[None]]]:
    """An engine whose model is held and whose read waits for it at most `wait` seconds: its
    log, its model, and a function that runs one answer through it."""
    monkeypatch.setattr(early_retrieval, "READ_WAIT_SECONDS", wait)
    assistant = db.transact(lambda s: create_assistant(s, tenant, "order", {})).id
    log: list[str] = []
    embedder = Held(log)
    engine = ChatEngine(Reads(db, log), embedder, Silent(), CitationPresenter(db, None))

    async def answer(question: str) -> None:
        turns = [Turn("user", question)]
        async for _ in engine.answer(tenant, ChatInput(assistant, "", turns)):
            pass

    return log, embedder, answer


async def first_entry(log: list[str]) -> None:
    for _ in range(200):
        if log:
            return
        await asyncio.sleep(0.01)


async def test_with_a_search_started_early_the_assistant_is_read_once_the_question_is_embedded(
    db, tenant, monkeypatch
) -> None:
    # The read would otherwise take CPU from the model run, the first delta's critical path.
    log, embedder, answer = order_engine(db, tenant, monkeypatch, wait=10.0)

    # The first answer knows nothing of the assistant: it is read at once, the model held.
    first = asyncio.ensure_future(answer("What does the first policy say about leave?"))
    await first_entry(log)
    assert log == ["assistant read"]
    embedder.release.set()
    await first
    assert log == ["assistant read", "embedded"]

    # The second starts its search on the settings it remembers: the read waits for the model.
    log.clear()
    embedder.release.clear()
    second = asyncio.ensure_future(answer("How many days of leave does the second policy give?"))
    await asyncio.sleep(0.2)
    assert log == []
    embedder.release.set()
    await second
    assert log == ["embedded", "assistant read"]


async def test_the_assistant_read_waits_for_a_slow_model_only_so_long(
    db, tenant, monkeypatch
) -> None:
    # A remote embedding service that hangs must not hold up what needs no vector.
    log, embedder, answer = order_engine(db, tenant, monkeypatch, wait=0.1)
    embedder.release.set()
    await answer("What does the first policy say about leave?")
    log.clear()
    embedder.release.clear()
    held = asyncio.ensure_future(answer("How many days of leave does the second policy give?"))
    await first_entry(log)
    assert log == ["assistant read"]  # while the model still holds the question
    embedder.release.set()
    await held
    assert log == ["assistant read", "embedded"]
