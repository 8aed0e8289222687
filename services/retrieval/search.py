"""Hybrid search: pgvector cosine and Postgres full-text, fused by reciprocal rank.

The vector query and the text query are independent: `search` runs them at once on two
pooled connections, each outside a transaction, `hybrid_search` one after the other in a
caller's session. Both return
the same chunks. Each query returns its candidates with their provenance, so fusion needs no
third round trip. Ties are broken by stable keys (document name, document sha256, chunk
index), never by the random row ids, so the same question over the same documents ranks the
same way every time. The quality tunables (weights, candidate depth, the per-document cap)
live in fusion.py; the speed tunables are here.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import operator
import time
import uuid
from collections.abc import Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
from pgvector import Vector
from psycopg.adapt import Dumper
from psycopg.pq import Format
from sqlalchemy import Row, TextClause, text

from services.assistants.domain import ROW_VERSION
from services.citations import RetrievedChunk, ScoreKind, SourceLocation, join_heading
from services.db.session import Database, Reader, connection_of, fetch
from services.futures import discard, read_outcome
from services.observability.tracing import traced
from services.retrieval import fusion, indexes, vector_memory
from services.retrieval.fusion import diversify, fuse, normalize_score
from services.retrieval.table_stats import term_frequencies
from services.retrieval.vector_memory import DIGEST, VectorMemory, digest_of

# HNSW keeps this many candidates while it walks the graph. On 100k clustered vectors (shaped
# like embeddings of documents) and the index of migration 0007, recall@10 against exact
# search was 0.96 at 40 and 0.997 at 100. Random unit vectors, where no index helps, reach
# only a fraction at any affordable value; see docs/performance.md. The server takes
# FOOTNOTE_HNSW_EF_SEARCH (`configure`).
EF_SEARCH = 100
# A search that walks an HNSW index of more than LARGE_CHUNKS chunks (the index over every
# chunk in a large table; an assistant's own index is built only up to indexes.MAX_CHUNKS)
# walks it at least LARGE_EF_SEARCH wide. At 1M clustered chunks, recall@10 at 100 depended on
# the build of the index (0.917, 0.965 and 0.995 in three builds of the same corpus: a walk can
# end in another cluster), at 300 it was 0.980 and 0.983 in the two builds measured, for
# 20.3 / 26.2 ms hybrid p50 / p95 against 12.1 / 16.1 at 100.
LARGE_CHUNKS = 500_000
LARGE_EF_SEARCH = 300
# An assistant with at most this many chunks is searched exactly (no HNSW; from the server's
# memory once held there, see MEMORY), which costs about as many vectors' distances as it
# holds: at 10k chunks 28 ms p50 in Postgres, where the assistant's own HNSW index took 5 ms
# for the same recall on questions near its documents. A larger one is
# searched through HNSW: its own index (indexes.py) when it holds a minority of the chunks,
# the index over every chunk when it holds most (a filtered scan of that index over a small
# share of the table finds little); exactly while its own index is being built.
EXACT_MAX_CHUNKS = 5_000
# An assistant is searched exactly, in memory, once its vectors are held there
# (vector_memory.py): one searched through HNSW where its walk misses, a smaller one in place
# of Postgres's exact scan. None, as in tools and tests that do not configure it: never.
MEMORY: VectorMemory | None = None


def _uncounted(path: str) -> None:
    pass


# Told how each vector search was answered ("exact", "index" or "memory"): the server counts
# them (`report_vector_searches`); workers import this module and record no frontend series.
ON_VECTOR_SEARCH: Callable[[str], None] = _uncounted
# How long an assistant's chunk count (and whether its own index is there) is trusted.
CHUNK_COUNT_SECONDS = 60.0
# Full text ranks at most this many matching rows: the question's rarest terms are kept while
# the rows they are expected to match stay within the budget, and the cap bounds a wrong guess
# and a rarest term that alone matches more. Past the cap, the rows ranked are the first ones
# the index gives, not the best: at 1M chunks, where the rarest term of a bench question
# matched 3-4k chunks, a cap of 2,000 took the full-text query to 37 / 52 ms p50 / p95 (each
# row a heap page to read) and 1,000 to 17 / 21 ms; the fused top 8 agreed 0.84 between them
# (0.99 at 100k, where the cap seldom binds). Choosing fewer, better rows than the first ones
# (a conjunction of the rarest terms, say) is the better fix, not yet made.
TEXT_BUDGET_ROWS = 1000
TEXT_CAP_ROWS = 1000
# A smaller assistant's budget is half its chunks (at least the candidates a search wants): it
# kept every term, so a question with a word found in most chunks ranked the whole assistant,
# which was most of a unary Complete's database time on 1,000 chunks. On the labelled set
# (235 chunks, statistics analysed) this ranked as well or slightly better: loc@5 0.926 ->
# 0.944, mrr_loc 0.805 -> 0.815; a quarter of the chunks ranked worse at loc@1.
TEXT_BUDGET_SHARE = 0.5
TEXT_MIN_BUDGET_ROWS = 64
# Candidates are ranked by at most this many of the question's terms, the rarest: ts_rank
# looks each one up in every candidate, and at 100k chunks a question pasted with a page of
# text (4,000 characters) took the full-text query to 25.6 ms with all of its terms, 7.1 with
# 32 (5.7 ranked by the chosen terms alone, before). Questions of up to 32 distinct terms,
# nearly all, rank by every term (the known items of bench/search.py: the same figures).
TEXT_RANK_TERMS = 32
# ... and not by a term found in more than this share of the chunks (unless it is the rarest
# the question has): such a term says little about any one chunk, and a chunk that repeats it
# outranked the one holding the question's rare words. On the labelled set (statistics
# analysed) loc@1 0.778 -> 0.815, loc@5 0.926 -> 0.944, mrr_loc 0.850 -> 0.877; the known
# items of bench/search.py within one either way.
TEXT_RANK_MAX_SHARE = 0.1

# A candidate's columns: its chunk's and its document's (to_retrieved reads them by name).
CHUNK_COLUMNS = (
    "id", "document_id", "chunk_index", "text", "start_offset", "end_offset", "start_byte",
    "end_byte", "start_line", "end_line", "page_start", "page_end", "paragraph_start",
    "paragraph_end", "heading_path", "line_marks",
)  # fmt: skip
DOCUMENT_COLUMNS = ("display_name", "content_type", "sha256", "indexed_time")


def columns(names: Sequence[str], table: str) -> str:
    return ", ".join(f"{table}.{name}" for name in names)


CANDIDATE_COLUMNS = f"{columns(CHUNK_COLUMNS, 'c')}, {columns(DOCUMENT_COLUMNS, 'd')}"

# A document is searched unless an older READY document of the same assistant holds the same
# bytes: uploading a file twice must not fill the sources with the same passages twice.
SERVABLE = """
      d.state = 'READY' AND d.delete_time IS NULL
      AND NOT EXISTS (
        SELECT 1 FROM documents older
        WHERE older.assistant_id = d.assistant_id AND older.sha256 = d.sha256
          AND older.state = 'READY' AND older.delete_time IS NULL
          AND (older.create_time, older.id) < (d.create_time, d.id)
      )
"""
SEARCHABLE = f"""
      c.tenant_id = :tenant AND c.assistant_id = :assistant AND {SERVABLE}
"""

# relaxed_order: filtering after an HNSW scan can leave too few rows, so the scan keeps going;
# rows may come slightly out of order.
ITERATIVE_SCAN = "relaxed_order"
# The HNSW settings are set in one round trip: for the transaction (:local true), or once per
# connection for reads outside a transaction (they matter only to HNSW scans, which only this
# module runs).
SEARCH_SETTINGS_SQL = text(
    "SELECT set_config('hnsw.ef_search',"
    " coalesce(:ef_search, current_setting('hnsw.ef_search', true), '40'), :local),"
    " set_config('hnsw.iterative_scan', :iterative_scan, :local)"
)

VECTOR_SQL = text(
    f"""
    SELECT {CANDIDATE_COLUMNS}, 1 - (c.embedding <=> CAST(:query AS vector)) AS similarity
    FROM chunks c JOIN documents d ON d.id = c.document_id
    WHERE {SEARCHABLE}
    ORDER BY c.embedding <=> CAST(:query AS vector)
    LIMIT :limit
    """
)

# Exact search: the ORDER BY sits outside a subquery that OFFSET 0 keeps apart, so the planner
# cannot answer it from the HNSW index; the assistant's rows come through a bitmap scan. Only
# ids and distances are sorted, and the columns are read for the winners alone.
EXACT_VECTOR_SQL = text(
    f"""
    WITH nearest AS MATERIALIZED (
      SELECT id, distance FROM (
        SELECT c.id, c.embedding <=> CAST(:query AS vector) AS distance
        FROM chunks c JOIN documents d ON d.id = c.document_id
        WHERE {SEARCHABLE}
        OFFSET 0
      ) searchable
      ORDER BY distance
      LIMIT :limit
    )
    SELECT {CANDIDATE_COLUMNS}, 1 - n.distance AS similarity
    FROM nearest n JOIN chunks c ON c.id = n.id JOIN documents d ON d.id = c.document_id
    """
)

# The chunks found in memory (vector_memory.py), ranked by their stored vectors, the best
# :limit with their columns, and the digest of the assistant's documents now: the copy they
# were found in is the assistant's only while the digest is the copy's. Ties at the cut are all
# kept (vector_candidates orders them by stable keys), whatever order the copy was loaded in.
# The chunks' columns are taken as their rows are read for the distances: read again for the
# best :limit by id, the statement took 0.1-0.2 ms more at 100k chunks (3.30 against 3.08 and
# 3.04 against 2.94 ms p50; two runs of 240 and 280 sets of 128 candidates, each statement in
# turn with 25 ms pauses; the same rows).
HELD_VECTOR_SQL = text(
    f"""
    WITH now AS MATERIALIZED ({DIGEST}), nearest AS MATERIALIZED (
      SELECT {columns(CHUNK_COLUMNS, "c")}, c.embedding <=> CAST(:query AS vector) AS distance
      FROM chunks c
      WHERE c.id = ANY(CAST(:ids AS uuid[]))
        AND c.tenant_id = :tenant AND c.assistant_id = :assistant
      ORDER BY distance FETCH FIRST :limit ROWS WITH TIES
    )
    SELECT {columns(CHUNK_COLUMNS, "n")}, {columns(DOCUMENT_COLUMNS, "d")},
           1 - n.distance AS similarity, w.digest
    FROM nearest n JOIN documents d ON d.id = n.document_id
    CROSS JOIN now w
    """
)

CHUNK_COUNT_SQL = text(
    f"""
    SELECT coalesce(sum(d.chunk_count), 0) AS chunks,
           ({indexes.EVERYONE}) AS everyone,
           EXISTS ({indexes.VALID}) AS own_index
    FROM documents d
    WHERE d.tenant_id = :tenant AND d.assistant_id = :assistant
      AND d.state = 'READY' AND d.delete_time IS NULL
    """
)

# The question's terms as the index stores them, rarest first: each term's share of chunks
# is looked up in :common / :shares (pg_stats' for the lexemes the question may hold:
# table_stats.TermShares.of), any other term's is :floor. Terms are
# kept while the chunks they are expected to match (the running sum of share * :chunks) stay
# within :budget, and the rarest is always kept: a term in most chunks says little about any
# one of them, and ranking every chunk it matches is what made full text slow. Chosen in the
# query itself, which saves a round trip; the kept terms are OR-ed into a tsquery (`terms`),
# each quoted so that tsquery input takes it as it is, and so is every term (`every`): the
# kept terms choose the candidates, every term ranks them (within the limits below).
CHOSEN_TERMS = r"""
    lexemes AS (
      SELECT t.term, coalesce(f.share, :floor) AS share
      FROM unnest(tsvector_to_array(to_tsvector('english', :query))) AS t(term)
      LEFT JOIN unnest(CAST(:common AS text[]), CAST(CAST(:shares AS real[]) AS float8[]))
        AS f(term, share)
        ON f.term = t.term
    ), ranked AS (
      SELECT chr(39) || replace(replace(term, chr(92), chr(92) || chr(92)),
                                chr(39), chr(39) || chr(39)) || chr(39) AS quoted,
             share, row_number() OVER w AS n, sum(share * :chunks) OVER w AS expected
      FROM lexemes WINDOW w AS (ORDER BY share, term COLLATE "C")
    ), chosen AS (
      SELECT CAST(string_agg(quoted, ' | ' ORDER BY n)
                    FILTER (WHERE n = 1 OR expected <= :budget) AS tsquery) AS terms,
             CAST(string_agg(quoted, ' | ' ORDER BY n)
                    FILTER (WHERE n = 1 OR n <= :rank_terms AND share <= :rank_share)
                    AS tsquery) AS every
      FROM ranked
    )
"""
CHOSEN_TERMS_SQL = text(f"WITH {CHOSEN_TERMS} SELECT CAST(terms AS text) FROM chosen")


# The chosen terms, OR-ed: a chunk sharing any of them is a candidate. A candidate's rank is
# ts_rank over the chosen terms plus ts_rank over the question's terms (`every`: the 32 rarest,
# none in over a tenth of the chunks), so the chosen terms count twice and the others once. Ranked
# by the chosen terms alone, as before, a chunk that also held the common ones ranked no better
# than one that did not: at 100k chunks of manual pages, a sentence's own chunk came in full
# text's top 8 for 25 of 70 sentences found in one chunk only, now for 66, at the same cost
# (docs/quality.md, "Full-text ranking", with the variants tried). At most :cap of the assistant's
# matching chunks are ranked. The title and headings are weighted 'A', the text 'D'
# (fusion.TEXT_RANK_WEIGHTS). assistant: the right-hand side of the assistant's filter, its
# parameter or one assistant's id (assistant_text_sql).
def text_matches(assistant: str = ":assistant") -> str:
    return f"""
    WITH {CHOSEN_TERMS}, matches AS MATERIALIZED (
      SELECT c.id, c.document_id, c.chunk_index, c.start_offset,
             ts_rank(CAST(:weights AS float4[]), c.tsv, (SELECT terms FROM chosen))
             + ts_rank(CAST(:weights AS float4[]), c.tsv, (SELECT every FROM chosen)) AS rank
      FROM chunks c
      WHERE c.tenant_id = :tenant AND c.assistant_id = {assistant}
        AND c.tsv @@ (SELECT terms FROM chosen)
      LIMIT :cap
    )"""


# Only the best :depth matches are looked up in `documents` for the filters: joining every match
# with its document built a hash of all the assistant's documents per search (1.7 of 13 ms at
# 100k chunks, growing with the document count). Equal ranks (common: ts_rank does not weigh a
# chunk's length) are ordered by the chunk's place in its document, then by the document's name
# and digest, never by ids: keys that the same files give whatever the upload order. Provenance
# is read for the best :limit only. The leading matches' documents are filtered once each
# (`servable`), not once per match (on the 1,000-chunk bench corpus, whose matches come from a
# few documents, the filters were a tenth of the query's CPU), and all in one scan: their ids as
# one array, so the planner weighs them together. Joined instead, it read every document of the
# table into a hash for about 80 rows (0.2-0.3 ms at 1,176 documents, growing with their
# count). Looked up one by one (LATERAL), it priced each lookup alone: on a small table (120
# documents) two sequential scans a document, 70 documents 5.8 ms of a 6.9 ms query. With the
# array, the ids are read through the primary key and older copies looked for through
# (assistant_id, sha256) on a large table (97,200 documents), and a small one is scanned once:
# at 10k chunks and 120 documents the query took 2.7 against 8.1 ms p50; at 100k chunks 5.8
# against 5.5 with 1,200 documents, 6.0 against 5.6 with 49,200; the same rows every time. The
# first row always comes (a row of nulls when no match is servable) and says, in `more`,
# whether matches past the leading ones were ranked: text_candidates then knows when
# TEXT_FALLBACK_SQL is needed. It also carries, for the answer that searches (chat.early), the
# version of the assistant's row (`assistant_version`, null when there is none), to tell
# whether the settings it remembers are still the assistant's, and whether an answer is stored
# for the request's request_id (`answered`; never, when :request_id is null), which the answer
# would replay: with neither, it reads nothing but the search.
def text_sql(assistant: str = ":assistant") -> TextClause:
    return text(
        f"""
    {text_matches(assistant)}, front AS MATERIALIZED (
      SELECT * FROM matches ORDER BY rank DESC, chunk_index, start_offset
      FETCH FIRST :depth ROWS WITH TIES
    ), servable AS MATERIALIZED (
      SELECT d.id, d.display_name, d.sha256 FROM documents d
      WHERE d.id = ANY(ARRAY(SELECT DISTINCT document_id FROM front)) AND {SERVABLE}
    ), best AS MATERIALIZED (
      SELECT m.id, m.rank, m.chunk_index, m.start_offset, d.display_name, d.sha256
      FROM front m JOIN servable d ON d.id = m.document_id
      ORDER BY m.rank DESC, m.chunk_index, m.start_offset, d.display_name, d.sha256 LIMIT :limit
    )
    SELECT {CANDIDATE_COLUMNS}, k.rank, f.more, f.assistant_version, f.answered
    FROM (
      SELECT (SELECT count(*) FROM matches) > (SELECT count(*) FROM front) AS more,
             (SELECT a.{ROW_VERSION} FROM assistants a
              WHERE a.id = :assistant AND a.tenant_id = :tenant) AS assistant_version,
             EXISTS (SELECT 1 FROM messages m
                     WHERE m.tenant_id = :tenant AND m.request_id = :request_id
                       AND m.role = 'assistant') AS answered
    ) f
    LEFT JOIN (best k JOIN chunks c ON c.id = k.id JOIN documents d ON d.id = c.document_id)
      ON true
    ORDER BY k.rank DESC, k.chunk_index, k.start_offset, k.display_name, k.sha256
    """
    )


TEXT_SQL = text_sql()

# The large assistants whose full-text statement (assistant_text_sql) a process keeps. Each
# connection keeps psycopg's 100 most recently prepared statements; Postgres, each one's plan.
TEXT_STATEMENTS = 1024


@functools.lru_cache(maxsize=TEXT_STATEMENTS)
def assistant_text_sql(assistant_id: uuid.UUID) -> TextClause:
    """TEXT_SQL for one large assistant, its id written into the statement (see planned_once)."""
    return text_sql(f"CAST('{assistant_id}' AS uuid)")


# Should the filters leave fewer than :limit of the leading matches while more were ranked,
# every ranked match is filtered instead, so the rows are the ones ranking all servable matches
# gives (duplicate uploads filling the leading matches, say). In TEXT_SQL, as a branch that ran
# only then, this was planned (and its condition computed) for every search: 0.6-0.9 ms of the
# full-text query at 10k-1M chunks, 9% at 100k; on its own it costs a second round trip when due.
TEXT_FALLBACK_SQL = text(
    f"""
    {text_matches()}
    SELECT {CANDIDATE_COLUMNS}, m.rank
    FROM matches m JOIN chunks c ON c.id = m.id JOIN documents d ON d.id = m.document_id
    WHERE {SERVABLE}
    ORDER BY m.rank DESC, m.chunk_index, m.start_offset, d.display_name, d.sha256 LIMIT :limit
    """
)

# Matches looked up in `documents` before the fallback is needed, per candidate wanted.
TEXT_DEPTH_PER_CANDIDATE = 2
TEXT_RANK_WEIGHTS = "{" + ",".join(str(w) for w in fusion.TEXT_RANK_WEIGHTS) + "}"


def vector_literal(vector: Sequence[float]) -> str:
    return "[" + ",".join(repr(float(x)) for x in vector) + "]"


def uuid_array(ids: Sequence[str]) -> str:
    """Chunk ids, each its 32 hex digits, as one uuid[] literal. Given the list, psycopg checks
    every element for characters to quote: 0.41 ms for the 128 ids of a held search, on the
    first delta's path, against 4 us for the literal (hex digits need no quoting)."""
    return "{" + ",".join(ids) + "}"


class QueryVector:
    """A question's vector as a query parameter, sent in pgvector's binary format.

    Written as text, 384 floats took 0.15 ms in Python and more to parse in Postgres: 0.2 ms
    of CPU a vector query, on the first delta's critical path. The values are the model's
    float32s either way, so the distances are the same.
    """

    __slots__ = ("values",)

    def __init__(self, values: Sequence[float]) -> None:
        self.values = values


class _QueryVectorDumper(Dumper):
    format = Format.BINARY
    # The vector type's oid differs from database to database; 0 leaves the type to the
    # statement, where every vector parameter is CAST(... AS vector).
    oid = 0

    def dump(self, obj: QueryVector) -> bytes:
        return Vector(obj.values).to_binary()


def vector_parameter(s: Reader, vector: Sequence[float]) -> QueryVector:
    """The vector as a parameter of the read's next statement, its connection told once how
    to send it (psycopg's global adapters reach only connections opened after a change)."""
    conn = connection_of(s)
    if not conn.info.get("query_vector"):
        conn.connection.driver_connection.adapters.register_dumper(QueryVector, _QueryVectorDumper)
        conn.info["query_vector"] = True
    return QueryVector(vector)


def candidate_limit(top_k: int) -> int:
    return max(fusion.MIN_CANDIDATES, fusion.CANDIDATES_PER_RESULT * top_k)


def vector_candidates(
    s: Reader,
    tenant_id: str,
    assistant_id: str,
    query_vector: Sequence[float],
    limit: int,
    *,
    waited: bool = False,
) -> list[Row[Any]]:
    """The nearest chunks by cosine, most similar first. waited: the question was asked once
    already, and found the assistant's copy on its way (start_search)."""
    rows = nearest_unless_coming(
        s, tenant_id, assistant_id, query_vector, limit, walk=True, waited=waited
    )
    assert rows is not None  # only a search that will not walk is told to wait
    return rows


def nearest_unless_coming(
    s: Reader,
    tenant_id: str,
    assistant_id: str,
    query_vector: Sequence[float],
    limit: int,
    *,
    walk: bool = False,
    waited: bool = False,
) -> list[Row[Any]] | None:
    """vector_candidates; without walk, None instead of a walk of HNSW when the assistant's
    copy in memory is on its way and worth waiting for (VectorMemory.coming)."""
    size = assistant_size(s, tenant_id, assistant_id)
    rows = held_candidates(s, tenant_id, assistant_id, size, query_vector, limit, waited=waited)
    path = "memory" if rows is not None else "exact" if size.exact else "index"
    wait = rows is None and path == "index" and not walk and MEMORY is not None
    if wait and MEMORY.coming(connection_of(s).engine, tenant_id, assistant_id) is not None:
        return None
    if rows is None:
        rows = stored_candidates(s, tenant_id, assistant_id, size, query_vector, limit)
        if path == "index" and MEMORY is not None and rows:
            best = max(float(r.similarity) for r in rows)
            MEMORY.walked(connection_of(s).engine, tenant_id, assistant_id, best)
    ON_VECTOR_SEARCH(path)
    # relaxed_order may return rows slightly out of order; the ranking must be exact.
    most_similar_first = [-r.similarity for r in rows]
    order = sorted(range(len(rows)), key=most_similar_first.__getitem__)
    order = ties_broken(order, most_similar_first.__getitem__, lambda n: stable_key(rows[n]))
    return [rows[n] for n in order[:limit]]


def stored_candidates(
    s: Reader,
    tenant_id: str,
    assistant_id: str,
    size: AssistantSize,
    query_vector: Sequence[float],
    limit: int,
) -> list[Row[Any]]:
    """The nearest chunks by exact search or HNSW in Postgres, as the assistant's size says."""
    use_search_settings(s, ef_search_for(size.index_chunks))
    return fetch(
        s,
        EXACT_VECTOR_SQL if size.exact else VECTOR_SQL,
        {
            "tenant": tenant_id,
            "assistant": uuid.UUID(assistant_id),
            "query": vector_parameter(s, query_vector),
            "limit": limit,
        },
        prepare=planned_once(size),
    )


def index_walk(
    s: Reader, tenant_id: str, assistant_id: str, query_vector: Sequence[float], limit: int
) -> list[float]:
    """The cosines of the chunks the vector query finds through HNSW (vector_memory.Walk)."""
    size = assistant_size(s, tenant_id, assistant_id)
    hnsw = AssistantSize(size.chunks, exact=False, index_chunks=size.index_chunks)
    rows = stored_candidates(s, tenant_id, assistant_id, hnsw, query_vector, limit)
    return [float(r.similarity) for r in rows]


def held_candidates(
    s: Reader,
    tenant_id: str,
    assistant_id: str,
    size: AssistantSize,
    query_vector: Sequence[float],
    limit: int,
    *,
    waited: bool = False,
) -> list[Row[Any]] | None:
    """The nearest chunks by exact search over the assistant's vectors in memory, unordered;
    None when they are not held (a load is started if they fit, unless the question waited for
    one) or the copy is stale."""
    if MEMORY is None:
        return None
    engine = connection_of(s).engine
    query = np.asarray(query_vector, dtype=np.float32)
    held = MEMORY.get(
        engine, tenant_id, assistant_id, size.chunks, query, exact=size.exact, again=waited
    )
    if held is None or held.dim != len(query):
        return None
    ids = held.candidates(query, limit)
    if not ids:
        return None
    rows = fetch(
        s,
        HELD_VECTOR_SQL,
        {
            "tenant": tenant_id,
            "assistant": uuid.UUID(assistant_id),
            "ids": uuid_array(ids),
            "query": vector_parameter(s, query_vector),
            "limit": limit,
        },
        # Prepared, unlike a large assistant's other statements (planned_once): its plan (rows
        # looked up by id, the documents' digest) does not depend on the values, so Postgres
        # may keep one. Planned each time, it took 6.5 against 4.9 ms p50 (9.0 against 6.3 ms
        # p95) at 100k chunks, the same rows for 260 questions.
        prepare=True,
    )
    if not rows or digest_of(rows[0]) != held.digest:
        held.stale = True  # the next search starts a fresh load, if none ran lately
        return None
    return rows


def configure(*, ef_search: int, vector_memory_mb: int = 0) -> None:
    """This process's HNSW search breadth (each pooled connection takes it on its next search)
    and the memory it may hold assistants' vectors in (0: none)."""
    global EF_SEARCH, MEMORY
    EF_SEARCH = ef_search
    if MEMORY is not None:
        MEMORY.close()
    MEMORY = None
    if vector_memory_mb > 0:
        MEMORY = VectorMemory(vector_memory_mb * 2**20, SEARCHABLE, index_walk)


def report_vector_searches(to: Callable[[str], None]) -> None:
    """Has `to` told how each vector search of this process is answered."""
    global ON_VECTOR_SEARCH
    ON_VECTOR_SEARCH = to


def memory_held() -> tuple[int, int]:
    """The bytes and the assistants held in memory for exact search."""
    return (0, 0) if MEMORY is None else MEMORY.held()


def ef_search_for(index_chunks: int) -> int:
    """The HNSW search breadth for a walk of an index over this many chunks."""
    return max(EF_SEARCH, LARGE_EF_SEARCH) if index_chunks > LARGE_CHUNKS else EF_SEARCH


def use_search_settings(s: Reader, ef_search: int) -> None:
    """ef_search and iterative scans for the session's next vector search.

    In a transaction they are set for it alone. Outside one (`Database.read`) they are set for
    the connection, once: the connection remembers what it was given.
    """
    wanted = {"ef_search": str(ef_search), "iterative_scan": ITERATIVE_SCAN}
    conn = connection_of(s)
    if conn.get_execution_options().get("isolation_level") != "AUTOCOMMIT":
        conn.execute(SEARCH_SETTINGS_SQL, {**wanted, "local": True})
        return
    if conn.info.get("search") != wanted:
        conn.execute(SEARCH_SETTINGS_SQL, {**wanted, "local": False})
        conn.info["search"] = wanted


def planned_once(size: AssistantSize) -> bool:
    """Whether the assistant's searches may share one plan, or each is planned for its values.

    A search's statement is prepared on its connection (psycopg's prepare=True) and Postgres
    then plans it once for any values when that plan costs no more: for the assistants
    searched exactly, whose few thousand chunks cost the same whatever the plan, planning each
    search was a third of the full-text query's CPU (1.1 of 3.4 ms at 1,000 chunks) and a
    quarter of the vector query's. A larger assistant's vector statements are never prepared
    (but for the read of the candidates found in memory, held_candidates), so each is planned
    for its own values: only then is an assistant's own HNSW index (a partial one, indexes.py)
    seen to serve it. Its full-text statement is prepared with the assistant's id written in
    (assistant_text_sql): the plan depends on the assistant's share of the table (through the
    full-text index alone for a large share; with the assistant's rows, ANDed, for a small
    one), and one plan for every assistant chose the AND for a large one and took 20.3 against
    13.9 ms p50 (29.5 against 19.9 ms p95) at 100k chunks. With the id known, the plan Postgres
    keeps is the one it chooses for that assistant each time, and planning it each time was
    1.1-1.4 ms of the statement's CPU at 100k chunks.
    """
    return size.chunks <= EXACT_MAX_CHUNKS


@dataclass(frozen=True)
class TextCandidates:
    rows: list[Row[Any]]
    # The version of the assistant's row (ROW_VERSION) in the statement's snapshot; None when
    # the row was not there or no statement ran.
    assistant_version: int | None = None
    # Whether an answer was stored for the request_id given (TEXT_SQL's `answered`).
    answered: bool = False


def text_candidates(
    s: Reader, tenant_id: str, assistant_id: str, query: str, limit: int
) -> list[Row[Any]]:
    """The chunks that share the question's rarest terms, best first (ranked by those terms
    and by all the question's terms)."""
    return text_search(s, tenant_id, assistant_id, query, limit).rows


def text_search(
    s: Reader, tenant_id: str, assistant_id: str, query: str, limit: int, request_id: str = ""
) -> TextCandidates:
    """text_candidates, with the version of the assistant's row that the search saw and
    whether an answer is stored for request_id."""
    if not query.strip():
        return TextCandidates([])
    size = assistant_size(s, tenant_id, assistant_id)
    params = {
        **term_choice(s, tenant_id, assistant_id, query, size.chunks),
        "tenant": tenant_id,
        "assistant": uuid.UUID(assistant_id),
        "weights": TEXT_RANK_WEIGHTS,
        "cap": TEXT_CAP_ROWS,
        "depth": TEXT_DEPTH_PER_CANDIDATE * limit,
        "limit": limit,
        "request_id": request_id or None,
    }
    shared = planned_once(size)
    statement = TEXT_SQL if shared else assistant_text_sql(params["assistant"])
    rows = fetch(s, statement, params, prepare=True)
    first = rows[0]
    if first.id is None:  # no leading match is servable
        rows = []
    if len(rows) < limit and first.more:
        rows = fetch(s, TEXT_FALLBACK_SQL, params, prepare=shared)
    version = None if first.assistant_version is None else int(first.assistant_version)
    return TextCandidates(rows, version, bool(first.answered))


def term_choice(
    s: Reader,
    tenant_id: str,
    assistant_id: str,
    query: str,
    chunks: int | None = None,
    budget: int = TEXT_BUDGET_ROWS,
) -> dict[str, Any]:
    """The parameters of CHOSEN_TERMS: the question, the term statistics and the budget (the
    assistant's chunks, when not given, are looked up)."""
    stats = term_frequencies(s)
    common, shares = stats.of(query)
    if chunks is None:
        chunks = assistant_chunks(s, tenant_id, assistant_id)
    budget = min(budget, max(TEXT_MIN_BUDGET_ROWS, int(chunks * TEXT_BUDGET_SHARE)))
    return {
        "query": query,
        "common": common,
        "shares": shares,
        "floor": stats.floor,
        "chunks": chunks,
        "budget": budget,
        "rank_terms": TEXT_RANK_TERMS,
        "rank_share": TEXT_RANK_MAX_SHARE,
    }


@dataclass(frozen=True)
class AssistantSize:
    chunks: int  # in the assistant's READY documents
    exact: bool  # whether its vector search is exact rather than through HNSW
    index_chunks: int  # the chunks in the HNSW index it walks (its own, or every chunk); 0: none


_sizes: dict[tuple[str, str, str], tuple[float, AssistantSize]] = {}


def assistant_size(s: Reader, tenant_id: str, assistant_id: str) -> AssistantSize:
    """How many chunks the assistant holds and how it is searched, cached for a minute.

    Only chooses how to search (exact or HNSW, which terms to rank): a stale answer changes
    the cost of a search, not which documents it may return.
    """
    key = (str(connection_of(s).engine.url), tenant_id, assistant_id)
    now = time.monotonic()
    cached = _sizes.get(key)
    if cached is not None and cached[0] > now:
        return cached[1]
    row = s.execute(
        CHUNK_COUNT_SQL,
        {
            "tenant": tenant_id,
            "assistant": uuid.UUID(assistant_id),
            "index": indexes.index_name(assistant_id),
        },
    ).one()
    chunks = int(row.chunks)
    waiting = not row.own_index and indexes.wanted(chunks, row.everyone, EXACT_MAX_CHUNKS)
    exact = chunks <= EXACT_MAX_CHUNKS or waiting
    if exact:
        walked = 0
    elif row.own_index:
        walked = chunks
    else:
        walked = int(float(row.everyone or 0))
    size = AssistantSize(chunks, exact=exact, index_chunks=walked)
    if len(_sizes) > 10_000:
        _sizes.clear()
    _sizes[key] = (now + CHUNK_COUNT_SECONDS, size)
    return size


def assistant_chunks(s: Reader, tenant_id: str, assistant_id: str) -> int:
    return assistant_size(s, tenant_id, assistant_id).chunks


def stable_key(row: Row[Any]) -> tuple[str, str, int]:
    return (row.display_name, row.sha256, row.chunk_index)


K = TypeVar("K", bound=Hashable)


def ties_broken(ranked: list[K], score: Callable[[K], Any], tie_key: Callable[[K], Any]) -> list[K]:
    """ranked (sorted by score) with each run of equal scores sorted by tie_key, which is
    computed for tied items only: ties are few, and reading every candidate's name, digest and
    place took `rank` from 0.21 to 0.34 ms for 128 candidates. Most rankings have none, and
    are returned as they are after one comparison of neighbours."""
    scores = list(map(score, ranked))
    if not any(map(operator.eq, scores, scores[1:])):
        return ranked
    out: list[K] = []
    for _, run in itertools.groupby(ranked, key=score):
        tied = list(run)
        out.extend(sorted(tied, key=tie_key) if len(tied) > 1 else tied)
    return out


def rank(
    vector_rows: Sequence[Row[Any]],
    text_rows: Sequence[Row[Any]],
    top_k: int,
    score_threshold: float,
) -> list[RetrievedChunk]:
    """Fuses the two candidate lists into the best top_k chunks, best first, at most
    fusion.MAX_PER_DOCUMENT of one document while another matches well.

    Candidates are keyed by their ids' integers: hashing a uuid.UUID runs Python code, and
    a search hashes its hundred-odd candidates several hundred times (a third of fusion's time).
    """
    vector_ids = [r.id.int for r in vector_rows]
    text_ids = [r.id.int for r in text_rows]
    similarity = {i: float(r.similarity) for i, r in zip(vector_ids, vector_rows, strict=True)}
    rows = dict(zip(text_ids, text_rows, strict=True))
    rows.update(zip(vector_ids, vector_rows, strict=True))
    fused = fuse([vector_ids, text_ids], weights=(fusion.VECTOR_WEIGHT, fusion.TEXT_WEIGHT))
    score = {i: (-f, -similarity.get(i, -1.0)) for i, f in fused.items()}
    ranked = ties_broken(
        sorted(fused, key=score.__getitem__), score.__getitem__, lambda i: stable_key(rows[i])
    )
    passing = ranked
    if score_threshold > 0:
        passing = [
            i for i in ranked if normalize_score(fused[i], ScoreKind.FUSED) >= score_threshold
        ]
    kept = diversify(
        passing, lambda i: rows[i].document_id, lambda i: similarity.get(i, 0.0), top_k
    )
    return [to_retrieved(rows[i], normalize_score(fused[i], ScoreKind.FUSED)) for i in kept]


def hybrid_search(
    s: Reader,
    *,
    tenant_id: str,
    assistant_id: str,
    query: str,
    query_vector: Sequence[float],
    top_k: int,
    score_threshold: float = 0.0,
) -> list[RetrievedChunk]:
    """The best chunks of one assistant's READY documents, best first, with provenance."""
    limit = candidate_limit(top_k)
    vector_rows = vector_candidates(s, tenant_id, assistant_id, query_vector, limit)
    text_rows = text_candidates(s, tenant_id, assistant_id, query, limit)
    return rank(vector_rows, text_rows, top_k, score_threshold)


@dataclass(frozen=True)
class Search:
    """A hybrid search under way (`start_search`): its full-text statement, whose outcome
    comes first and also tells what the search saw of the assistant and the request
    (TextCandidates), and the chunks it finds."""

    text: asyncio.Future[TextCandidates]
    chunks: asyncio.Future[list[RetrievedChunk]]

    def cancel(self) -> None:
        """Lets the search go; a failure either part had is not reported as never retrieved."""
        discard(self.chunks)
        discard(self.text)


def start_search(
    db: Database,
    *,
    tenant_id: str,
    assistant_id: str,
    query: str,
    query_vector: Awaitable[Sequence[float]],
    top_k: int,
    score_threshold: float = 0.0,
    request_id: str = "",
) -> Search:
    """hybrid_search with its two queries running at once on two connections, started.

    Each runs outside a transaction (`Database.autocommit`): they only read, and BEGIN and COMMIT
    were two of a query's three round trips. The vector is awaited here, so the full-text
    query can run while it is being computed. request_id: the request's, whose stored answer
    the full-text statement looks for (TextCandidates.answered).
    """
    limit = candidate_limit(top_k)

    async def nearest() -> list[Row[Any]]:
        vector = await query_vector
        return await traced(
            "retrieval.vector", served_candidates(db, tenant_id, assistant_id, vector, limit)
        )

    # The full-text query is handed to its thread first. With the vector already known (a
    # recent question's), the vector search's thread took the interpreter lock before the
    # event loop had started the full-text query, whose round trip then began up to 4 ms
    # late. Handed over first, it made the hybrid search faster by 0.15 and 0.29 ms at 100k
    # chunks (paired medians of two runs of 600 questions; p95 -0.2 and -0.8 ms) and by
    # 0.32 ms at 1M clustered chunks, where the vector search through HNSW is the longer.
    lexical = asyncio.ensure_future(
        traced(
            "retrieval.text",
            db.run_autocommit(
                lambda conn: text_search(conn, tenant_id, assistant_id, query, limit, request_id)
            ),
        )
    )
    # Read when the chunks fail first, so that asyncio does not report its failure as lost.
    lexical.add_done_callback(read_outcome)

    async def chunks() -> list[RetrievedChunk]:
        vector_rows = await nearest()
        return rank(vector_rows, (await lexical).rows, top_k, score_threshold)

    return Search(lexical, asyncio.ensure_future(chunks()))


async def served_candidates(
    db: Database, tenant_id: str, assistant_id: str, vector: Sequence[float], limit: int
) -> list[Row[Any]]:
    """vector_candidates as a question is served: one that finds the assistant's copy on its
    way waits for it (`copy_loaded`) rather than walk the HNSW index, and asks again."""
    found = await db.run_autocommit(
        lambda conn: nearest_unless_coming(conn, tenant_id, assistant_id, vector, limit)
    )
    if found is not None:
        return found
    await copy_loaded(db, tenant_id, assistant_id)
    return await db.run_autocommit(
        lambda conn: vector_candidates(conn, tenant_id, assistant_id, vector, limit, waited=True)
    )


async def copy_loaded(db: Database, tenant_id: str, assistant_id: str) -> None:
    """Returns once the load under way of the assistant's copy has ended, or after
    vector_memory.WAIT_SECONDS, whichever comes first; a failed load is the loader's to log."""
    coming = None if MEMORY is None else MEMORY.coming(db.engine, tenant_id, assistant_id)
    if coming is not None:
        # asyncio.wait neither raises the load's outcome nor cancels it at the timeout.
        await asyncio.wait({asyncio.wrap_future(coming)}, timeout=vector_memory.WAIT_SECONDS)


def to_retrieved(r: Row[Any], score: float) -> RetrievedChunk:
    """A candidate row as the citation engine's input."""
    return RetrievedChunk(
        chunk_id=str(r.id),
        document_id=str(r.document_id),
        document_name=r.display_name,
        content_type=r.content_type,
        chunk_index=r.chunk_index,
        text=r.text,
        score=score,
        score_kind=ScoreKind.FUSED,
        location=SourceLocation(
            start_offset=r.start_offset,
            end_offset=r.end_offset,
            start_line=r.start_line,
            end_line=r.end_line,
            page_start=r.page_start or 0,
            page_end=r.page_end or 0,
            heading=join_heading(r.heading_path or ()),
            start_byte=r.start_byte or 0,
            end_byte=r.end_byte or 0,
            paragraph_start=r.paragraph_start or 0,
            paragraph_end=r.paragraph_end or 0,
        ),
        document_sha256=r.sha256,
        indexed_time=r.indexed_time,
        line_marks=tuple(r.line_marks or ()),
    )
