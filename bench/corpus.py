"""A synthetic corpus at scale for the retrieval benchmarks, built once and kept on disk.

Postgres runs from the embedded stack in a state directory of its own (default
/tmp/fnbench, override with FOOTNOTE_BENCH_STATE), one database per scale (bench_10000, ...).
Building a scale loads the chunks without the HNSW index, then builds the index and analyses;
later runs find the database ready and only start Postgres (about a second).

The corpus: one target assistant holding `scale` chunks in documents of 100 chunks, 2% of them
in documents that are not READY or were deleted (the filters must drop them), plus two
distractor assistants (one in the same tenant, one in another) of scale / 10 chunks each.
Vectors are random unit vectors (the hard case for HNSW). Text is pseudo-words drawn from a
Zipf distribution, so a question mixes very common terms (in a large share of the chunks)
with rare ones, as natural language does.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import psycopg
from pgvector.psycopg import register_vector

from devstack.stack import EmbeddedStack
from services.db import migrate

DIM = 384
CHUNKS_PER_DOCUMENT = 100
WORDS_PER_CHUNK = 60
VOCABULARY = 20_000
ZIPF_S = 1.07
TENANT = "bench"
OTHER_TENANT = "bench-other"
SEED = 13
BATCH = 20_000
SHARED_BUFFERS = "1GB"


@dataclass(frozen=True)
class Corpus:
    url: str  # postgresql:// URL of the scale's database
    scale: int
    tenant_id: str
    assistant_id: str


def state_dir() -> Path:
    return Path(os.environ.get("FOOTNOTE_BENCH_STATE", "/tmp/fnbench"))


def start_postgres() -> EmbeddedStack:
    """Postgres only: the broker and S3 are configured as placeholders that nothing contacts."""
    stack = EmbeddedStack(
        state_dir(),
        broker_url="redis://127.0.0.1:1/0",
        s3_endpoint="http://127.0.0.1:1",
        s3_access_key="unused",
        s3_secret_key="unused",
    )
    return tuned(stack)


def tuned(stack: EmbeddedStack) -> EmbeddedStack:
    """The stack, its Postgres given shared buffers that hold the 100k corpus and its index.

    The embedded default (128 MB) is sized for tests; a production server holds its HNSW
    index in memory. Set once with ALTER SYSTEM, so the first start restarts Postgres.
    """
    stack.start()
    url = stack.endpoints.database_url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(url, autocommit=True) as conn:
        if conn.execute("SHOW shared_buffers").fetchone()[0] == SHARED_BUFFERS:
            return stack
        conn.execute(f"ALTER SYSTEM SET shared_buffers = '{SHARED_BUFFERS}'")
    stack.stop()
    stack.start()
    return stack


def start_stack(state: Path | None = None) -> EmbeddedStack:
    """Postgres, Redis and S3, for benchmarks that run the server.

    FOOTNOTE_BENCH_SERVER_URL names a Postgres already running (say, one still building a
    corpus): then only Redis and S3 start, in a state directory of their own.
    """
    server = os.environ.get("FOOTNOTE_BENCH_SERVER_URL")
    if server:
        stack = EmbeddedStack(
            state or state_dir().with_name("fnbench-attached"), database_url=server
        )
        stack.start()
        return stack
    return tuned(EmbeddedStack(state or state_dir()))


def database_url(server_url: str, name: str) -> str:
    base, _, query = server_url.partition("?")
    root = base.rsplit("/", 1)[0]
    return f"{root}/{name}" + (f"?{query}" if query else "")


def open_corpus(stack: EmbeddedStack, scale: int, *, log=print) -> Corpus:
    """The database of this scale, built first if it is not there yet."""
    name = f"bench_{scale}"
    server = stack.endpoints.database_url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(server, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        if not exists:
            conn.execute(f'CREATE DATABASE "{name}"')
    url = database_url(server, name)
    migrate.upgrade(url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS bench_meta (key text PRIMARY KEY, value text)")
        row = conn.execute("SELECT value FROM bench_meta WHERE key = 'assistant'").fetchone()
        if row is None:
            started = time.perf_counter()
            assistant = build(conn, scale, log=log)
            conn.execute("INSERT INTO bench_meta VALUES ('assistant', %s)", (assistant,))
            log(f"built {scale:,} chunks in {time.perf_counter() - started:.0f} s")
        else:
            assistant = row[0]
    return Corpus(url=url, scale=scale, tenant_id=TENANT, assistant_id=assistant)


def attach(url: str, scale: int) -> Corpus:
    """A corpus built earlier, in a database that is already running."""
    with psycopg.connect(url) as conn:
        (assistant,) = conn.execute(
            "SELECT value FROM bench_meta WHERE key = 'assistant'"
        ).fetchone()
    return Corpus(url=url, scale=scale, tenant_id=TENANT, assistant_id=assistant)


def words() -> list[str]:
    """VOCABULARY distinct pseudo-words that the English stemmer leaves distinct."""
    rng = np.random.default_rng(SEED)
    onsets = [*list("bdfgklmnprstvz"), "br", "dr", "gl", "kr", "pl", "st", "tr"]
    vowels = list("aeiou")
    out: set[str] = set()
    while len(out) < VOCABULARY:
        n = int(rng.integers(2, 4))
        out.add(
            "".join(onsets[rng.integers(len(onsets))] + vowels[rng.integers(5)] for _ in range(n))
            + "x"
        )
    return sorted(out)


def zipf_ids(rng: np.random.Generator, size: int) -> np.ndarray:
    ranks = np.arange(1, VOCABULARY + 1)
    p = 1.0 / ranks**ZIPF_S
    return rng.choice(VOCABULARY, size=size, p=p / p.sum())


def unit_vectors(rng: np.random.Generator, n: int) -> np.ndarray:
    v = rng.standard_normal((n, DIM), dtype=np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def questions(count: int) -> Iterator[tuple[str, np.ndarray]]:
    """Question texts (two common terms, three of middling rank, one rare) with random vectors."""
    rng = np.random.default_rng(SEED + 1)
    vocab = words()
    for _ in range(count):
        ids = [*rng.integers(0, 30, 2), *rng.integers(30, 2000, 3), rng.integers(2000, VOCABULARY)]
        yield " ".join(vocab[i] for i in ids), unit_vectors(rng, 1)[0]


def build(conn: psycopg.Connection, scale: int, *, log=print) -> str:
    register_vector(conn)
    now = datetime.now(UTC)
    target = str(uuid.uuid4())
    assistants = [
        (target, TENANT, scale),
        (str(uuid.uuid4()), TENANT, scale // 10),
        (str(uuid.uuid4()), OTHER_TENANT, scale // 10),
    ]
    conn.execute("DROP INDEX IF EXISTS ix_chunks_embedding_hnsw")
    rng = np.random.default_rng(SEED)
    vocab = np.array(words())
    for assistant_id, tenant, count in assistants:
        conn.execute(
            """INSERT INTO assistants (id, tenant_id, display_name, create_time, update_time,
                 system_prompt, model, temperature, max_output_tokens, enable_rag,
                 enable_citations, citation_link_mode, top_k, score_threshold, max_sources,
                 excerpt_chars, enable_retrieval_gate)
               VALUES (%s, %s, 'bench', %s, %s, '', '', 0.2, 1024, true, true, 'NONE', 8, 0,
                 10, 200, false)""",
            (assistant_id, tenant, now, now),
        )
        if count % CHUNKS_PER_DOCUMENT:
            raise ValueError(f"a scale is a multiple of {CHUNKS_PER_DOCUMENT * 10}")
        documents = count // CHUNKS_PER_DOCUMENT
        doc_ids = [uuid.uuid4() for _ in range(documents)]
        with conn.cursor().copy(
            "COPY documents (id, tenant_id, assistant_id, display_name, content_type, size_bytes,"
            " sha256, object_key, state, error, chunk_count, page_count, attempts, create_time,"
            " update_time, indexed_time, delete_time) FROM STDIN"
        ) as copy:
            for i, doc in enumerate(doc_ids):
                # Every 50th document is not servable: half still processing, half deleted.
                state = "PROCESSING" if i % 100 == 49 else "READY"
                deleted = now if i % 100 == 99 else None
                copy.write_row(
                    (
                        doc,
                        tenant,
                        assistant_id,
                        f"doc-{i}.txt",
                        "text/plain",
                        1000,
                        "0" * 64,
                        f"documents/{doc}",
                        state,
                        "",
                        CHUNKS_PER_DOCUMENT,
                        0,
                        1,
                        now,
                        now,
                        now,
                        deleted,
                    )
                )
        done = 0
        while done < count:
            n = min(BATCH, count - done)
            vectors = unit_vectors(rng, n)
            terms = vocab[zipf_ids(rng, n * WORDS_PER_CHUNK)].reshape(n, WORDS_PER_CHUNK)
            with conn.cursor().copy(
                "COPY chunks (id, document_id, tenant_id, assistant_id, chunk_index, text,"
                " start_offset, end_offset, start_line, end_line, heading_path, context, embedding)"
                " FROM STDIN WITH (FORMAT BINARY)"
            ) as copy:
                copy.set_types(
                    [
                        "uuid",
                        "uuid",
                        "varchar",
                        "uuid",
                        "int4",
                        "text",
                        "int4",
                        "int4",
                        "int4",
                        "int4",
                        "text[]",
                        "text",
                        "vector",
                    ]
                )
                for j in range(n):
                    k = done + j
                    body = " ".join(terms[j])
                    copy.write_row(
                        (
                            uuid.uuid4(),
                            doc_ids[k // CHUNKS_PER_DOCUMENT],
                            tenant,
                            uuid.UUID(assistant_id),
                            k % CHUNKS_PER_DOCUMENT,
                            body,
                            0,
                            len(body),
                            1,
                            1,
                            [],
                            "",
                            vectors[j],
                        )
                    )
            done += n
            log(f"  {assistant_id[:8]}: {done:,}/{count:,} chunks")
    log("building the HNSW index")
    started = time.perf_counter()
    conn.execute("SET maintenance_work_mem = '4GB'")
    conn.execute("SET max_parallel_maintenance_workers = 1")
    conn.execute(
        "CREATE INDEX ix_chunks_embedding_hnsw ON chunks USING hnsw (embedding vector_cosine_ops)"
    )
    log(f"  HNSW index in {time.perf_counter() - started:.0f} s")
    conn.execute("VACUUM ANALYZE")
    return target
