"""Question embeddings for concurrent requests, computed together in one model run, and the
vectors of recent questions."""

from __future__ import annotations

import asyncio
from array import array
from collections import OrderedDict

from services.observability.tracing import tracer
from services.retrieval.embeddings import Embedder

MAX_BATCH = 32
# Recent questions whose vectors are kept: a question asked again (an answer regenerated, a
# retry under a new request id, the same question from a tenant's many users) skips the model,
# 5-10 ms of the first delta on two busy cores. A vector depends on its text alone, but each
# tenant has its own entries: a shared one would let a tenant tell, by the time an answer
# takes, whether another had just asked the same question. Only questions of at most
# RECENT_MAX_CHARS are kept; each entry is the doubles the model gave (an embedding endpoint
# may send more precision than float32, 3.1 kB) and its text, so 2,048 hold at most 8.5 MB.
RECENT_QUESTIONS = 2048
RECENT_MAX_CHARS = 1000


class QueryBatcher:
    """Embeds questions; those that arrive while a run is busy go together into the next one.

    Nothing waits for company: a question that finds the model idle runs at once. A batch is
    one hand-over to a thread and, for an embedding server, one request (the local model runs
    its questions one by one: LocalEmbedder.embed_queries). A text's vector does not depend
    on its batch, so batching changes no answer.
    """

    def __init__(
        self, embedder: Embedder, max_batch: int = MAX_BATCH, recent: int = RECENT_QUESTIONS
    ) -> None:
        self.embedder = embedder
        self.max_batch = max_batch
        self.recent = recent
        self._pending: list[tuple[str, asyncio.Future[list[float]]]] = []
        self._runner: asyncio.Task[None] | None = None
        self._vectors: OrderedDict[tuple[str, str], array[float]] = OrderedDict()

    async def embed_query(self, text: str, *, tenant: str = "") -> list[float]:
        """The question's vector; recent questions of the same tenant are not embedded again."""
        key = (tenant, text)
        keep = self.recent > 0 and len(text) <= RECENT_MAX_CHARS
        known = self._vectors.get(key) if keep else None
        if known is not None:
            self._vectors.move_to_end(key)
            return known.tolist()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[list[float]] = loop.create_future()
        self._pending.append((text, future))
        if self._runner is None or self._runner.done() or self._runner.get_loop() is not loop:
            self._runner = loop.create_task(self._drain())
        vector = await future
        if keep:
            self._vectors[key] = array("d", vector)
            if len(self._vectors) > self.recent:
                self._vectors.popitem(last=False)
        return vector

    async def _drain(self) -> None:
        while self._pending:
            batch = self._pending[: self.max_batch]
            del self._pending[: self.max_batch]
            loop = asyncio.get_running_loop()
            # Futures of a loop that is gone (an earlier event loop in the same process).
            batch = [(t, f) for t, f in batch if f.get_loop() is loop and not f.done()]
            if not batch:
                continue
            try:
                with tracer().start_as_current_span(
                    "retrieval.embed_questions", attributes={"footnote.batch_size": len(batch)}
                ):
                    vectors = await asyncio.to_thread(
                        self.embedder.embed_queries, [text for text, _ in batch]
                    )
            except Exception as err:  # every waiter gets the failure, typed as it was raised
                for _, future in batch:
                    if not future.done():
                        future.set_exception(err)
            else:
                for (_, future), vector in zip(batch, vectors, strict=True):
                    if not future.done():
                        future.set_result(vector)
