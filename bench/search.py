"""Hybrid search latency and HNSW recall at scale, against the previous search in the same run.

    .venv/bin/python bench/search.py                   # 10k chunks (built once, ~1 min)
    .venv/bin/python bench/search.py --scale 100000    # built once, ~10 min on 2 busy cores
    .venv/bin/python bench/search.py --scale 100000 --vectors random clustered
    .venv/bin/python bench/search.py --scale 1000000 --vectors clustered --previous-queries 3

The corpus (bench/corpus.py) is kept under /tmp/fnbench between runs. Printed:
- hybrid search p50/p95 through `search` (two connections at once) and through the previous
  implementation (one connection, ef_search 40, every full-text match ranked), same questions;
- where the time goes: the vector query, the full-text query (each on its own, outside a
  transaction, the way `search` runs them) and fusion;
- recall@10 of the vector query against exact search (no index) on the same vectors, under
  the tenant and assistant filters, as the server searches (an assistant whose HNSW walk
  misses, or a small one, is searched exactly in memory, `--vector-memory-mb`) and through
  HNSW alone at each `--ef-search`, for the large assistant and for a tenth-size one (with
  questions near its own documents, and with the large one's, which are off its topics);
  at 1M chunks the tenth-size assistants have vector indexes of their own, built as the
  worker builds them (services/retrieval/indexes.py);
each for random unit vectors (the worst case for HNSW) and, with `--vectors clustered`, for
vectors clustered the way embeddings of real documents are, or with `--vectors real` for
passages of manual pages with their real embeddings and real questions (bench/corpus.py);
- with `--vectors real`, known items: sentences of the assistant's own chunks asked as
  questions, each found word for word in one chunk only, and how often that chunk is in full
  text's top 8, the hybrid's top 8 and first, with the current full-text rank and the previous
  one (candidates ranked by the rare terms that chose them alone) in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid
from pathlib import Path

import numpy as np
from sqlalchemy import text

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import corpus
from harness import machine, percentile

from services.citations.spans import sentence_ranges
from services.config import Settings
from services.db.session import Database, make_engine
from services.retrieval import search as current
from services.retrieval import vector_memory
from services.retrieval.embeddings import create_embedder

# The search as it was before this benchmark's changes: the baseline of every ratio.
PREVIOUS_VECTOR_SQL = text(
    """
    SELECT c.id, 1 - (c.embedding <=> CAST(:query AS vector)) AS similarity
    FROM chunks c JOIN documents d ON d.id = c.document_id
    WHERE c.tenant_id = :tenant AND c.assistant_id = :assistant
      AND d.state = 'READY' AND d.delete_time IS NULL
    ORDER BY c.embedding <=> CAST(:query AS vector)
    LIMIT :limit
    """
)
PREVIOUS_TEXT_SQL = text(
    """
    WITH q AS (
      SELECT to_tsquery('english', replace(plainto_tsquery('english', :query)::text, '&', '|'))
        AS query
    )
    SELECT c.id, ts_rank_cd(c.tsv, q.query) AS rank
    FROM chunks c JOIN documents d ON d.id = c.document_id, q
    WHERE c.tenant_id = :tenant AND c.assistant_id = :assistant
      AND d.state = 'READY' AND d.delete_time IS NULL
      AND q.query <> ''::tsquery AND c.tsv @@ q.query
    ORDER BY rank DESC, c.id
    LIMIT :limit
    """
)
PREVIOUS_DETAILS_SQL = text(
    """
    SELECT c.id, c.document_id, d.display_name, d.content_type, c.chunk_index, c.text,
           c.start_offset, c.end_offset, c.start_line, c.end_line, c.page_start, c.page_end,
           c.heading_path, d.sha256, d.indexed_time
    FROM chunks c JOIN documents d ON d.id = c.document_id
    WHERE c.id = ANY(:ids)
    """
)
EXACT_SQL = text(
    """
    SELECT c.id, c.embedding <=> CAST(:query AS vector) AS distance
    FROM chunks c JOIN documents d ON d.id = c.document_id
    WHERE c.tenant_id = :tenant AND c.assistant_id = :assistant
      AND d.state = 'READY' AND d.delete_time IS NULL
    ORDER BY c.embedding <=> CAST(:query AS vector)
    LIMIT :limit
    """
)
TOP_K = 8


def previous_search(s, tenant_id, assistant_id, query, vector):
    limit = current.candidate_limit(TOP_K)
    params = {"tenant": tenant_id, "assistant": uuid.UUID(assistant_id), "limit": limit}
    s.execute(text("SET LOCAL hnsw.iterative_scan = 'relaxed_order'"))
    literal = current.vector_literal(vector)
    vector_rows = s.execute(PREVIOUS_VECTOR_SQL, {**params, "query": literal}).all()
    text_rows = s.execute(PREVIOUS_TEXT_SQL, {**params, "query": query}).all()
    fused = current.fuse([[r.id for r in vector_rows], [r.id for r in text_rows]])
    kept = sorted(fused, key=lambda i: -fused[i])[:TOP_K]
    return s.execute(PREVIOUS_DETAILS_SQL, {"ids": kept}).all()


def exact_nearest(s, tenant_id, assistant_id, vector, k):
    """The k nearest chunks by exact search: (id, cosine distance), nearest first."""
    s.execute(text("SET LOCAL enable_indexscan = off"))
    s.execute(text("SET LOCAL enable_bitmapscan = off"))
    rows = s.execute(
        EXACT_SQL,
        {
            "tenant": tenant_id,
            "assistant": uuid.UUID(assistant_id),
            "query": current.vector_literal(vector),
            "limit": k,
        },
    ).all()
    return [(r.id, float(r.distance)) for r in rows]


def own_questions(db, assistant_id, count):
    """Question vectors near the assistant's own documents: each a new chunk of one of them
    (at corpus.TOPIC_COSINE from the mean of the document's chunks, its topic)."""
    rows = db.transact(
        lambda s: s.execute(
            text(
                "SELECT avg(embedding)::text FROM chunks WHERE assistant_id = :a"
                " GROUP BY document_id ORDER BY md5(document_id::text) LIMIT :n"
            ),
            {"a": uuid.UUID(assistant_id), "n": count},
        ).scalars()
    )
    rng = np.random.default_rng(corpus.SEED + 3)
    for row in rows:
        topic = np.array([float(x) for x in row.strip("[]").split(",")], dtype=np.float32)
        topic /= np.linalg.norm(topic)
        vector = corpus.near(rng, topic[None, :], corpus.TOPIC_COSINE)[0]
        yield "", [float(x) for x in vector]


# Known items (real corpus): a sentence from the middle of one of the assistant's chunks,
# asked as a question, where that chunk is the only one holding the sentence word for word
# (manual pages repeat many sentences). The chunk should come back.
KNOWN_ITEMS = 300
KNOWN_SENTENCE = (40, 200)  # characters
# The full-text rank as services/retrieval/search.py writes it (checked before use), and the
# rank before candidates were ranked by every term of the question: by the rarest terms, those
# that chose them, alone.
CURRENT_TEXT_RANK = """ts_rank(CAST(:weights AS float4[]), c.tsv, (SELECT terms FROM chosen))
             + ts_rank(CAST(:weights AS float4[]), c.tsv, (SELECT every FROM chosen))"""
PREVIOUS_TEXT_RANK = "ts_rank_cd(CAST(:weights AS float4[]), c.tsv, (SELECT terms FROM chosen))"


def known_items(db, c, count):
    """(sentence, chunk id) for sentences found in one chunk of the assistant only, taken from
    chunks that search can return (of READY, undeleted documents)."""
    rows = db.read(
        lambda s: s.execute(
            text(
                "SELECT c.id, c.text FROM chunks c JOIN documents d ON d.id = c.document_id"
                " WHERE c.assistant_id = :a AND d.state = 'READY' AND d.delete_time IS NULL"
                " ORDER BY md5(c.id::text) LIMIT :n"
            ),
            {"a": uuid.UUID(c.assistant_id), "n": count},
        ).all()
    )
    shortest, longest = KNOWN_SENTENCE
    items = []
    for r in rows:
        sentences = [
            r.text[a:b] for a, b in sentence_ranges(r.text) if shortest <= b - a <= longest
        ]
        if not sentences:
            continue
        sentence = sentences[len(sentences) // 2]
        holders = db.read(
            lambda s, q=sentence: s.execute(
                text(
                    "SELECT count(*) FROM chunks WHERE assistant_id = :a AND strpos(text, :q) > 0"
                ),
                {"a": uuid.UUID(c.assistant_id), "q": q},
            ).scalar_one()
        )
        if holders == 1:
            items.append((sentence, r.id))
    return items


def known_item_hits(db, c, items, vectors):
    """How often the sentence's chunk is in full text's top 8, the hybrid's top 8, and first."""
    limit = current.candidate_limit(TOP_K)
    text_hits = hybrid_hits = first = 0
    for (sentence, chunk), vector in zip(items, vectors, strict=True):
        text_rows = db.read(
            lambda s, q=sentence: current.text_candidates(s, c.tenant_id, c.assistant_id, q, limit)
        )
        vector_rows = db.read(
            lambda s, v=vector: current.vector_candidates(s, c.tenant_id, c.assistant_id, v, limit)
        )
        hits = [h.chunk_id for h in current.rank(vector_rows, text_rows, TOP_K, 0.0)]
        text_hits += chunk in [r.id for r in text_rows[:TOP_K]]
        hybrid_hits += str(chunk) in hits
        first += hits[:1] == [str(chunk)]
    return text_hits, hybrid_hits, first


def ms(seconds):
    return f"{seconds * 1000:7.1f} ms"


async def ready(vector):
    return vector


async def time_current(db, c, questions):
    timings = []
    for q, v in questions:
        began = time.perf_counter()
        await current.start_search(
            db,
            tenant_id=c.tenant_id,
            assistant_id=c.assistant_id,
            query=q,
            query_vector=ready(v),
            top_k=TOP_K,
        ).chunks
        timings.append(time.perf_counter() - began)
    return timings


async def time_previous(db, c, questions):
    timings = []
    for q, v in questions:
        began = time.perf_counter()
        await db.run(lambda s, q=q, v=v: previous_search(s, c.tenant_id, c.assistant_id, q, v))
        timings.append(time.perf_counter() - began)
    return timings


def stage_timings(db, c, questions):
    """Each part of `search` alone: vector query, full-text query, fusion."""
    limit = current.candidate_limit(TOP_K)
    stages = {"vector": [], "text": [], "fusion": []}
    for q, v in questions:
        t0 = time.perf_counter()
        vector_rows = db.read(
            lambda s, v=v: current.vector_candidates(s, c.tenant_id, c.assistant_id, v, limit)
        )
        t1 = time.perf_counter()
        text_rows = db.read(
            lambda s, q=q: current.text_candidates(s, c.tenant_id, c.assistant_id, q, limit)
        )
        t2 = time.perf_counter()
        current.rank(vector_rows, text_rows, TOP_K, 0.0)
        t3 = time.perf_counter()
        for name, d in zip(stages, (t1 - t0, t2 - t1, t3 - t2), strict=True):
            stages[name].append(d)
    return stages


def truths(db, tenant_id, assistant_id, questions):
    return [
        db.transact(lambda s, v=v: exact_nearest(s, tenant_id, assistant_id, v, 10))
        for _, v in questions
    ]


# A chunk found counts when it is as near as the tenth exact neighbour, give or take float
# rounding: manual pages repeat passages word for word (the real corpus holds many identical
# vectors), and which of two equally near chunks a search returns is arbitrary.
TIE = 1e-6


SETTLE_SECONDS = 600


def settled(memory) -> None:
    """Returns once the copies' loads and checks of the walk under way have ended; a set
    measured while one still ran would count the wrong questions, so a check that outlasts
    SETTLE_SECONDS stops the bench rather than skew its recall."""
    if not memory.wait_idle(SETTLE_SECONDS):
        raise RuntimeError(f"a load of a copy in memory ran past {SETTLE_SECONDS} s")


def recall(db, tenant_id, assistant_id, questions, truth, ef_search):
    """Mean recall@10 at this ef_search (ties with the tenth neighbour count), and the vector
    query's p50 time. ef_search is (EF_SEARCH, LARGE_EF_SEARCH) as the server has them, or one
    breadth asked for whatever the size of the assistant."""
    if isinstance(ef_search, int):
        ef_search = (ef_search, ef_search)
    current.EF_SEARCH, current.LARGE_EF_SEARCH = ef_search
    found, timings = [], []
    for (_, v), expected in zip(questions, truth, strict=True):
        began = time.perf_counter()
        got = db.transact(
            lambda s, v=v: current.vector_candidates(s, tenant_id, assistant_id, v, 10)
        )
        timings.append(time.perf_counter() - began)
        found.append(recall_of(got, expected))
    return statistics.fmean(found), percentile(timings, 50)


def recall_of(got, expected):
    """The share of the exact nearest (id, distance) that the rows found (ties count)."""
    if not expected:
        return 1.0
    ids, farthest = {i for i, _ in expected}, expected[-1][1]
    near = [r for r in got if r.id in ids or 1 - float(r.similarity) <= farthest + TIE]
    return min(len(near), len(expected)) / len(expected)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=int, default=10_000, help="chunks in the assistant")
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument(
        "--previous-queries",
        type=int,
        default=20,
        help="questions for the previous search (seconds each at 100k)",
    )
    parser.add_argument("--vectors", nargs="*", choices=corpus.VECTORS, default=["random"])
    parser.add_argument("--recall-queries", type=int, default=50)
    parser.add_argument("--ef-search", type=int, nargs="*", default=[40, 100, 200, 400])
    parser.add_argument(
        "--hybrid-ef-search",
        type=int,
        default=current.EF_SEARCH,
        help="FOOTNOTE_HNSW_EF_SEARCH for the timed searches (default %(default)s); an"
        f" HNSW index of more than {current.LARGE_CHUNKS:,} chunks is walked at least"
        f" {current.LARGE_EF_SEARCH} wide, as the server does",
    )
    parser.add_argument(
        "--warm-up",
        type=int,
        help="other questions searched first, not timed (default: 300, or one per 500 chunks"
        " at larger scales): a freshly started Postgres reads each page a search touches from"
        " the OS, where a running server has them in its buffers",
    )
    parser.add_argument(
        "--vector-memory-mb",
        type=int,
        default=Settings.model_fields["vector_memory_mb"].default,
        help="FOOTNOTE_VECTOR_MEMORY_MB (default %(default)s): assistants whose HNSW walk misses,"
        " and small ones (from their second question), are searched exactly in memory"
        " (services/retrieval/vector_memory.py); 0 for HNSW and Postgres's exact scan alone",
    )
    parser.add_argument(
        "--always-hold",
        action="store_true",
        help="hold the assistants in memory whatever their HNSW walk finds: what a search from"
        " memory costs at this scale, which does not depend on the vectors (random ones at 1M"
        " would be held; their HNSW index takes over an hour to build here)",
    )
    parser.add_argument(
        "--cold",
        type=int,
        default=0,
        metavar="N",
        help="first, N questions asked of the fresh process at --cold-pace a second: recall@10"
        " as served from the first question, before the assistant's vectors are held",
    )
    parser.add_argument(
        "--cold-pace",
        type=float,
        default=COLD_PACE,
        help="questions a second in --cold (default %(default)s; 0: back to back)",
    )
    parser.add_argument("--database-url", help="a built corpus database, instead of starting one")
    args = parser.parse_args()
    print(machine(), flush=True)
    if args.warm_up is None:
        args.warm_up = max(300, args.scale // 500)
    if args.always_hold:
        vector_memory.GOOD_RECALL = float("inf")

    stack = None if args.database_url else corpus.start_postgres(args.scale)
    try:
        for vectors in args.vectors:
            try:
                if stack is None:
                    c = corpus.attach(
                        corpus.database_url(
                            args.database_url, corpus.database_name(args.scale, vectors)
                        ),
                        args.scale,
                        vectors,
                    )
                else:
                    c = corpus.open_corpus(stack, args.scale, vectors=vectors)
                await measure(c, args)
            except corpus.CorpusUnavailable as e:
                print(f"{vectors} vectors skipped: {e}")
    finally:
        if stack is not None:
            stack.stop()


async def measure(c: corpus.Corpus, args: argparse.Namespace) -> None:
    db = Database(make_engine(c.url, pool_size=4))
    current.configure(ef_search=args.hybrid_ef_search, vector_memory_mb=args.vector_memory_mb)
    try:
        asked = [
            (q, [float(x) for x in v]) for q, v in corpus.questions(args.queries + args.warm_up, c)
        ]
        questions, warm = asked[: args.queries], asked[args.queries :]
        small = db.transact(
            lambda s: s.execute(
                text("SELECT id FROM assistants WHERE tenant_id = :t AND id <> :a LIMIT 1"),
                {"t": c.tenant_id, "a": uuid.UUID(c.assistant_id)},
            ).scalar_one()
        )
        size = db.transact(lambda s: current.assistant_size(s, c.tenant_id, c.assistant_id))
        walked = current.ef_search_for(size.index_chunks)
        print(
            f"hybrid search, {c.vectors} vectors, {c.scale:,} chunks in the assistant, "
            f"top_k {TOP_K}, {len(questions)} questions ({args.previous_queries} for the "
            f"previous search), ef_search {walked}"
        )
        if args.cold:
            await cold_start(db, c, warm[: args.cold], args.cold_pace)
        # Other questions first, so that the timed ones read from a warm cache; they are also
        # what the server's memory checks the assistant's HNSW walk on, against the copy of
        # its vectors it loads at the first (vector_memory.ASKED_BEFORE_CHECK).
        await time_current(db, c, warm)
        if current.MEMORY is not None:
            settled(current.MEMORY)
            held = current.MEMORY.held_bytes()
            print(
                f"  held in memory: {held / 2**20:.1f} MB (exact search)"
                if held
                else "  held in memory: nothing (HNSW serves: its walk found enough, or the"
                " assistant is larger than --vector-memory-mb)"
            )
        await time_previous(db, c, questions[:3])
        previous = await time_previous(db, c, questions[: args.previous_queries])
        # The previous search ranks every chunk its terms match, and the pages it reads push
        # the current search's out of the buffers: they are read again before the timed
        # questions (at 1M chunks, timed right after it, the hybrid search took 34.0 / 68.6 ms
        # p50 / p95, its parts 16-20 ms a minute later).
        await time_current(db, c, warm)
        now = await time_current(db, c, questions)
        for name, t in (("previous", previous), ("current ", now)):
            print(f"  {name}: p50 {ms(percentile(t, 50))}  p95 {ms(percentile(t, 95))}")
        print(f"  p95 ratio current/previous: {percentile(now, 95) / percentile(previous, 95):.3f}")
        print("  where the time goes (each part alone, one after the other), p50 / p95:")
        for name, t in stage_timings(db, c, questions).items():
            print(f"    {name:7s} {ms(percentile(t, 50))} / {ms(percentile(t, 95))}")

        print(
            "vector recall@10 against exact search (same vectors and filters): the assistant;"
            " a tenth-size one with questions near its own documents, and with the large"
            " one's questions (off its topics, the random-vector case for clustered corpora)"
        )
        chosen = current.EF_SEARCH, current.LARGE_EF_SEARCH
        rq = questions[: args.recall_queries]
        own = list(own_questions(db, str(small), len(rq))) if c.vectors == "clustered" else rq
        sets = [
            (c.assistant_id, rq, f"{c.scale:,}"),
            (str(small), own, f"{c.scale // 10:,} own"),
            (str(small), rq, f"{c.scale // 10:,} off"),
        ]
        if own is rq:
            sets.pop(1)
        sets = [(a, q, label, truths(db, c.tenant_id, a, q)) for a, q, label in sets]
        rows = [("as served", chosen)] + [
            (f"HNSW alone, ef_search {ef:4d}", ef) for ef in args.ef_search
        ]
        memory = current.MEMORY
        for name, ef in rows:
            current.MEMORY = memory if name == "as served" else None
            found = []
            for assistant, qs, label, truth in sets:
                if current.MEMORY is not None:
                    # A check the set before started (its copy judged at its first measured
                    # question) ends first: asked while it ran, the next set's first questions
                    # found no verdict yet to count them unlike, and the check they were to
                    # start began halfway through the measured ones.
                    settled(current.MEMORY)
                    # As many questions as the check of the walk waits for (then judged).
                    asked = vector_memory.ASKED_BEFORE_CHECK
                    recall(db, c.tenant_id, assistant, qs[:asked], truth[:asked], ef)
                    settled(current.MEMORY)
                r, t = recall(db, c.tenant_id, assistant, qs, truth, ef)
                found.append(f"{r:.3f} ({label}, p50 {ms(t)})")
            print(f"  {name}: " + "   ".join(found))
        current.MEMORY = memory
        current.EF_SEARCH, current.LARGE_EF_SEARCH = chosen
        if c.vectors == "real":
            measure_known_items(db, c)
    finally:
        db.dispose()


# Questions a second in --cold: one asker, a few seconds apart per person.
COLD_PACE = 5


async def cold_start(db, c, questions, pace):
    """Recall@10 as served from this process's first question of the assistant on, asked
    `pace` a second (0: back to back), the slowest question, and from which question on its
    vectors were held."""
    truth = truths(db, c.tenant_id, c.assistant_id, questions)
    found, timings, held_from = [], [], None
    began = time.perf_counter()
    for i, ((_, vector), expected) in enumerate(zip(questions, truth, strict=True)):
        held = current.MEMORY is not None and current.MEMORY.held()[1] > 0
        if held and held_from is None:
            held_from = i + 1, time.perf_counter() - began
        asked = time.perf_counter()
        got = await current.served_candidates(db, c.tenant_id, c.assistant_id, vector, 10)
        timings.append(time.perf_counter() - asked)
        found.append(recall_of(got, expected))
        if pace:
            await asyncio.sleep(max(0.0, began + (i + 1) / pace - time.perf_counter()))
    how = f"{pace} a second" if pace else "back to back"
    print(
        f"  from a cold start, {len(questions)} questions {how}: recall@10 as served"
        f" {statistics.fmean(found):.3f}, the first ten {statistics.fmean(found[:10]):.3f};"
        f" the vector search p50 {percentile(timings, 50) * 1000:.1f} ms, the slowest"
        f" {max(timings) * 1000:.0f} ms (question {timings.index(max(timings)) + 1});"
        + (
            f" vectors held from question {held_from[0]} ({held_from[1]:.2f} s)"
            if held_from
            else " vectors not held"
        )
    )


def measure_known_items(db, c):
    items = known_items(db, c, KNOWN_ITEMS)
    embedder = create_embedder()  # questions as the server embeds them
    vectors = [embedder.embed_query(q) for q, _ in items]
    statements = ("TEXT_SQL", "TEXT_FALLBACK_SQL")
    ranked = {name: getattr(current, name) for name in statements}
    assert all(CURRENT_TEXT_RANK in sql.text for sql in ranked.values()), (
        "bench/search.py: the full-text rank changed"
    )
    print(
        f"known items: {len(items)} sentences of the assistant's chunks, each found in its own"
        f" chunk only, asked as questions; how often that chunk comes back"
    )
    own = current.assistant_text_sql  # a large assistant's TEXT_SQL

    for name, rank in (("previous", PREVIOUS_TEXT_RANK), ("current ", CURRENT_TEXT_RANK)):
        for statement, sql in ranked.items():
            setattr(current, statement, text(sql.text.replace(CURRENT_TEXT_RANK, rank)))
        current.assistant_text_sql = lambda assistant_id, rank=rank: text(
            own(assistant_id).text.replace(CURRENT_TEXT_RANK, rank)
        )
        try:
            in_text, in_hybrid, first = known_item_hits(db, c, items, vectors)
        finally:
            for statement, sql in ranked.items():
                setattr(current, statement, sql)
            current.assistant_text_sql = own
        print(
            f"  {name} full-text rank: full text's top {TOP_K} {in_text}, the hybrid's top"
            f" {TOP_K} {in_hybrid}, first {first}"
        )


if __name__ == "__main__":
    asyncio.run(main())
