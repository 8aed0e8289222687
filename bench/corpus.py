"""A synthetic corpus at scale for the retrieval benchmarks, built once and kept on disk.

Postgres runs from the embedded stack in a state directory of its own (default
/tmp/fnbench, override with FOOTNOTE_BENCH_STATE), one database per scale (bench_10000, ...).
Building a scale loads the chunks without the HNSW index, then builds the index and analyses;
later runs find the database ready and only start Postgres (about a second).

The corpus: one target assistant holding `scale` chunks in documents of 100 chunks, 2% of them
in documents that are not READY or were deleted (the filters must drop them), plus two
distractor assistants (one in the same tenant, one in another) of scale / 10 chunks each.
Vectors are either random unit vectors (`random`, the worst case for HNSW: a point's nearest
neighbours are barely nearer than any other point) or `clustered`, shaped like embeddings of
real documents: each document has a topic near one of THEMES themes, and each chunk lies near
its document's topic (see `clustered_vectors`). A question's vector is random, or for the
clustered corpus a new chunk of a random document of the target assistant. Text is
pseudo-words drawn from a Zipf distribution, so a question mixes very common terms (in a large
share of the chunks) with rare ones, as natural language does.

The `real` corpus is neither: its chunks are passages of the machine's manual pages
(bench/manpages.py) with their embeddings from the local model, and its questions the first
sentences of passages of other pages, embedded as the server embeds a question. Embedding
120k passages took 20 minutes on two cores, once.
"""

from __future__ import annotations

import hashlib
import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import psycopg
from alembic import command
from alembic.script import ScriptDirectory
from pgvector.psycopg import register_vector
from sqlalchemy import text

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
# Shared buffers that hold a corpus's indexes and the rows its searches read, as a production
# server's would: about 5 kB a chunk (the 1M corpus, 1.2M chunks with its distractors: the
# HNSW index 2.3 GB, the full-text index 0.2 GB, the table 4.7 GB), at least 1 GB, at most a
# third of the machine's memory. At 1M chunks in 1 GB, an HNSW walk 300 wide read 1,800-2,700
# pages from the OS after 300 warm-up questions and took 22-23 ms p50; in 6 GB, once warm,
# none and 9 ms.
BUFFER_BYTES_PER_CHUNK = 5 * 1024
MIN_SHARED_BUFFERS = 2**30
VECTORS = ("random", "clustered", "real")
# The migration that keeps vectors in the row and builds the HNSW index.
VECTORS_IN_THE_ROW = "0007"
# Clustered vectors: cosine of a document's topic to its theme, and of a chunk to its topic.
THEMES = 64
THEME_COSINE = 0.6
TOPIC_COSINE = 0.75
# Questions kept with the real corpus.
REAL_QUESTIONS = 1000


class CorpusUnavailable(Exception):
    """This machine cannot give the corpus asked for (too few manual pages for `real`)."""


@dataclass(frozen=True)
class Corpus:
    url: str  # postgresql:// URL of the scale's database
    scale: int
    tenant_id: str
    assistant_id: str
    vectors: str = "random"


def state_dir() -> Path:
    return Path(os.environ.get("FOOTNOTE_BENCH_STATE", "/tmp/fnbench"))


def start_postgres(scale: int = 0) -> EmbeddedStack:
    """Postgres only: the broker and S3 are configured as placeholders that nothing contacts.
    Its shared buffers fit corpora of up to `scale` chunks (see shared_buffers)."""
    stack = EmbeddedStack(
        state_dir(),
        broker_url="redis://127.0.0.1:1/0",
        s3_endpoint="http://127.0.0.1:1",
        s3_access_key="unused",
        s3_secret_key="unused",
    )
    return tuned(stack, scale)


def shared_buffers(scale: int) -> int:
    """The bytes of shared buffers for a corpus of this many chunks (BUFFER_BYTES_PER_CHUNK)."""
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    wanted = max(MIN_SHARED_BUFFERS, scale * BUFFER_BYTES_PER_CHUNK)
    return min(wanted, max(MIN_SHARED_BUFFERS, memory // 3)) // 2**20 * 2**20


def tuned(stack: EmbeddedStack, scale: int = 0) -> EmbeddedStack:
    """The stack, its Postgres given shared buffers for a corpus of `scale` chunks.

    The embedded default (128 MB) is sized for tests; a production server holds its HNSW
    index in memory. Set with ALTER SYSTEM, so a start that needs another size restarts
    Postgres.
    """
    stack.start()
    url = stack.endpoints.database_url.replace("postgresql+psycopg://", "postgresql://")
    wanted = shared_buffers(scale)
    with psycopg.connect(url, autocommit=True) as conn:
        now = conn.execute("SELECT pg_size_bytes(current_setting('shared_buffers'))").fetchone()[0]
        if now == wanted:
            return stack
        conn.execute(f"ALTER SYSTEM SET shared_buffers = '{wanted // 2**20}MB'")
    stack.stop()
    stack.start()
    return stack


def start_stack(state: Path | None = None, scale: int = 0) -> EmbeddedStack:
    """Postgres, Redis and S3, for benchmarks that run the server; shared buffers as in
    start_postgres.

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
    return tuned(EmbeddedStack(state or state_dir()), scale)


def database_url(server_url: str, name: str) -> str:
    base, _, query = server_url.partition("?")
    root = base.rsplit("/", 1)[0]
    return f"{root}/{name}" + (f"?{query}" if query else "")


def database_name(scale: int, vectors: str = "random") -> str:
    return f"bench_{scale}" if vectors == "random" else f"bench_{scale}_{vectors}"


def open_corpus(stack: EmbeddedStack, scale: int, *, vectors: str = "random", log=print) -> Corpus:
    """The database of this scale and kind of vectors, built first if it is not there yet."""
    name = database_name(scale, vectors)
    server = stack.endpoints.database_url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(server, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        if not exists:
            conn.execute(f'CREATE DATABASE "{name}"')
    url = database_url(server, name)
    upgrade(url, log=log)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS bench_meta (key text PRIMARY KEY, value text)")
        row = conn.execute("SELECT value FROM bench_meta WHERE key = 'assistant'").fetchone()
        if row is None:
            conn.execute("DROP TABLE IF EXISTS bench_questions")
            if conn.execute("SELECT EXISTS (SELECT 1 FROM assistants)").fetchone()[0]:
                log("an earlier build of this corpus did not finish: starting again")
                conn.execute("TRUNCATE assistants, documents, chunks CASCADE")
            started = time.perf_counter()
            assistant = build(conn, scale, vectors=vectors, log=log)
            conn.execute("INSERT INTO bench_meta VALUES ('assistant', %s)", (assistant,))
            log(f"built {scale:,} chunks in {time.perf_counter() - started:.0f} s")
        else:
            assistant = row[0]
    assistant_indexes(url, log=log)
    return Corpus(url=url, scale=scale, tenant_id=TENANT, assistant_id=assistant, vectors=vectors)


def assistant_indexes(url: str, *, log=print) -> None:
    """The vector indexes of their own that the worker builds for large assistants holding a
    minority of the chunks (services/retrieval/indexes.py): at 1M chunks, the distractors."""
    from services.db.session import make_engine
    from services.retrieval import indexes
    from services.retrieval.search import EXACT_MAX_CHUNKS

    engine = make_engine(url, pool_size=1)
    try:
        with engine.connect() as conn:
            ids = [str(i) for i in conn.execute(text("SELECT id FROM assistants")).scalars()]
        for assistant in ids:
            started = time.perf_counter()
            if indexes.build(engine, assistant, EXACT_MAX_CHUNKS):
                took = time.perf_counter() - started
                log(f"  index of assistant {assistant[:8]} in {took:.0f} s")
    finally:
        engine.dispose()


def upgrade(url: str, *, log=print) -> None:
    """The schema migrated to head. A corpus built under an older schema keeps its rows.

    A migration that rewrites chunks would update the HNSW index row by row (as slow as
    building it, and it leaves the index bloated), so it is dropped first; migration 0007 builds
    it again. Rows loaded before 0007 hold their vectors out of line: the table is rewritten
    with 0007's storage settings before 0007 runs, so that the index is built once.
    """
    with psycopg.connect(url, autocommit=True) as conn:
        # Corpora built before documents got distinct digests: retrieval searches one copy of
        # identical files, so every document but one was left out.
        if conn.execute("SELECT to_regclass('documents') IS NOT NULL").fetchone()[0]:
            conn.execute(
                "UPDATE documents SET sha256 = encode(sha256(convert_to(id::text, 'UTF8')), 'hex')"
                " WHERE sha256 = repeat('0', 64)"
            )
    config = migrate.alembic_config(url)
    head = ScriptDirectory.from_config(config).get_current_head()
    current = migrate.current_revision(url)
    # None of the migrations after 0007 rewrites chunks (0008 adds a column with no default,
    # 0009 a table and triggers): the index stays.
    if current is None or current == head or current >= VECTORS_IN_THE_ROW:
        migrate.upgrade(url)
        return
    log(f"migrating the corpus from {current} to {head}")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DROP INDEX IF EXISTS ix_chunks_embedding_hnsw")
    command.upgrade(config, f"{int(VECTORS_IN_THE_ROW) - 1:04d}")
    with psycopg.connect(url, autocommit=True) as conn:
        log("rewriting chunks with their vectors in the row")
        conn.execute("ALTER TABLE chunks ALTER COLUMN embedding SET STORAGE MAIN")
        conn.execute("ALTER TABLE chunks SET (toast_tuple_target = 4096)")
        conn.execute("VACUUM FULL chunks")
    started = time.perf_counter()
    migrate.upgrade(url)
    log(f"  migrated in {time.perf_counter() - started:.0f} s")
    with psycopg.connect(url, autocommit=True) as conn:
        build_vector_index(conn, log=log)
        conn.execute("VACUUM ANALYZE")


def attach(url: str, scale: int, vectors: str = "random") -> Corpus:
    """A corpus built earlier, in a database that is already running."""
    with psycopg.connect(url) as conn:
        (assistant,) = conn.execute(
            "SELECT value FROM bench_meta WHERE key = 'assistant'"
        ).fetchone()
    return Corpus(url=url, scale=scale, tenant_id=TENANT, assistant_id=assistant, vectors=vectors)


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


def near(rng: np.random.Generator, centres: np.ndarray, cosine: float) -> np.ndarray:
    """Unit vectors at the given cosine from each centre, in random directions."""
    noise = unit_vectors(rng, len(centres))
    noise -= np.sum(noise * centres, axis=1, keepdims=True) * centres
    noise /= np.linalg.norm(noise, axis=1, keepdims=True)
    return (cosine * centres + np.sqrt(1 - cosine**2) * noise).astype(np.float32)


def topics(scale: int) -> np.ndarray:
    """The document topics of the target assistant's corpus of this scale (clustered vectors)."""
    rng = np.random.default_rng(SEED + 2)
    themes = unit_vectors(rng, THEMES)
    documents = scale // CHUNKS_PER_DOCUMENT
    return near(rng, themes[rng.integers(0, THEMES, documents)], THEME_COSINE)


def clustered_vectors(
    rng: np.random.Generator, topic: np.ndarray, first: int, n: int
) -> np.ndarray:
    """Chunks first..first+n: each at TOPIC_COSINE from its document's topic.

    Two chunks of one document are about 0.56 alike, of one theme about 0.2, others about 0,
    roughly as sentence embeddings of related and unrelated passages are. The spread around
    each topic is isotropic in all dimensions, which is harder for HNSW than real embeddings.
    """
    documents = np.arange(first, first + n) // CHUNKS_PER_DOCUMENT
    return near(rng, topic[documents], TOPIC_COSINE)


def questions(count: int, c: Corpus | None = None) -> Iterator[tuple[str, np.ndarray]]:
    """Question texts (two common terms, three of middling rank, one rare) with vectors.

    The vectors are random unit vectors, or for a clustered corpus new chunks of random
    documents of its target assistant (servable or not).
    """
    if c is not None and c.vectors == "real":
        yield from real_questions(c, count)
        return
    rng = np.random.default_rng(SEED + 1)
    vocab = words()
    topic = topics(c.scale) if c is not None and c.vectors == "clustered" else None
    for _ in range(count):
        ids = [*rng.integers(0, 30, 2), *rng.integers(30, 2000, 3), rng.integers(2000, VOCABULARY)]
        if topic is None:
            vector = unit_vectors(rng, 1)[0]
        else:
            vector = near(rng, topic[rng.integers(0, len(topic), 1)], TOPIC_COSINE)[0]
        yield " ".join(vocab[i] for i in ids), vector


def build(conn: psycopg.Connection, scale: int, *, vectors: str = "random", log=print) -> str:
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
    real = RealText(conn, sum(n for *_, n in assistants), log) if vectors == "real" else None
    for number, (assistant_id, tenant, count) in enumerate(assistants):
        topic = None
        if vectors == "clustered":
            # The distractors' topics are their own, unrelated to the target's. `documents` is
            # drawn for the target too, so that SEED gives the corpora docs/performance.md used.
            documents = unit_vectors(rng, count // CHUNKS_PER_DOCUMENT)
            topic = topics(count) if number == 0 else near(rng, documents, THEME_COSINE)
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
                        hashlib.sha256(doc.bytes).hexdigest(),
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
            if real is not None:
                bodies, batch = real.next(n)
            else:
                if vectors == "clustered":
                    batch = clustered_vectors(rng, topic, done, n)
                else:
                    batch = unit_vectors(rng, n)
                terms = vocab[zipf_ids(rng, n * WORDS_PER_CHUNK)].reshape(n, WORDS_PER_CHUNK)
                bodies = [" ".join(t) for t in terms]
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
                    body = bodies[j]
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
                            batch[j],
                        )
                    )
            done += n
            log(f"  {assistant_id[:8]}: {done:,}/{count:,} chunks")
    build_vector_index(conn, log=log)
    conn.execute("VACUUM ANALYZE")
    return target


class RealText:
    """Passages of manual pages and their embeddings, handed out in order; the first sentences
    of passages of pages beyond those, with their vectors, are kept as the questions."""

    def __init__(self, conn: psycopg.Connection, count: int, log=print) -> None:
        import manpages

        from services.retrieval.embeddings import LocalEmbedder

        rng = np.random.default_rng(SEED)
        by_page: dict[str, list[str]] = {}
        for page, passage in manpages.passages():
            by_page.setdefault(page, []).append(passage)
        order = list(by_page)
        rng.shuffle(order)  # pages of every section in every part of the corpus
        texts = [p for page in order for p in by_page[page]]
        # The questions come from whole pages after the corpus's last one (the page the corpus
        # ends in is split, and asks nothing). Boilerplate shared by many pages means about
        # half of the passages asked about also occur, word for word, in the corpus.
        held, first = [], 0
        for page in order:
            if first >= count:
                held += by_page[page]
            first += len(by_page[page])
        if len(held) < REAL_QUESTIONS:
            raise CorpusUnavailable(
                f"the real corpus needs {count + REAL_QUESTIONS:,} passages of manual pages;"
                f" {manpages.MAN_ROOT} gives {len(texts):,}: choose a smaller --scale"
            )
        self.texts = texts[:count]
        self.embedder = LocalEmbedder()
        self.log = log
        self.given = 0
        self.started = time.perf_counter()
        picks = rng.choice(len(held), size=REAL_QUESTIONS, replace=False)
        asked = [manpages.question(held[i]) for i in sorted(picks)]
        vectors = self.embedder.embed_documents(asked)
        conn.execute(
            "CREATE TABLE IF NOT EXISTS bench_questions"
            " (n int PRIMARY KEY, question text NOT NULL, embedding vector NOT NULL)"
        )
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO bench_questions VALUES (%s, %s, %s)",
                [
                    (i, q, np.array(v, dtype=np.float32))
                    for i, (q, v) in enumerate(zip(asked, vectors, strict=True))
                ],
            )

    def next(self, n: int) -> tuple[list[str], np.ndarray]:
        texts = self.texts[self.given : self.given + n]
        vectors = np.empty((len(texts), DIM), dtype=np.float32)
        for start in range(0, len(texts), 2000):
            part = texts[start : start + 2000]
            vectors[start : start + len(part)] = self.embedder.embed_documents(part)
            done = self.given + start + len(part)
            rate = done / (time.perf_counter() - self.started)
            left = (len(self.texts) - done) / rate
            total = len(self.texts)
            self.log(f"  embedded {done:,}/{total:,} passages ({rate:.0f}/s, {left:.0f} s left)")
        self.given += len(texts)
        return texts, vectors


def real_questions(c: Corpus, count: int) -> Iterator[tuple[str, np.ndarray]]:
    """The real corpus's distinct questions and their vectors, as many as asked.

    There are about 900 of the REAL_QUESTIONS kept (some first sentences are boilerplate).
    Asking for more is CorpusUnavailable: a question asked again would skip the server's
    question embedding (its recent-question cache) and search pages just read.
    """
    with psycopg.connect(c.url) as conn:
        register_vector(conn)
        kept = conn.execute("SELECT question, embedding FROM bench_questions ORDER BY n")
        rows, seen = [], set()
        for question, vector in kept:
            if question not in seen:
                seen.add(question)
                rows.append((question, vector))
    if count > len(rows):
        raise CorpusUnavailable(
            f"the real corpus has {len(rows):,} distinct questions, not {count:,}: ask fewer"
        )
    for question, vector in rows[:count]:
        yield question, np.asarray(vector.to_numpy() if hasattr(vector, "to_numpy") else vector)


def vector_index_sql() -> str:
    from services.retrieval.indexes import shared_index_sql

    return shared_index_sql(if_not_exists=True)


def build_vector_index(conn: psycopg.Connection, *, log=print) -> None:
    log("building the HNSW index")
    started = time.perf_counter()
    conn.execute("SET maintenance_work_mem = '4GB'")
    conn.execute("SET max_parallel_maintenance_workers = 1")
    # The index the schema declares (migration 0007 builds the same), compiled from the model.
    conn.execute(vector_index_sql())
    log(f"  HNSW index in {time.perf_counter() - started:.0f} s")
