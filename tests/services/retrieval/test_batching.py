"""QueryBatcher: questions that arrive together are embedded in one model run."""

from __future__ import annotations

import asyncio
import threading

import pytest

from services.retrieval.batching import RECENT_MAX_CHARS, QueryBatcher
from services.retrieval.embeddings import create_embedder


class Recording:
    """The local model, recording the batches it is asked for; the first run is held."""

    def __init__(self) -> None:
        self.model = create_embedder()
        self.batches: list[list[str]] = []
        self.release = threading.Event()

    def embed_queries(self, texts):
        self.batches.append(list(texts))
        if len(self.batches) == 1:
            self.release.wait(5)
        return self.model.embed_queries(texts)

    def embed_query(self, text):
        return self.model.embed_query(text)


async def test_questions_arriving_during_a_run_share_the_next_one():
    recording = Recording()
    batcher = QueryBatcher(recording)
    questions = ["annual leave", "sick days", "espresso", "oat milk", "descaling"]

    first = asyncio.create_task(batcher.embed_query(questions[0]))
    while not recording.batches:  # the first question runs at once, alone
        await asyncio.sleep(0.01)
    rest = [asyncio.create_task(batcher.embed_query(q)) for q in questions[1:]]
    await asyncio.sleep(0.05)
    recording.release.set()
    vectors = await asyncio.gather(first, *rest)

    assert recording.batches == [questions[:1], questions[1:]]
    for question, vector in zip(questions, vectors, strict=True):
        assert vector == pytest.approx(recording.model.embed_query(question), abs=1e-5)


async def test_a_failed_run_fails_every_question_in_it():
    class Broken:
        def embed_queries(self, texts):
            raise RuntimeError("model gone")

    batcher = QueryBatcher(Broken())
    results = await asyncio.gather(
        batcher.embed_query("a"), batcher.embed_query("b"), return_exceptions=True
    )
    assert [type(r) for r in results] == [RuntimeError, RuntimeError]
    # The batcher still works after a failure.
    batcher.embedder = Recording().model
    assert len(await batcher.embed_query("c")) == 384


async def test_a_question_asked_again_is_not_embedded_again():
    recording = Recording()
    recording.release.set()
    batcher = QueryBatcher(recording, recent=2)

    first = await batcher.embed_query("annual leave")
    assert await batcher.embed_query("annual leave") == first  # the very same numbers
    assert recording.batches == [["annual leave"]]
    await batcher.embed_query("sick days")
    await batcher.embed_query("annual leave")  # still among the 2 most recent
    await batcher.embed_query("espresso")  # "sick days" goes
    await batcher.embed_query("sick days")
    assert recording.batches == [["annual leave"], ["sick days"], ["espresso"], ["sick days"]]

    # Nothing is kept of a question whose run failed.
    class Broken:
        def embed_queries(self, texts):
            raise RuntimeError("model gone")

    failing = QueryBatcher(Broken())
    with pytest.raises(RuntimeError):
        await failing.embed_query("oat milk")
    failing.embedder = recording
    assert await failing.embed_query("oat milk") == recording.model.embed_query("oat milk")
    assert recording.batches[-1] == ["oat milk"]  # the model ran again


async def test_tenants_do_not_share_question_vectors_and_long_texts_are_not_kept():
    recording = Recording()
    recording.release.set()
    batcher = QueryBatcher(recording)

    await batcher.embed_query("annual leave", tenant="acme")
    await batcher.embed_query("annual leave", tenant="acme")
    # Another tenant's question is embedded afresh: no tenant can time another's questions.
    await batcher.embed_query("annual leave", tenant="globex")
    assert recording.batches == [["annual leave"], ["annual leave"]]

    long = "leave " * (RECENT_MAX_CHARS // 6 + 1)
    await batcher.embed_query(long, tenant="acme")
    await batcher.embed_query(long, tenant="acme")
    assert recording.batches[2:] == [[long], [long]]
