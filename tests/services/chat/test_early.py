"""Early retrieval: what is started before the assistant is loaded, and how it is let go."""

from __future__ import annotations

import asyncio
import gc
import threading
from collections.abc import Awaitable, Callable

import pytest

from services.assistants.domain import (
    AssistantSettings,
    VersionedSettings,
    create_assistant,
    update_assistant,
)
from services.chat import early as early_retrieval
from services.chat.early import EarlyStarter, SearchPlan
from services.chat.pipeline import ChatEngine, ChatInput
from services.conversations.presenter import CitationPresenter
from services.conversations.store import Turn
from services.llm.base import Finished, GenerationRequest, TextPiece
from services.retrieval.search import Found

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

        async def search(plan: SearchPlan, vector) -> Found:
            await vector
            return Found([], 1)

        starter = EarlyStarter()
        starter.remember("t", "a", versioned(top_k=8))
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

    async def search(plan: SearchPlan, vector) -> Found:
        return Found([], int((await vector)[0]) + plan.top_k)

    starter = EarlyStarter()
    first = starter.start("t", "a", QUESTION, embed, search)
    assert first.search is None  # nothing known about the assistant yet: only the vector
    assert await first.vector == [1.0]
    starter.remember("t", "a", versioned(top_k=5))
    second = starter.start("t", "a", QUESTION, embed, search)
    started = second.searched_with(second.plan)
    assert started is not None and (await started).assistant_version == 6


def versioned(version: int = 1, **settings) -> VersionedSettings:
    return VersionedSettings(AssistantSettings(enable_retrieval_gate=False, **settings), version)


async def test_remembered_settings_are_used_only_at_the_version_the_search_saw() -> None:
    async def embed(_: str) -> list[float]:
        return [1.0]

    seen: list[Found | Exception] = []

    async def search(plan: SearchPlan, vector) -> Found:
        await vector
        outcome = seen.pop()
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    starter = EarlyStarter()
    known = versioned(7, top_k=5)
    starter.remember("t", "a", known)
    cases = [
        (Found([], 7), known.settings),  # the row as it was read: no read needed
        (Found([], 8), None),  # changed since
        (Found([], None), None),  # gone
        (RuntimeError("database down"), None),  # the read that follows meets it too
    ]
    for outcome, expected in cases:
        seen.append(outcome)
        early = starter.start("t", "a", QUESTION, embed, search)
        await early.embedded()
        assert await early.unchanged_settings() == expected
        early.cancel()


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
) -> tuple[list[str], Held, Callable[[str], Awaitable[None]], str]:
    """An engine whose model is held and whose read waits for it at most `wait` seconds: its
    log, its model, a function that runs one answer through it, and its assistant's id."""
    monkeypatch.setattr(early_retrieval, "READ_WAIT_SECONDS", wait)
    assistant = db.transact(lambda s: create_assistant(s, tenant, "order", {})).id
    log: list[str] = []
    embedder = Held(log)
    engine = ChatEngine(Reads(db, log), embedder, Silent(), CitationPresenter(db, None))

    async def answer(question: str, request_id: str = "") -> None:
        turns = [Turn("user", question)]
        inp = ChatInput(assistant, "", turns, request_id=request_id)
        async for _ in engine.answer(tenant, inp):
            pass

    return log, embedder, answer, assistant


async def first_entry(log: list[str]) -> None:
    for _ in range(200):
        if log:
            return
        await asyncio.sleep(0.01)


async def test_with_a_search_started_early_the_assistant_is_read_once_the_question_is_embedded(
    db, tenant, monkeypatch
) -> None:
    # The read would otherwise take CPU from the model run, the first delta's critical path.
    log, embedder, answer, assistant = order_engine(db, tenant, monkeypatch, wait=10.0)

    # The first answer knows nothing of the assistant: it is read at once, the model held.
    first = asyncio.ensure_future(answer("What does the first policy say about leave?"))
    await first_entry(log)
    assert log == ["assistant read"]
    embedder.release.set()
    await first
    assert log == ["assistant read", "embedded"]

    # The second starts its search on the settings it remembers, and its full-text query finds
    # the assistant's row unchanged: the assistant is not read at all.
    log.clear()
    embedder.release.clear()
    second = asyncio.ensure_future(answer("How many days of leave does the second policy give?"))
    await asyncio.sleep(0.2)
    assert log == []
    embedder.release.set()
    await second
    assert log == ["embedded"]

    # Once the assistant has changed, the next answer reads it, once the question is embedded.
    db.transact(lambda s: update_assistant(s, tenant, assistant, None, {"top_k": 3}))
    log.clear()
    embedder.release.clear()
    third = asyncio.ensure_future(answer("How many days of leave does the third policy give?"))
    await asyncio.sleep(0.2)
    assert log == []
    embedder.release.set()
    await third
    assert log == ["embedded", "assistant read"]


async def test_the_assistant_read_waits_for_a_slow_model_only_so_long(
    db, tenant, monkeypatch
) -> None:
    # A remote embedding service that hangs must not hold up what needs no vector: an answer
    # with a request_id reads the assistant with the answer that request may have stored.
    log, embedder, answer, _ = order_engine(db, tenant, monkeypatch, wait=0.1)
    embedder.release.set()
    await answer("What does the first policy say about leave?")
    log.clear()
    embedder.release.clear()
    question = "How many days of leave does the second policy give?"
    held = asyncio.ensure_future(answer(question, request_id="retry-1"))
    await first_entry(log)
    assert log == ["assistant read"]  # while the model still holds the question
    embedder.release.set()
    await held
    assert log == ["assistant read", "embedded"]

    # Without one, the answer waits for its search, which waits for the model: the search's
    # full-text statement says whether the settings it remembers are still the assistant's.
    log.clear()
    embedder.release.clear()
    usual = asyncio.ensure_future(answer("How many weeks of leave does the third policy give?"))
    await asyncio.sleep(0.3)
    assert log == []
    embedder.release.set()
    await usual
    assert log == ["embedded"]
