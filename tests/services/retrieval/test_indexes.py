"""Vector indexes of their own for large assistants that hold a minority of the chunks."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import text

from footnote.v1 import assistants_service_pb2 as apb
from footnote.v1 import assistants_service_pb2_grpc as apb_grpc
from footnote.v1 import documents_service_pb2_grpc as pb_grpc
from services.db.session import make_engine
from services.retrieval import indexes
from services.retrieval import search as searching
from services.retrieval.embeddings import create_embedder
from tests.services.retrieval.test_search import COFFEE, LEAVE, make_assistant
from tests.support import bearer, ingest

pytestmark = pytest.mark.usefixtures("worker")


def test_which_assistants_get_an_index_of_their_own():
    # More chunks than are searched exactly, and at most half of all chunks.
    assert indexes.wanted(100_000, 1_200_000, 20_000)
    assert not indexes.wanted(1_000_000, 1_200_000, 20_000)  # the shared index serves it
    assert not indexes.wanted(10_000, 1_200_000, 20_000)  # searched exactly
    assert not indexes.wanted(30_000, -1, 20_000)  # a table never analysed: not a minority
    assert not indexes.wanted(600_000, 10**7, 20_000)  # too long to build in a task
    assert indexes.index_name("62df9f9b-d5a1-4314-8aac-695a24bbd55e") == (
        "ix_chunks_embedding_hnsw_a_62df9f9bd5a143148aac695a24bbd55e"
    )
    with pytest.raises(ValueError):
        indexes.index_name("x'; DROP TABLE chunks; --")


def plan(db, tenant, assistant, vector):
    def explain(s):
        searching.use_search_settings(s, searching.EF_SEARCH)
        # A few rows are cheaper to sort than to find through any index: plan as at scale,
        # where only an HNSW index gives the order, and let the planner pick which one.
        s.execute(text("SET LOCAL enable_seqscan = off"))
        s.execute(text("SET LOCAL enable_sort = off"))
        sql = "EXPLAIN " + searching.VECTOR_SQL.text
        params = {
            "tenant": tenant,
            "assistant": uuid.UUID(assistant),
            "query": searching.vector_literal(vector),
            "limit": 10,
        }
        return "\n".join(r[0] for r in s.execute(text(sql), params))

    return db.transact(explain)


async def test_an_assistant_index_is_built_used_rebuilt_and_dropped(
    channel, make_key, db, settings, monkeypatch
):
    tenant = "index-" + uuid.uuid4().hex[:6]
    key = make_key(tenant)
    small, other = await make_assistant(channel, key), await make_assistant(channel, key)
    docs = pb_grpc.DocumentsServiceStub(channel)
    await ingest(docs, key, small, "leave.md", LEAVE)
    # The other holds most of the chunks, so that the small one is a minority even alone.
    await ingest(docs, key, other, "kitchen.md", COFFEE + b"Oat milk. " * 1500)
    db.read(lambda s: s.execute(text("ANALYZE chunks")))
    name = indexes.index_name(small)

    def state():
        with db.engine.connect() as conn:
            return indexes.existing(conn).get(name)

    def searched_exactly():
        searching._sizes.clear()
        return db.read(lambda s: searching.assistant_size(s, tenant, small)).exact

    assert indexes.build(db.engine, small, 10**6) is False  # too small to need one
    assert state() is None
    # Large enough for HNSW, but the shared index would find little of it: exact meanwhile.
    monkeypatch.setattr(searching, "EXACT_MAX_CHUNKS", 0)
    assert searched_exactly()

    def waiting():
        with db.engine.connect() as conn:
            return indexes.waiting(conn, 0)

    assert small in waiting()
    single = make_engine(settings.database_url or "", pool_size=1)
    try:
        assert indexes.build(single, small, 0) is True
        with single.connect() as conn:  # the same pooled connection, its settings as before
            assert conn.execute(text("SHOW statement_timeout")).scalar() == "1min"
    finally:
        single.dispose()
    assert state() is True
    assert not searched_exactly()
    assert small not in waiting()
    assert indexes.build(db.engine, small, 0) is False  # there already

    vector = create_embedder().embed_query("annual leave")
    assert name in plan(db, tenant, small, vector)
    assert name not in plan(db, tenant, other, vector)

    # A build that died leaves an invalid index: the next build replaces it.
    db.read(
        lambda s: s.execute(
            text("UPDATE pg_index SET indisvalid = false WHERE indexrelid = CAST(:n AS regclass)"),
            {"n": name},
        )
    )
    assert state() is False
    assert name not in plan(db, tenant, small, vector)
    assert searched_exactly()
    assert indexes.build(db.engine, small, 0) is True
    assert state() is True

    # The index of a deleted assistant goes with the next build of any assistant's index.
    stub = apb_grpc.AssistantsServiceStub(channel)
    await stub.DeleteAssistant(apb.DeleteAssistantRequest(id=small), metadata=bearer(key))
    assert indexes.build(db.engine, other, 10**6) is False
    assert state() is None


def test_a_running_build_holds_no_other_task_up(db, monkeypatch):
    """While one index builds, a task for the same assistant ends at once, and the index of
    a deleted assistant is left for a later build instead of waiting minutes for the table."""
    orphan = indexes.index_name(str(uuid.uuid4()))
    # A stand-in for a deleted assistant's index: the name is what marks it.
    db.read(lambda s: s.execute(text(f"CREATE INDEX {orphan} ON chunks (id) WHERE false")))
    monkeypatch.setattr(indexes, "ORPHAN_LOCK_TIMEOUT", "100ms")

    def autocommit():
        return db.engine.connect().execution_options(isolation_level="AUTOCOMMIT")

    def present():
        with autocommit() as conn:
            return orphan in indexes.existing(conn)

    # CREATE INDEX CONCURRENTLY holds this lock on the table for the whole build.
    builder = db.engine.connect()
    try:
        builder.execute(text("LOCK TABLE chunks IN SHARE UPDATE EXCLUSIVE MODE"))
        with autocommit() as conn:
            assert indexes.drop_orphans(conn) == []
            assert conn.execute(text("SHOW lock_timeout")).scalar() == "0"  # reset
        assert present()

        # A task for the assistant being built: its lock is taken, so it returns before
        # touching anything (it would otherwise wait for the table as above).
        assistant = str(uuid.uuid4())
        key = uuid.UUID(assistant).int & 0x7FFF_FFFF_FFFF_FFFF

        def touched(conn):
            raise AssertionError("a task whose assistant is being built dropped indexes")

        with db.engine.connect() as holder, monkeypatch.context() as patched:
            patched.setattr(indexes, "drop_orphans", touched)
            holder.execute(text("SELECT pg_advisory_lock(:k)"), {"k": key})
            assert indexes.build(db.engine, assistant, 0) is False
            holder.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": key})
    finally:
        builder.rollback()
        builder.close()

    with autocommit() as conn:
        assert indexes.drop_orphans(conn) == [orphan]
    assert not present()
