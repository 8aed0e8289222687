"""Time to the first delta of an answer, over the upstream's own first token, at scale.

    .venv/bin/python bench/ttft.py                     # the 10k-chunk corpus
    .venv/bin/python bench/ttft.py --scale 100000

The baseline is the scripted upstream's own first token, asked directly over HTTP; the
figure is the first delta of StreamComplete (retrieval on, citations on) through a Footnote
server on the corpus of bench/corpus.py. Requests alternate between the two, one at a time.
The breakdown times each step of the answer's start in this process on the same database:
auth (an uncached key lookup; the server keeps a found key for 30 s), assistant (the
transaction that loads it and looks for a replayed answer), embedding (the question, alone),
search (hybrid with the vector ready: vector and full-text queries on two connections, and
each of them alone), prompt (sources and numbered context). "start" is what a request waits
for before it calls the model: the assistant, the embedding and the search started together
the way the server starts them (the search after the embedding), then the prompt.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import time
import uuid

import corpus
import grpc
import httpx
from harness import footnote_server, percentile, upstream

from footnote.v1 import chat_service_pb2 as pb
from footnote.v1 import chat_service_pb2_grpc as pb_grpc
from services import auth
from services.assistants.domain import get_assistant
from services.citations import build_context, build_manifest
from services.conversations import store
from services.db.session import Database, make_engine
from services.retrieval import search as searching
from services.retrieval.batching import QueryBatcher
from services.retrieval.embeddings import create_embedder
from services.retrieval.search import search


async def upstream_first_token(client: httpx.AsyncClient, url: str) -> float:
    began = time.perf_counter()
    payload = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    async with client.stream("POST", f"{url}/chat/completions", json=payload) as response:
        async for _ in response.aiter_bytes():
            return time.perf_counter() - began
    raise RuntimeError("the upstream sent nothing")


async def footnote_first_delta(stub, request, metadata) -> float:
    began = time.perf_counter()
    first = None
    async for event in stub.StreamComplete(request, metadata=metadata):
        if first is None and event.WhichOneof("event") == "delta":
            first = time.perf_counter() - began
    assert first is not None, "no delta"
    return first


def ms(values, p):
    return f"{percentile(values, p) * 1000:6.1f} ms"


async def breakdown(c: corpus.Corpus, key: str, questions: list[str]) -> None:
    db = Database(make_engine(c.url, pool_size=6))
    embedder = create_embedder()
    embedder.embed_query("warm up")
    batcher = QueryBatcher(embedder)
    names = ("auth", "assistant", "embedding", "search", "  vector", "  text", "prompt", "start")
    steps: dict[str, list[float]] = {k: [] for k in names}

    async def ready(v):
        return v

    def load(s):
        settings = get_assistant(s, c.tenant_id, c.assistant_id).settings
        store.find_answer(s, c.tenant_id, uuid.uuid4().hex)
        return settings

    async def hybrid(q, vector, top_k):
        return await search(
            db,
            tenant_id=c.tenant_id,
            assistant_id=c.assistant_id,
            query=q,
            query_vector=vector,
            top_k=top_k,
        )

    def prompt(hits):
        manifest = build_manifest(hits, max_sources=10, excerpt_chars=200)
        build_context(manifest, citations=True)

    try:
        for q in questions:
            t0 = time.perf_counter()
            await db.run(lambda s: auth.lookup_key(s, key))
            t1 = time.perf_counter()
            settings = await db.run(load)
            t2 = time.perf_counter()
            vector = await batcher.embed_query(q)
            t3 = time.perf_counter()
            hits = await hybrid(q, ready(vector), settings.top_k)
            t4 = time.perf_counter()
            limit = searching.candidate_limit(settings.top_k)
            await db.run(
                lambda s, v=vector, n=limit: searching.vector_candidates(
                    s, c.tenant_id, c.assistant_id, v, n
                )
            )
            t5 = time.perf_counter()
            await db.run(
                lambda s, q=q, n=limit: searching.text_candidates(
                    s, c.tenant_id, c.assistant_id, q, n
                )
            )
            t6 = time.perf_counter()
            prompt(hits)
            t7 = time.perf_counter()
            # As the server starts an answer: all at once, the search after the embedding.
            embedding = asyncio.ensure_future(batcher.embed_query(q))
            _, hits = await asyncio.gather(db.run(load), hybrid(q, embedding, settings.top_k))
            prompt(hits)
            t8 = time.perf_counter()
            spans = (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t6 - t5, t7 - t6, t8 - t7)
            for name, d in zip(steps, spans, strict=True):
                steps[name].append(d)
    finally:
        db.dispose()
    print("breakdown (this process, same database), p50 / p95:")
    for name, values in steps.items():
        print(f"  {name:10s} {ms(values, 50)} / {ms(values, 95)}")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=int, default=10_000)
    parser.add_argument("--requests", type=int, default=60)
    parser.add_argument(
        "--first-delay-ms",
        type=float,
        default=20.0,
        help="the upstream's own time to its first token",
    )
    args = parser.parse_args()

    stack = corpus.start_stack()
    try:
        c = corpus.open_corpus(stack, args.scale)
        key = Database(make_engine(c.url, pool_size=1)).transact(
            lambda s: auth.create_key(s, c.tenant_id)
        )
        endpoints = dataclasses.replace(stack.endpoints, database_url=c.url)
        questions = [q for q, _ in corpus.questions(args.requests)]
        metadata = (("authorization", f"Bearer {key}"),)
        with (
            upstream(20, args.first_delay_ms) as llm,
            footnote_server(endpoints, llm) as target,
        ):
            async with (
                httpx.AsyncClient() as client,
                grpc.aio.insecure_channel(target) as channel,
            ):
                stub = pb_grpc.ChatServiceStub(channel)
                own, through = [], []
                for i, q in enumerate(["warm up", "warm up", *questions]):
                    request = pb.CompleteRequest(
                        assistant_id=c.assistant_id,
                        messages=[pb.ChatMessage(role=pb.ROLE_USER, content=q)],
                        request_id=uuid.uuid4().hex,
                    )
                    u = await upstream_first_token(client, llm)
                    f = await footnote_first_delta(stub, request, metadata)
                    if i >= 2:
                        own.append(u)
                        through.append(f)
        print(f"time to first delta, {c.scale:,} chunks, {len(own)} requests one at a time")
        print(f"  upstream's own first token  p50 {ms(own, 50)}  p95 {ms(own, 95)}")
        print(f"  Footnote's first delta      p50 {ms(through, 50)}  p95 {ms(through, 95)}")
        added = [(percentile(through, p) - percentile(own, p)) * 1000 for p in (50, 95)]
        print(f"  added by Footnote           p50 {added[0]:+6.1f} ms  p95 {added[1]:+6.1f} ms")
        await breakdown(c, key, questions[:30])
    finally:
        stack.stop()


if __name__ == "__main__":
    asyncio.run(main())
