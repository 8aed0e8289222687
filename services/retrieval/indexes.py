"""A vector index of its own for each large assistant that holds a minority of all chunks.

The HNSW index over every chunk serves an assistant that holds most of them, but a filtered
scan finds little for one that holds a tenth: HNSW walks the whole graph's neighbourhoods and
the assistant filter drops most of what it finds. At 1M chunks in one assistant and 100k in
another, recall@10 against exact search was 0.995 for the large one and 0.64-0.71 for the
small one at 20-33 ms (questions near its own documents; 0.22 at 150-340 ms for others),
where exact search of 100k vectors takes well over 100 ms. pgvector's advice for filters on a
column with many values is partial indexes or partitions; an index `WHERE assistant_id = X`
for each such assistant is the smaller change, and a search planned for its own values (see
search.planned_once) picks it by itself.

Which assistants: those with more chunks than search.EXACT_MAX_CHUNKS (smaller ones are
searched exactly) and at most MAX_SHARE of all chunks. The index is built with CREATE INDEX
CONCURRENTLY by the `documents.index_assistant` task, which the ingest task sends when a
document of an assistant that needs one becomes READY, and the worker's reconciler for any
assistant still waiting for one; until it is valid, the assistant is searched exactly. A
build that died leaves an invalid index, which the next build drops first. Indexes of
assistants that no longer exist are dropped by the next build, unless a build is running:
dropping one waits for every other build on the table, so it is left for a later one.
"""

from __future__ import annotations

import logging
import re
import uuid

import psycopg
from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import OperationalError

from services.db.models import Chunk

log = logging.getLogger(__name__)

# An assistant holding at most this share of all chunks gets an index of its own.
MAX_SHARE = 0.5
# ... and at most this many chunks: a build must end within the task's 15-minute limit (100k
# chunks took 81-101 s on two busy cores), or every reconciler pass would start it again.
# A larger assistant stays on the shared index.
MAX_CHUNKS = 500_000
# Memory for building one (the graph is built in memory while it fits).
BUILD_MEMORY = "1GB"
# How long dropping a deleted assistant's index waits for the table: a running build holds
# it for minutes, and the task dropping it would hold a worker slot all that time.
ORPHAN_LOCK_TIMEOUT = "1s"
PREFIX = "ix_chunks_embedding_hnsw_a_"
_NAME = re.compile(rf"^{PREFIX}([0-9a-f]{{32}})$")

# All chunks: the planner's estimate once the table has been analysed (counting a million
# rows takes a while), a count before that.
EVERYONE = """
    SELECT CASE WHEN reltuples >= 0 THEN reltuples ELSE (SELECT count(*) FROM chunks) END
    FROM pg_class WHERE oid = 'chunks'::regclass
"""
# Whether the index named :index is there and usable.
VALID = """
    SELECT 1 FROM pg_index i JOIN pg_class x ON x.oid = i.indexrelid
    WHERE x.relname = :index AND i.indisvalid
"""
COUNTS_SQL = text(
    f"""
    SELECT
      (SELECT coalesce(sum(chunk_count), 0) FROM documents
       WHERE assistant_id = :assistant AND state = 'READY' AND delete_time IS NULL) AS mine,
      ({EVERYONE}) AS everyone
    """
)
INDEXES_SQL = text(
    """
    SELECT c.relname AS name, i.indisvalid AS valid
    FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
    WHERE i.indrelid = 'chunks'::regclass AND c.relname LIKE :prefix
    """
)


def index_name(assistant_id: str) -> str:
    return PREFIX + uuid.UUID(assistant_id).hex


def wanted(mine: int, everyone: float, exact_max_chunks: int) -> bool:
    """Whether an assistant of `mine` chunks, among `everyone`, needs an index of its own."""
    return exact_max_chunks < mine <= min(MAX_CHUNKS, MAX_SHARE * max(float(everyone), mine))


def needs_index(conn: Connection, assistant_id: str, exact_max_chunks: int) -> bool:
    """Whether the assistant should have an index of its own and has no valid one yet."""
    row = conn.execute(COUNTS_SQL, {"assistant": uuid.UUID(assistant_id)}).one()
    if not wanted(int(row.mine), float(row.everyone or 0), exact_max_chunks):
        return False
    return existing(conn).get(index_name(assistant_id)) is not True


LARGE_SQL = text(
    """
    SELECT assistant_id, sum(chunk_count) AS chunks FROM documents
    WHERE state = 'READY' AND delete_time IS NULL
    GROUP BY assistant_id HAVING sum(chunk_count) > :exact_max
    """
)


def waiting(conn: Connection, exact_max_chunks: int) -> list[str]:
    """The assistants that should have an index of their own and have no valid one: the
    worker's reconciler asks for theirs, so that an assistant that was already large before
    these indexes existed, or whose build failed, gets one without a new upload."""
    large = conn.execute(LARGE_SQL, {"exact_max": exact_max_chunks}).all()
    if not large:
        return []
    everyone = float(conn.execute(text(EVERYONE)).scalar() or 0)
    valid = existing(conn)
    return [
        str(r.assistant_id)
        for r in large
        if wanted(int(r.chunks), everyone, exact_max_chunks)
        and valid.get(index_name(str(r.assistant_id))) is not True
    ]


def existing(conn: Connection) -> dict[str, bool]:
    """The per-assistant indexes on chunks, and whether each is valid (usable)."""
    return {r.name: r.valid for r in conn.execute(INDEXES_SQL, {"prefix": PREFIX + "%"})}


def shared_index_sql(*, if_not_exists: bool = False) -> str:
    """The statement that builds the HNSW index over every chunk, compiled from the model."""
    from sqlalchemy.dialects import postgresql
    from sqlalchemy.schema import CreateIndex

    shared = next(i for i in Chunk.__table__.indexes if i.name == "ix_chunks_embedding_hnsw")
    return str(
        CreateIndex(shared, if_not_exists=if_not_exists).compile(dialect=postgresql.dialect())
    )


def create_sql(assistant_id: str) -> str:
    """The statement that builds an assistant's index: the shared index's method and
    settings, restricted to the assistant's rows."""
    head, _, rest = shared_index_sql().partition(" ON ")
    assert head == "CREATE INDEX ix_chunks_embedding_hnsw", head
    # The uuid is written into the statement (a partial index's predicate takes no
    # parameters); uuid.UUID has already checked that it is one.
    return (
        f"CREATE INDEX CONCURRENTLY {index_name(assistant_id)} ON {rest}"
        f" WHERE assistant_id = '{uuid.UUID(assistant_id)}'"
    )


def build(engine: Engine, assistant_id: str, exact_max_chunks: int) -> bool:
    """Builds the assistant's index if it needs one; True if this call built it.

    Runs outside a transaction (CREATE INDEX CONCURRENTLY must), without the pool's statement
    timeout, holding an advisory lock so that two workers never build the same index. The
    settings it changes are reset before the connection goes back to the pool.
    """
    name = index_name(assistant_id)
    lock = uuid.UUID(assistant_id).int & 0x7FFF_FFFF_FFFF_FFFF
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        if not conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": lock}).scalar():
            # Another worker is building it: the reconciler asks again every pass until the
            # index is valid, and each of those tasks ends here at once.
            return False
        try:
            drop_orphans(conn)
            if not needs_index(conn, assistant_id, exact_max_chunks):
                return False
            if existing(conn).get(name) is False:
                log.warning("dropping %s, left invalid by a build that did not finish", name)
                conn.execute(text(f"DROP INDEX CONCURRENTLY IF EXISTS {name}"))
            conn.execute(text("SET statement_timeout = 0"))
            conn.execute(text(f"SET maintenance_work_mem = '{BUILD_MEMORY}'"))
            log.info("building %s for assistant %s", name, assistant_id)
            conn.execute(text(create_sql(assistant_id)))
            log.info("built %s", name)
            return True
        finally:
            conn.execute(text("RESET statement_timeout"))
            conn.execute(text("RESET maintenance_work_mem"))
            conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": lock})


def drop_orphans(conn: Connection) -> list[str]:
    """Drops the indexes of assistants that no longer exist; their names.

    An index that cannot be dropped within ORPHAN_LOCK_TIMEOUT (a build of another index is
    running: both need the table's SHARE UPDATE EXCLUSIVE lock) is left for a later build.
    """
    dropped = []
    for name in existing(conn):
        match = _NAME.match(name)
        if match is None:
            continue
        alive = conn.execute(
            text("SELECT 1 FROM assistants WHERE id = :id"), {"id": uuid.UUID(match[1])}
        ).first()
        if alive is not None:
            continue
        conn.execute(text(f"SET lock_timeout = '{ORPHAN_LOCK_TIMEOUT}'"))
        try:
            conn.execute(text(f"DROP INDEX CONCURRENTLY IF EXISTS {name}"))
            dropped.append(name)
        except OperationalError as e:
            if not isinstance(e.orig, psycopg.errors.LockNotAvailable):
                raise
            log.info("left %s for a later build: the table is busy with another build", name)
        finally:
            conn.execute(text("RESET lock_timeout"))
    return dropped
