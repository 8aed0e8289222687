"""Time to the first delta of an answer, over the upstream's own first token, at scale.

    .venv/bin/python bench/ttft.py                     # the 10k-chunk corpus
    .venv/bin/python bench/ttft.py --scale 100000
    .venv/bin/python bench/ttft.py --scale 100000 --compare main   # and main's server, in turn
    .venv/bin/python bench/ttft.py --scale 100000 --server main    # main's server alone
    .venv/bin/python bench/ttft.py --scale 100000 --untraced       # and with no exporter
    .venv/bin/python bench/ttft.py --scale 100000 --vectors clustered

The baseline is the scripted upstream's own first token, asked directly over HTTP; the
figure is the first delta of StreamComplete (retrieval on, citations on) through a Footnote
server on the corpus of bench/corpus.py. Requests alternate between the two, one at a time.
Each is a plain request; with --idempotent each carries its own request_id (its idempotency
key), whose stored answer the server then looks for in the search's full-text statement
(services/chat/early.py).
With --compare REV a second server runs the code at REV beside this tree's, and each
question goes to both in turn: the load that other work puts on the machine then falls on
both alike, which separate runs (tens of ms apart on a shared machine) cannot promise.
With --untraced the second server is this tree's with no exporter, as it is deployed unless
one is configured: the spans the breakdown below reads are recorded only by the first, and
they cost it time on the way to the first delta.

Two breakdowns follow. "In the server" comes from the server's own spans, sent over OTLP to
this process and read after the server has stopped (nothing is exported while it answers):
arrival (the call until the server's span starts), retrieval (from there until the chunks are
ready: the embedding, the search, and the assistant's read beside them when the server reads it
(not once the full-text query has found its row unchanged), whose own durations are shown too,
with when the embedding began and the search's vector and full-text queries, each from its
start to its rows in Python; "handed" is from the embedding's end to the vector query's start,
"fusion" from the later query's rows to the chunks), prompt (chunks to the model being asked:
sources, excerpts, the numbered context), model (asked until its first text, over HTTP; the
upstream's own first token, measured right before by this process, is the baseline) and relay
(the model's first text until the first delta is handed to gRPC), then to the client.

"Alone in this process" times each step by itself on the same database, after the server has
stopped: auth (an uncached key lookup; the server keeps a found key for 30 s), assistant (the
transaction that loads it and looks for a replayed answer), embedding (the question), search
(hybrid with the vector ready: vector and full-text queries on two connections, and each of
them alone), prompt (sources and numbered context). "start" is the embedding and the search
started together the way the server starts them (the search after the embedding; the assistant
is not read, as when the server remembers it unchanged), then the prompt; it runs first for
each question, so no step before it has just run the same queries.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import http.server
import threading
import time
import uuid
from collections import defaultdict
from pathlib import Path

import aiohttp
import corpus
import grpc
from complete import main_tree
from harness import CALL_SECONDS, footnote_server, machine, percentile, upstream

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
from services.retrieval.search import start_search

SERVER_TREE = Path("/tmp/fnbench-ttft-server")


async def upstream_first_token(client: aiohttp.ClientSession, url: str) -> float:
    """The scripted upstream's own first token, asked with the HTTP client the server uses."""
    began = time.perf_counter()
    payload = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    async with client.post(f"{url}/chat/completions", json=payload) as response:
        async for _ in response.content.iter_any():
            return time.perf_counter() - began
    raise RuntimeError("the upstream sent nothing")


async def footnote_first_delta(stub, request, metadata) -> tuple[float, int, int]:
    """Seconds to the first delta, and the wall clock (ns) at the call and at that delta."""
    called = time.time_ns()
    began = time.perf_counter()
    first = None
    async for event in stub.StreamComplete(request, metadata=metadata, timeout=CALL_SECONDS):
        if first is None and event.WhichOneof("event") == "delta":
            first = time.perf_counter() - began
            arrived = time.time_ns()
    assert first is not None, "no delta"
    return first, called, arrived


class SpanSink:
    """An OTLP/HTTP traces endpoint in this process that keeps every span it is sent."""

    def __init__(self) -> None:
        bodies = self.bodies = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                bodies.append(self.rfile.read(int(self.headers["Content-Length"])))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def env(self) -> dict[str, str]:
        """The server's settings: export here, and only when it stops (or 100k spans wait)."""
        return {
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"http://127.0.0.1:{self.server.server_port}"
            "/v1/traces",
            "OTEL_BSP_SCHEDULE_DELAY": "3600000",
            "OTEL_BSP_MAX_QUEUE_SIZE": "100000",
            "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "100000",
        }

    def traces(self) -> dict[bytes, list]:
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

        traces = defaultdict(list)
        for body in self.bodies:
            request = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
            for resource in request.resource_spans:
                for scope in resource.scope_spans:
                    for span in scope.spans:
                        traces[span.trace_id].append(span)
        return traces

    def close(self) -> None:
        self.server.shutdown()


def request_id_of(span) -> str:
    for kv in span.attributes:
        if kv.key == "footnote.request_id":
            return kv.value.string_value
    return ""


def server_steps(
    sink: SpanSink, calls: dict[str, tuple[int, int]], own: dict[str, float]
) -> dict[str, list[float]]:
    """Each request's start, step by step, from the server's spans (seconds)."""
    names = ("arrival", "retrieval", "  assistant", "  embedding", "    began", "  handed")
    names += ("  vector", "  text", "  fusion", "prompt", "model", "  over own", "relay")
    names += ("to client",)
    steps: dict[str, list[float]] = {k: [] for k in names}
    for spans in sink.traces().values():
        rpc = next((s for s in spans if s.name.endswith("/StreamComplete")), None)
        if rpc is None or request_id_of(rpc) not in calls:
            continue
        rid = request_id_of(rpc)
        called, arrived = calls[rid]
        by_name = {s.name: s for s in spans}
        retrieve, generate = by_name["chat.retrieve"], by_name["chat.generate"]
        load, embed = by_name.get("chat.load"), by_name.get("retrieval.embed_questions")
        vector, text = by_name.get("retrieval.vector"), by_name.get("retrieval.text")
        # A server older than these events (--server) has only the spans.
        token = [e.time_unix_nano for e in generate.events if e.name.endswith("first_token")]
        delta = [e.time_unix_nano for e in rpc.events if e.name.endswith("first_delta")]
        model = token[0] - generate.start_time_unix_nano if token else None
        values = {
            "arrival": rpc.start_time_unix_nano - called,
            "retrieval": retrieve.end_time_unix_nano - rpc.start_time_unix_nano,
            "  assistant": duration(load),
            "  embedding": duration(embed),
            "    began": embed.start_time_unix_nano - rpc.start_time_unix_nano if embed else None,
            "  handed": vector.start_time_unix_nano - embed.end_time_unix_nano
            if vector and embed
            else None,
            "  vector": duration(vector),
            "  text": duration(text),
            "  fusion": retrieve.end_time_unix_nano
            - max(vector.end_time_unix_nano, text.end_time_unix_nano)
            if vector and text
            else None,
            "prompt": generate.start_time_unix_nano - retrieve.end_time_unix_nano,
            "model": model,
            "  over own": model - round(own[rid] * 1e9) if model is not None else None,
            "relay": delta[0] - token[0] if token and delta else None,
            "to client": arrived - delta[0] if delta else None,
        }
        for name, ns in values.items():
            if ns is not None:
                steps[name].append(ns / 1e9)
    return steps


def duration(span) -> int | None:
    return span.end_time_unix_nano - span.start_time_unix_nano if span is not None else None


def ms(values, p):
    return f"{percentile(values, p) * 1000:6.1f} ms"


async def breakdown(c: corpus.Corpus, key: str, questions: list[str]) -> None:
    db = Database(make_engine(c.url, pool_size=6))
    embedder = create_embedder()
    embedder.embed_query("warm up")
    # Nothing kept: "embedding" below times the model on a question "start" has just asked.
    batcher = QueryBatcher(embedder, recent=0)
    names = ("auth", "assistant", "embedding", "search", "  vector", "  text", "prompt", "start")
    steps: dict[str, list[float]] = {k: [] for k in names}

    async def ready(v):
        return v

    def load(s):
        settings = get_assistant(s, c.tenant_id, c.assistant_id).settings
        store.find_answer(s, c.tenant_id, uuid.uuid4().hex)
        return settings

    async def hybrid(q, vector, top_k):
        return await start_search(
            db,
            tenant_id=c.tenant_id,
            assistant_id=c.assistant_id,
            query=q,
            query_vector=vector,
            top_k=top_k,
        ).chunks

    def prompt(hits):
        # As the server builds it before asking the model: the excerpts wait for the citations.
        manifest = build_manifest(hits, max_sources=10, excerpts=False)
        build_context(manifest, citations=True)

    try:
        settings = await db.run(load)
        for q in questions:
            # As the server starts an answer: all at once, the search after the embedding.
            # First, so that no step before it has just run this question's queries.
            s0 = time.perf_counter()
            embedding = asyncio.ensure_future(batcher.embed_query(q))
            # The assistant is not read: its row is found unchanged by the full-text query.
            prompt(await hybrid(q, embedding, settings.top_k))
            start = time.perf_counter() - s0
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
            spans = (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t6 - t5, t7 - t6, start)
            for name, d in zip(steps, spans, strict=True):
                steps[name].append(d)
    finally:
        db.dispose()
    print("breakdown, alone in this process (same database, server stopped), p50 / p95:")
    for name, values in steps.items():
        print(f"  {name:10s} {ms(values, 50)} / {ms(values, 95)}")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=int, default=10_000)
    parser.add_argument("--requests", type=int, default=60)
    parser.add_argument(
        "--warm-up",
        type=int,
        default=300,
        help="questions asked first and not counted: a freshly started Postgres reads each page"
        " a search touches from the OS, where a running server has them in its buffers",
    )
    parser.add_argument(
        "--vectors",
        choices=corpus.VECTORS,
        default="random",
        help="the corpus (bench/corpus.py): its chunk vectors, and for `real` its text and"
        " questions; the server embeds each question as always",
    )
    parser.add_argument(
        "--compare",
        metavar="REV",
        help="also run the server at REV (exported with git archive) and ask both in turn",
    )
    parser.add_argument(
        "--server", metavar="REV", help="run only the server at REV instead of this tree's"
    )
    parser.add_argument(
        "--untraced",
        action="store_true",
        help="also run this tree's server without an exporter (as deployed unless one is"
        " configured), asked in turn with the traced one",
    )
    parser.add_argument(
        "--idempotent",
        action="store_true",
        help="send each request with its own request_id (the idempotency key), whose stored"
        " answer the server then looks for",
    )
    parser.add_argument(
        "--first-delay-ms",
        type=float,
        default=20.0,
        help="the upstream's own time to its first token",
    )
    args = parser.parse_args()
    print(machine(), flush=True)
    if sum(map(bool, (args.compare, args.server, args.untraced))) > 1:
        parser.error("--compare, --server and --untraced do not go together")

    stack = corpus.start_stack(scale=args.scale)
    sink = SpanSink()
    try:
        c = corpus.open_corpus(stack, args.scale, vectors=args.vectors)
        key = Database(make_engine(c.url, pool_size=1)).transact(
            lambda s: auth.create_key(s, c.tenant_id)
        )
        endpoints = dataclasses.replace(stack.endpoints, database_url=c.url)
        # Other questions first: right after a start, or after another corpus was searched, the
        # first few dozen answers read pages from disk (a p95 of hundreds of ms, then tens).
        try:
            asked = [q for q, _ in corpus.questions(args.requests + args.warm_up, c)]
        except corpus.CorpusUnavailable as e:
            parser.error(f"{e} (--requests plus --warm-up)")
        questions, warm = asked[: args.requests], asked[args.requests :]
        # Each server: its name, the revision it runs (None: this tree) and whether it exports
        # its spans. An untraced one makes none inside a call (services/observability/
        # tracing.py), so only its first deltas are timed.
        servers = [
            (f"at {args.server}", args.server, True) if args.server else ("this tree", None, True)
        ]
        if args.compare:
            servers.append((f"at {args.compare}", args.compare, True))
        if args.untraced:
            servers.append(("this tree, untraced", None, False))
        names = [name for name, _, _ in servers]
        calls: dict[str, dict[str, tuple[int, int]]] = {name: {} for name in names}
        own_first: dict[str, float] = {}
        own: list[float] = []
        through: dict[str, list[float]] = {name: [] for name in names}
        with contextlib.ExitStack() as running:
            llm = running.enter_context(upstream(20, args.first_delay_ms))
            targets = []
            for _, revision, traced in servers:
                tree = None
                if revision:
                    tree = running.enter_context(
                        main_tree(revision, SERVER_TREE, newer_migrations=True)
                    )
                env = sink.env() if traced else {}
                targets.append(
                    running.enter_context(footnote_server(endpoints, llm, cwd=tree, env=env))
                )
            async with contextlib.AsyncExitStack() as channels, aiohttp.ClientSession() as client:
                stubs = [
                    pb_grpc.ChatServiceStub(
                        await channels.enter_async_context(grpc.aio.insecure_channel(target))
                    )
                    for target in targets
                ]
                for i, q in enumerate([*warm, *questions]):
                    u = await upstream_first_token(client, llm)
                    # Each server answers the same question right after the upstream's own
                    # first token was timed, in turn, so load from elsewhere hits both alike.
                    # Which goes first alternates: the second finds the question's pages and
                    # plans warm in Postgres (a search repeated at once is 10-15 ms faster).
                    turns = list(zip(names, stubs, strict=True))
                    for name, stub in turns[i % 2 :] + turns[: i % 2]:
                        rid = uuid.uuid4().hex
                        request = pb.CompleteRequest(
                            assistant_id=c.assistant_id,
                            messages=[pb.ChatMessage(role=pb.ROLE_USER, content=q)],
                            request_id=rid if args.idempotent else "",
                        )
                        metadata = (("authorization", f"Bearer {key}"), ("x-request-id", rid))
                        f, called, arrived = await footnote_first_delta(stub, request, metadata)
                        if i >= len(warm):
                            through[name].append(f)
                            calls[name][rid] = (called, arrived)
                            own_first[rid] = u
                    if i >= len(warm):
                        own.append(u)
        print(
            f"time to first delta, {c.scale:,} chunks ({args.vectors} vectors), "
            f"{len(own)} requests one at a time"
        )
        print(f"  upstream's own first token  p50 {ms(own, 50)}  p95 {ms(own, 95)}")
        for name in names:
            first = through[name]
            added = [(percentile(first, p) - percentile(own, p)) * 1000 for p in (50, 95)]
            print(f"  Footnote ({name})")
            print(f"    first delta               p50 {ms(first, 50)}  p95 {ms(first, 95)}")
            print(f"    added by Footnote         p50 {added[0]:+6.1f} ms  p95 {added[1]:+6.1f} ms")
        if len(names) == 2:
            paired = [a - b for a, b in zip(*through.values(), strict=True)]
            print(
                f"  {names[0]} minus {names[1].removeprefix('at ')}, request by request: "
                f"p50 {percentile(paired, 50) * 1000:+.1f} ms, mean "
                f"{sum(paired) / len(paired) * 1000:+.1f} ms"
            )
        for name, _, traced in servers:
            if not traced:
                continue
            steps = server_steps(sink, calls[name], own_first)
            print(f"breakdown in the server ({name}; its spans), p50 / p95:")
            for step, values in steps.items():
                if values:
                    print(f"  {step:11s} {ms(values, 50)} / {ms(values, 95)}")
        await breakdown(c, key, questions[:30])
    finally:
        sink.close()
        stack.stop()


if __name__ == "__main__":
    asyncio.run(main())
