"""Early retrieval: what is started before the assistant is loaded, and how it is let go."""

from __future__ import annotations

import asyncio
import gc

import pytest

from services.assistants.domain import AssistantSettings
from services.chat.early import EarlyStarter, SearchPlan

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
