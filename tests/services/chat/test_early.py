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
from services.chat.pipeline import AnswerComplete, ChatEngine, ChatInput
from services.conversations.presenter import CitationPresenter
from services.conversations.store import Turn
from services.llm.base import Finished, GenerationRequest, TextPiece
from services.retrieval.search import Search, TextCandidates

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

        def search(plan: SearchPlan, vector) -> Search:
            return searching(TextCandidates([], 1), vector)

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

    def search(plan: SearchPlan, vector) -> Search:
        return searching(TextCandidates([], plan.top_k), vector)

    starter = EarlyStarter()
    first = starter.start("t", "a", QUESTION, embed, search)
    assert first.search is None  # nothing known about the assistant yet: only the vector
    assert await first.vector == [1.0]
    starter.remember("t", "a", versioned(top_k=5))
    second = starter.start("t", "a", QUESTION, embed, search)
    started = second.searched_with(second.plan)
    assert started is not None and await started.chunks == [1.0]
    assert started.text.result().assistant_version == 5


def versioned(version: int = 1, **settings) -> VersionedSettings:
    return VersionedSettings(AssistantSettings(enable_retrieval_gate=False, **settings), version)


def searching(seen: TextCandidates | Exception, vector) -> Search:
    """A search whose full-text statement saw `seen` (or failed with it), and whose chunks are
    the question's vector."""

    async def text() -> TextCandidates:
        if isinstance(seen, Exception):
            raise seen
        return seen

    async def chunks() -> list:
        await text_task
        return list(await vector)

    text_task = asyncio.ensure_future(text())
    return Search(text_task, asyncio.ensure_future(chunks()))


async def test_remembered_settings_are_used_only_at_the_version_the_search_saw() -> None:
    async def embed(_: str) -> list[float]:
        return [1.0]

    seen: list[TextCandidates | Exception] = []

    def search(plan: SearchPlan, vector) -> Search:
        return searching(seen.pop(), vector)

    starter = EarlyStarter()
    known = versioned(7, top_k=5)
    starter.remember("t", "a", known)
    cases = [
        (TextCandidates([], 7), known.settings),  # the row as it was read: no read needed
        (TextCandidates([], 8), None),  # changed since
        (TextCandidates([], None), None),  # gone
        (TextCandidates([], 7, answered=True), None),  # an answer to replay: read it
        (RuntimeError("database down"), None),  # the read that follows meets it too
    ]
    for outcome, expected in cases:
        seen.append(outcome)
        early = starter.start("t", "a", QUESTION, embed, search)
        assert await early.unchanged_settings() == expected
        early.cancel()


async def test_remembered_settings_wait_for_the_full_text_statement_only() -> None:
    # A question's vector that does not come (an embedding service down) holds up no read.
    async def embed(_: str) -> list[float]:
        await asyncio.Event().wait()
        return [1.0]

    def search(plan: SearchPlan, vector) -> Search:
        return searching(TextCandidates([], 3), vector)

    starter = EarlyStarter()
    starter.remember("t", "a", versioned(3, top_k=5))
    early = starter.start("t", "a", QUESTION, embed, search)
    settings = await asyncio.wait_for(early.unchanged_settings(), 1)
    assert settings is not None and settings.top_k == 5
    assert not early.search.chunks.done()
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
) -> tuple[list[str], Held, Callable[..., Awaitable[str]], str]:
    """An engine whose model is held and whose read in a conversation waits for it at most
    `wait` seconds: its log, its model, a function that runs one answer through it (returning
    the answer's conversation), and its assistant's id."""
    monkeypatch.setattr(early_retrieval, "READ_WAIT_SECONDS", wait)
    assistant = db.transact(lambda s: create_assistant(s, tenant, "order", {})).id
    log: list[str] = []
    embedder = Held(log)
    engine = ChatEngine(Reads(db, log), embedder, Silent(), CitationPresenter(db, None))

    async def answer(question: str, request_id: str = "", conversation_id: str = "") -> str:
        turns = [Turn("user", question)]
        inp = ChatInput(assistant, conversation_id, turns, request_id=request_id)
        async for event in engine.answer(tenant, inp):
            if isinstance(event, AnswerComplete):
                return event.result.conversation_id
        raise AssertionError("the answer did not complete")

    return log, embedder, answer, assistant


async def first_entry(log: list[str]) -> None:
    for _ in range(200):
        if log:
            return
        await asyncio.sleep(0.01)


async def with_model_held(
    log: list[str], embedder: Held, answer: Awaitable[str], held_log: list[str]
) -> str:
    """Runs an answer with its model held: checks that the log is held_log while the question
    is not yet embedded (once it has an entry, or after 0.3 s when none is expected), then
    releases the model and returns the answer's conversation."""
    log.clear()
    embedder.release.clear()
    running = asyncio.ensure_future(answer)
    if held_log:
        await first_entry(log)
    else:
        await asyncio.sleep(0.3)
    assert log == held_log
    embedder.release.set()
    return await running


async def test_an_answer_reads_its_assistant_only_when_the_search_finds_it_changed(
    db, tenant, monkeypatch
) -> None:
    log, embedder, answer, assistant = order_engine(db, tenant, monkeypatch, wait=10.0)

    # The first answer knows nothing of the assistant: it is read at once, the model held.
    first = answer("What does the first policy say about leave?")
    await with_model_held(log, embedder, first, ["assistant read"])
    assert log == ["assistant read", "embedded"]

    # The second starts its search on the settings it remembers, and its full-text query finds
    # the assistant's row unchanged: the assistant is not read at all.
    second = answer("How many days of leave does the second policy give?")
    await with_model_held(log, embedder, second, [])
    assert log == ["embedded"]

    # Once the assistant has changed, the next answer reads it as soon as its full-text query
    # has seen the change, whether or not the question is embedded yet.
    db.transact(lambda s: update_assistant(s, tenant, assistant, None, {"top_k": 3}))
    third = answer("How many days of leave does the third policy give?")
    await with_model_held(log, embedder, third, ["assistant read"])
    assert log == ["assistant read", "embedded"]


async def test_in_a_conversation_the_read_waits_for_the_model_only_so_long(
    db, tenant, monkeypatch
) -> None:
    # There the assistant is read with the earlier turns, once the question is embedded (the
    # read would otherwise take CPU from the model run, the first delta's critical path), but a
    # remote embedding service that hangs must not hold it up for long.
    for wait, held_log, final_log in (
        (10.0, [], ["embedded", "assistant read"]),
        (0.1, ["assistant read"], ["assistant read", "embedded"]),
    ):
        log, embedder, answer, _ = order_engine(db, tenant, monkeypatch, wait=wait)
        embedder.release.set()
        conversation = await answer("What does the first policy say about leave?")
        question = "How many days of leave does the second policy give?"
        in_conversation = answer(question, conversation_id=conversation)
        await with_model_held(log, embedder, in_conversation, held_log)
        assert log == final_log


async def test_a_request_id_answered_before_is_replayed_without_the_model(
    db, tenant, monkeypatch
) -> None:
    # Only the full-text query, which needs no vector, is waited for: it says the request was
    # answered, and the stored answer is read and replayed while the model still holds the
    # question. A new request_id, unanswered, reads nothing.
    log, embedder, answer, _ = order_engine(db, tenant, monkeypatch, wait=10.0)
    embedder.release.set()
    await answer("What does the first policy say about leave?")
    first = await answer("How many days of leave?", request_id="retry-1")
    log.clear()
    embedder.release.clear()
    again = await asyncio.wait_for(answer("How many days of leave?", request_id="retry-1"), 5)
    assert again == first
    assert log == ["assistant read"]
    embedder.release.set()
    log.clear()
    await answer("How many weeks of leave?", request_id="retry-2")
    assert "assistant read" not in log
