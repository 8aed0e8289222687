"""Exact vector search over assistants' vectors held in memory (vector_memory.py), on chunks
indexed by the real pipeline: the same chunks as exact search in Postgres, never a deleted
document's, a new document's at once."""

from __future__ import annotations

import asyncio
import struct
import threading
import time
import uuid
from dataclasses import replace

import numpy as np
import pytest
from sqlalchemy import text

from footnote.v1 import documents_service_pb2 as pb
from footnote.v1 import documents_service_pb2_grpc as pb_grpc
from services.db.session import Database, make_engine
from services.retrieval import indexes, vector_memory
from services.retrieval import search as searching
from services.retrieval.embeddings import create_embedder
from services.retrieval.vector_memory import Digest, HeldAssistant, VectorMemory
from tests.services.retrieval.test_search import COFFEE, LEAVE, THIRD, make_assistant, prepared
from tests.support import bearer, ingest

pytestmark = pytest.mark.usefixtures("worker")

QUESTION = "How many days of annual leave?"


@pytest.fixture(scope="module")
def embedder():
    return create_embedder()


@pytest.fixture
def memory(monkeypatch):
    """A memory of 64 MB searching every assistant that HNSW would (here: all of them), loading
    it at its first question, holding it whatever its index finds, and loading a stale copy
    again at once."""
    monkeypatch.setattr(searching, "EXACT_MAX_CHUNKS", -1)
    monkeypatch.setattr(indexes, "MAX_SHARE", 0.0)
    monkeypatch.setattr(vector_memory, "RELOAD_SECONDS", 0.0)
    monkeypatch.setattr(vector_memory, "GOOD_RECALL", 1.01)
    monkeypatch.setattr(vector_memory, "ASKED_BEFORE_CHECK", 1)
    held = VectorMemory(64 * 2**20, searching.SEARCHABLE, searching.index_walk)
    monkeypatch.setattr(searching, "MEMORY", held)
    searching._sizes.clear()
    yield held
    held.close()
    searching._sizes.clear()


@pytest.fixture
def served(monkeypatch):
    """Records, per vector search with a memory (not those of `exact`), whether it answered."""
    answered: list[bool] = []
    original = searching.held_candidates

    def recorded(*args, **kwargs):
        rows = original(*args, **kwargs)
        if searching.MEMORY is not None:
            answered.append(rows is not None)
        return rows

    monkeypatch.setattr(searching, "held_candidates", recorded)
    return answered


def nearest(db, embedder, tenant, assistant, question=QUESTION, limit=8):
    vector = embedder.embed_query(question)
    rows = db.read(lambda s: searching.vector_candidates(s, tenant, assistant, vector, limit))
    return [(r.id, r.similarity) for r in rows]


def same(found, expected) -> bool:
    """The same chunks in the same order, at the same cosines (to float32's precision)."""
    return [i for i, _ in found] == [i for i, _ in expected] and [
        s for _, s in found
    ] == pytest.approx([s for _, s in expected], abs=1e-5)


def exact(db, embedder, tenant, assistant, question=QUESTION, limit=8):
    """The same search through Postgres's exact query."""
    held, searching.MEMORY = searching.MEMORY, None
    searching._sizes.clear()
    try:
        with pytest.MonkeyPatch.context() as m:
            m.setattr(searching, "EXACT_MAX_CHUNKS", 10**9)
            return nearest(db, embedder, tenant, assistant, question, limit)
    finally:
        searching.MEMORY = held
        searching._sizes.clear()


def held_search(db, embedder, memory, tenant, assistant, question=QUESTION):
    """A search once the copy of the assistant is held (the first search starts its load)."""
    nearest(db, embedder, tenant, assistant, question)
    assert memory.wait_idle(30)
    return nearest(db, embedder, tenant, assistant, question)


def gated_loads(monkeypatch) -> threading.Event:
    """Makes every load of a copy wait until the returned event is set (at most 30 s)."""
    gate = threading.Event()
    real_load = vector_memory.load

    def gated(*args, **kwargs):
        assert gate.wait(30)
        return real_load(*args, **kwargs)

    monkeypatch.setattr(vector_memory, "load", gated)
    return gate


async def documents(channel, make_key, tenant, *files):
    key = make_key(tenant)
    assistant = await make_assistant(channel, key)
    stub = pb_grpc.DocumentsServiceStub(channel)
    made = [await ingest(stub, key, assistant, name, data) for name, data in files]
    return key, assistant, stub, made


async def held_like_exact(channel, make_key, db, embedder, memory, served, tenant):
    """An assistant of two documents, searched from its copy as exact search finds."""
    _, assistant, _, _ = await documents(
        channel, make_key, tenant, ("leave.md", LEAVE), ("kitchen.md", COFFEE)
    )
    for question in (QUESTION, "espresso machine", "zzz qqq"):
        found = held_search(db, embedder, memory, tenant, assistant, question)
        assert same(found, exact(db, embedder, tenant, assistant, question))
    assert served[0] is False and served[-1] is True
    return assistant


async def test_memory_finds_what_exact_search_finds(
    channel, make_key, db, embedder, memory, served, monkeypatch
):
    monkeypatch.setattr(vector_memory, "_nibbles", None)
    tenant = "mem-" + uuid.uuid4().hex[:6]
    assistant = await held_like_exact(channel, make_key, db, embedder, memory, served, tenant)
    assert memory.held_bytes() > 0
    # Only small copies held: the 4-bit codes were never timed.
    assert vector_memory._nibbles is None
    assert searching.memory_held() == (memory.held_bytes(), 1)
    told = []
    monkeypatch.setattr(searching, "ON_VECTOR_SEARCH", told.append)
    nearest(db, embedder, tenant, assistant)
    assert told == ["memory"]
    # Another tenant naming the same assistant finds nothing, held or not.
    assert nearest(db, embedder, "someone-else", assistant) == []


@pytest.fixture
def nibbles(monkeypatch):
    """Every copy of a large assistant's kind held in 4 bits, however few its chunks."""
    monkeypatch.setattr(vector_memory, "WIDE_MIN_CHUNKS", 1)
    monkeypatch.setattr(vector_memory, "_nibbles", True)


async def test_a_copy_in_4_bits_finds_what_exact_search_finds(
    channel, make_key, db, embedder, memory, served, nibbles
):
    tenant = "mem4-" + uuid.uuid4().hex[:6]
    await held_like_exact(channel, make_key, db, embedder, memory, served, tenant)
    (copy,) = memory._held.values()
    assert copy.nibbles is not None and copy.blocks == [] and copy.chunks > 0
    assert copy.dim == 384 and memory.held_bytes() == copy.nbytes > copy.nibbles.codes.nbytes


async def test_a_copy_in_4_bits_of_no_chunks_holds_nothing(channel, make_key, db, nibbles):
    tenant = "mem4none-" + uuid.uuid4().hex[:6]
    assistant = await make_assistant(channel, make_key(tenant))
    copy = vector_memory.load(db.engine, tenant, assistant, searching.SEARCHABLE, nibbles=True)
    assert copy.chunks == 0 and copy.nibbles is None and copy.dim == 0
    assert copy.candidates(np.ones(384, np.float32), 8) == []


async def test_a_small_assistant_is_held_from_its_second_question(
    channel, make_key, db, embedder, memory, served, monkeypatch
):
    monkeypatch.setattr(searching, "EXACT_MAX_CHUNKS", 5_000)  # searched exactly, no HNSW
    tenant = "memsmall-" + uuid.uuid4().hex[:6]
    _, assistant, _, _ = await documents(
        channel, make_key, tenant, ("leave.md", LEAVE), ("kitchen.md", COFFEE)
    )
    questions = (QUESTION, "espresso machine", "zzz qqq")
    want = [exact(db, embedder, tenant, assistant, question) for question in questions]
    told = []
    monkeypatch.setattr(searching, "ON_VECTOR_SEARCH", told.append)
    nearest(db, embedder, tenant, assistant)
    assert memory.wait_idle(30) and memory.held() == (0, 0)  # asked once: not loaded
    for question, expected in zip(questions, want, strict=True):
        assert same(nearest(db, embedder, tenant, assistant, question), expected)
        assert memory.wait_idle(30)
    assert told == ["exact", "exact", "memory", "memory"]
    assert served == [False, False, True, True] and memory.held()[1] == 1

    # Its own HNSW index built (here: the limit lowered), the copy made for exact search is
    # dropped, and the walk is judged before anything is held again.
    walked = []
    memory.walk = lambda *args: walked.append(args) or searching.index_walk(*args)
    monkeypatch.setattr(searching, "EXACT_MAX_CHUNKS", -1)
    searching._sizes.clear()
    nearest(db, embedder, tenant, assistant)
    assert told[-1] == "index" and served[-1] is False
    assert memory.wait_idle(30) and walked  # loaded again, and checked
    assert same(nearest(db, embedder, tenant, assistant), want[0])
    assert told[-1] == "memory"  # GOOD_RECALL is above 1 here: held whatever the walk finds


async def test_the_held_query_is_prepared(channel, make_key, settings, embedder, memory, served):
    # A large assistant's other statements are planned for their values (search.planned_once);
    # the read of the held candidates' rows is prepared, for Postgres to keep one plan.
    tenant = "memplan-" + uuid.uuid4().hex[:6]
    _, assistant, _, _ = await documents(channel, make_key, tenant, ("leave.md", LEAVE))
    single = Database(make_engine(settings.database_url or "", pool_size=1))
    try:
        found = held_search(single, embedder, memory, tenant, assistant)
        assert served[-1] is True
        assert any("WITH now AS MATERIALIZED" in sql for sql in prepared(single))
        assert same(found, exact(single, embedder, tenant, assistant))
    finally:
        single.dispose()


async def test_a_new_document_is_found_at_once_and_the_copy_is_loaded_again(
    channel, make_key, db, embedder, memory, served
):
    tenant = "memnew-" + uuid.uuid4().hex[:6]
    key, assistant, stub, _ = await documents(channel, make_key, tenant, ("leave.md", LEAVE))
    held_search(db, embedder, memory, tenant, assistant)
    assert served[-1] is True

    travel = await ingest(stub, key, assistant, "travel.md", THIRD)
    question = "Which flights need approval?"
    found = nearest(db, embedder, tenant, assistant, question)
    assert served[-1] is False  # the copy no longer matches the documents
    assert same(found, exact(db, embedder, tenant, assistant, question))
    assert found[0][0] in chunk_ids(db, travel.id)
    # The next search loads a fresh copy, and the one after is answered from it.
    assert same(held_search(db, embedder, memory, tenant, assistant, question), found)
    assert served[-1] is True


async def test_a_stale_copy_is_dropped_before_its_replacement_is_loaded(
    channel, make_key, db, embedder, memory, served, monkeypatch
):
    tenant = "memdrop-" + uuid.uuid4().hex[:6]
    key, assistant, stub, _ = await documents(channel, make_key, tenant, ("leave.md", LEAVE))
    held_search(db, embedder, memory, tenant, assistant)
    assert memory.held() == (memory.held_bytes(), 1) and memory.held_bytes() > 0

    gate = gated_loads(monkeypatch)
    await ingest(stub, key, assistant, "travel.md", THIRD)
    nearest(db, embedder, tenant, assistant)  # finds the copy stale
    nearest(db, embedder, tenant, assistant)  # starts the load of a fresh one
    assert memory.held() == (0, 0)  # the stale copy is gone while the load waits
    gate.set()
    assert memory.wait_idle(30) and memory.held()[1] == 1
    assert served[-2:] == [False, False]


async def test_a_deleted_document_is_never_returned(
    channel, make_key, db, embedder, memory, served
):
    tenant = "memdel-" + uuid.uuid4().hex[:6]
    key, assistant, stub, (leave, copy, _) = await documents(
        channel,
        make_key,
        tenant,
        ("leave.md", LEAVE),
        ("leave (1).md", LEAVE),
        ("kitchen.md", COFFEE),
    )
    before = held_search(db, embedder, memory, tenant, assistant)
    assert served[-1] is True
    assert before[0][0] in chunk_ids(db, leave.id)  # the first upload stands for both

    await stub.DeleteDocument(pb.DeleteDocumentRequest(id=leave.id), metadata=bearer(key))
    after = nearest(db, embedder, tenant, assistant)
    assert not set(chunk_ids(db, leave.id)) & {i for i, _ in after}
    assert after[0][0] in chunk_ids(db, copy.id)  # its copy is searched now
    assert same(held_search(db, embedder, memory, tenant, assistant), after)


async def test_the_budget_holds_the_most_recently_searched(
    channel, make_key, db, embedder, memory, served
):
    tenant = "membud-" + uuid.uuid4().hex[:6]
    _, first, _, _ = await documents(channel, make_key, tenant, ("leave.md", LEAVE))
    _, second, _, _ = await documents(channel, make_key, tenant, ("leave.md", LEAVE))
    held_search(db, embedder, memory, tenant, first)
    one = memory.held_bytes()
    memory.budget_bytes = one + one // 2  # room for one of the two
    held_search(db, embedder, memory, tenant, second)
    assert served[-1] is True
    assert same(nearest(db, embedder, tenant, first), exact(db, embedder, tenant, first))
    assert served[-1] is False  # dropped for the second
    assert memory.held_bytes() <= memory.budget_bytes

    memory.budget_bytes = 0  # an assistant larger than all of it is not loaded
    searching._sizes.clear()
    assert memory.wait_idle(30)
    assert same(nearest(db, embedder, tenant, first), exact(db, embedder, tenant, first))
    assert memory.wait_idle(30)
    assert same(nearest(db, embedder, tenant, first), exact(db, embedder, tenant, first))
    assert served[-2:] == [False, False]


async def test_a_failed_load_leaves_search_to_postgres(
    channel, make_key, db, embedder, memory, served, monkeypatch
):
    tenant = "memfail-" + uuid.uuid4().hex[:6]
    _, assistant, _, _ = await documents(channel, make_key, tenant, ("leave.md", LEAVE))

    def broken(*args, **kwargs):
        raise RuntimeError("no vectors today")

    monkeypatch.setattr(vector_memory, "load", broken)
    want = exact(db, embedder, tenant, assistant)
    assert same(held_search(db, embedder, memory, tenant, assistant), want)
    assert served == [False, False]
    assert memory.held_bytes() == 0


async def test_an_assistant_its_index_serves_well_is_not_held(
    channel, make_key, db, embedder, memory, served, monkeypatch
):
    tenant = "memgood-" + uuid.uuid4().hex[:6]
    _, assistant, _, made = await documents(
        channel, make_key, tenant, ("leave.md", LEAVE), ("kitchen.md", COFFEE)
    )
    walked = []

    def walk(*args):
        walked.append(searching.index_walk(*args))
        return walked[-1]

    memory.walk = walk
    monkeypatch.setattr(vector_memory, "GOOD_RECALL", 0.95)
    held_search(db, embedder, memory, tenant, assistant)
    # A few chunks: the walk finds every exact neighbour, and the index goes on serving. It
    # was checked on the question asked and one made from each chunk (fewer than PROBES).
    chunks = sum(len(chunk_ids(db, d.id)) for d in made)
    assert len(walked) == 1 + chunks
    assert served == [False, False] and memory.held_bytes() == 0
    nearest(db, embedder, tenant, assistant)
    assert memory.wait_idle(30) and len(walked) == 1 + chunks  # no second load

    # An index that finds nothing: the assistant is held.
    memory.walk = lambda *args: []
    memory._index_good.clear()
    held_search(db, embedder, memory, tenant, assistant)
    assert served[-1] is True


async def test_the_index_is_checked_on_the_questions_asked(
    channel, make_key, db, embedder, memory, served, monkeypatch
):
    tenant = "memask-" + uuid.uuid4().hex[:6]
    _, assistant, _, _ = await documents(channel, make_key, tenant, ("leave.md", LEAVE))
    monkeypatch.setattr(vector_memory, "ASKED_BEFORE_CHECK", 3)
    monkeypatch.setattr(vector_memory, "PROBES", 3)  # all of them asked, none made up
    walked = []

    def walk(s, tenant_id, assistant_id, vector, limit):
        walked.append(vector)
        return searching.index_walk(s, tenant_id, assistant_id, vector, limit)

    memory.walk = walk
    questions = ["annual leave", "sick days", "When do unused days expire?"]
    for question in questions[:2]:
        nearest(db, embedder, tenant, assistant, question)
        assert memory.wait_idle(30)
    # Held from the first question, the walk not judged yet: too few questions.
    assert walked == [] and served == [False, True]
    held_search(db, embedder, memory, tenant, assistant, questions[2])
    asked = np.array([embedder.embed_query(q) for q in questions], np.float32)
    assert np.allclose(np.array(walked, np.float32), asked, atol=1e-6)
    assert served[-1] is True


async def test_a_copy_serves_until_the_walk_is_judged_good(
    channel, make_key, db, embedder, memory, served, monkeypatch
):
    tenant = "memfirst-" + uuid.uuid4().hex[:6]
    _, assistant, _, _ = await documents(
        channel, make_key, tenant, ("leave.md", LEAVE), ("kitchen.md", COFFEE)
    )
    monkeypatch.setattr(vector_memory, "ASKED_BEFORE_CHECK", 3)
    monkeypatch.setattr(vector_memory, "GOOD_RECALL", 0.95)  # a walk over a few chunks finds all
    want = exact(db, embedder, tenant, assistant)
    assert same(held_search(db, embedder, memory, tenant, assistant), want)
    assert served == [False, True] and memory.held_bytes() > 0
    nearest(db, embedder, tenant, assistant, "sick days")  # the third: the walk is judged
    assert memory.wait_idle(30)
    assert served[-1] is True and memory.held_bytes() == 0
    assert same(nearest(db, embedder, tenant, assistant), want)
    assert served[-1] is False  # the walk serves from now on
    assert memory.wait_idle(30) and memory.held_bytes() == 0  # and nothing is loaded again


async def searched(db, embedder, tenant, assistant, question=QUESTION):
    """The chunk ids a hybrid search finds as an answer starts one (start_search)."""
    vector = asyncio.get_running_loop().create_future()
    vector.set_result(embedder.embed_query(question))
    search = searching.start_search(
        db, tenant_id=tenant, assistant_id=assistant, query=question, query_vector=vector, top_k=8
    )
    return [c.chunk_id for c in await search.chunks]


async def test_a_first_question_waits_for_the_copy_on_its_way(
    channel, make_key, db, embedder, memory, served, monkeypatch
):
    tenant = "memwait-" + uuid.uuid4().hex[:6]
    _, assistant, _, _ = await documents(
        channel, make_key, tenant, ("leave.md", LEAVE), ("kitchen.md", COFFEE)
    )
    told = []
    monkeypatch.setattr(searching, "ON_VECTOR_SEARCH", told.append)
    found = await searched(db, embedder, tenant, assistant)
    # Not held when asked: the question started the load, waited for it, and was answered
    # from the copy instead of walking the index.
    assert served == [False, True] and told == ["memory"]
    assert memory.coming(db.engine, tenant, assistant) is None
    assert found == await searched(db, embedder, tenant, assistant)
    assert served[-1] is True and told == ["memory", "memory"]


async def test_a_slow_load_is_waited_for_only_so_long(
    channel, make_key, db, embedder, memory, served, monkeypatch
):
    tenant = "memslow-" + uuid.uuid4().hex[:6]
    _, assistant, _, _ = await documents(channel, make_key, tenant, ("leave.md", LEAVE))
    gate = gated_loads(monkeypatch)
    monkeypatch.setattr(vector_memory, "WAIT_SECONDS", 0.2)
    told = []
    monkeypatch.setattr(searching, "ON_VECTOR_SEARCH", told.append)
    try:
        found = await searched(db, embedder, tenant, assistant)
        # The wait ran out: the question walked the index, and the load goes on.
        assert told == ["index"] and served == [False, False]
        assert memory.coming(db.engine, tenant, assistant) is not None
    finally:
        gate.set()
    assert memory.wait_idle(30) and memory.coming(db.engine, tenant, assistant) is None
    assert found == await searched(db, embedder, tenant, assistant)
    assert told[-1] == "memory"


async def test_a_walk_found_good_is_not_waited_for(
    channel, make_key, db, embedder, memory, served, monkeypatch
):
    tenant = "memnowait-" + uuid.uuid4().hex[:6]
    _, assistant, _, _ = await documents(channel, make_key, tenant, ("leave.md", LEAVE))
    monkeypatch.setattr(vector_memory, "GOOD_RECALL", 0.95)  # a walk over a few chunks finds all
    await searched(db, embedder, tenant, assistant)
    assert memory.wait_idle(30) and memory.held_bytes() == 0  # judged good: not held
    [verdict] = memory._index_good.values()
    verdict.until = 0.0  # lapsed: the next question loads the copy to judge the walk again
    gate = gated_loads(monkeypatch)
    told = []
    monkeypatch.setattr(searching, "ON_VECTOR_SEARCH", told.append)
    try:
        await searched(db, embedder, tenant, assistant)
        assert told == ["index"]  # walked at once, not waiting for the load under way
        assert memory.coming(db.engine, tenant, assistant) is None
    finally:
        gate.set()
    assert memory.wait_idle(30)


async def test_a_check_that_fails_leaves_the_copy_serving(
    channel, make_key, db, embedder, memory, served, monkeypatch
):
    tenant = "memcheckfail-" + uuid.uuid4().hex[:6]
    _, assistant, _, _ = await documents(channel, make_key, tenant, ("leave.md", LEAVE))
    monkeypatch.setattr(vector_memory, "ASKED_BEFORE_CHECK", 2)

    def broken(*args):
        raise RuntimeError("the walk failed")

    memory.walk = broken
    held_search(db, embedder, memory, tenant, assistant)  # loaded, then checked: it fails
    assert memory.wait_idle(30)
    for question in ("sick days", "annual leave"):
        nearest(db, embedder, tenant, assistant, question)
        assert memory.wait_idle(30)
    assert served == [False, True, True, True] and memory.held_bytes() > 0


UNRELATED = [
    "Which gluons bind quarks inside a proton?",
    "Who painted the ceiling of the Sistine Chapel?",
    "What is the boiling point of liquid nitrogen?",
    "How do volcanoes form along tectonic plate boundaries?",
]


async def test_questions_unlike_those_judged_have_the_walk_checked_again(
    channel, make_key, db, embedder, memory, served, monkeypatch
):
    tenant = "memunlike-" + uuid.uuid4().hex[:6]
    _, assistant, _, _ = await documents(
        channel, make_key, tenant, ("leave.md", LEAVE), ("kitchen.md", COFFEE)
    )
    monkeypatch.setattr(vector_memory, "GOOD_RECALL", 0.95)
    monkeypatch.setattr(vector_memory, "UNLIKE_BEFORE_RECHECK", 2)
    walked = []

    def walk(s, tenant_id, assistant_id, vector, limit):
        walked.append(vector)
        return searching.index_walk(s, tenant_id, assistant_id, vector, limit)

    memory.walk = walk
    held_search(db, embedder, memory, tenant, assistant)  # judged: the walk finds everything
    assert memory.held_bytes() == 0
    judged = len(walked)
    for question in ["annual leave", "sick days", "Where is the coffee machine?"] * 2:
        nearest(db, embedder, tenant, assistant, question)  # like the one judged
    assert memory.wait_idle(30) and len(walked) == judged  # nothing checked again

    # Questions with nothing of the assistant's near, on which the walk (here) misses.
    def missing(s, tenant_id, assistant_id, vector, limit):
        walked.append(vector)
        return []

    memory.walk = missing
    for question in UNRELATED[:3]:
        nearest(db, embedder, tenant, assistant, question)
    assert memory.wait_idle(30)
    # Checked again on the questions from the first unlike one on, none made up: held.
    asked = np.array([embedder.embed_query(q) for q in UNRELATED[:3]], np.float32)
    assert np.allclose(np.array(walked[judged:], np.float32), asked, atol=1e-6)
    nearest(db, embedder, tenant, assistant, UNRELATED[3])
    assert served[-1] is True and memory.held_bytes() > 0


async def test_unlike_questions_start_at_most_a_few_checks(
    channel, make_key, db, embedder, memory, monkeypatch
):
    tenant = "memrecheck-" + uuid.uuid4().hex[:6]
    _, assistant, _, _ = await documents(channel, make_key, tenant, ("leave.md", LEAVE))
    monkeypatch.setattr(vector_memory, "GOOD_RECALL", 0.95)
    monkeypatch.setattr(vector_memory, "UNLIKE_BEFORE_RECHECK", 1)
    monkeypatch.setattr(vector_memory, "MAX_RECHECKS", 2)
    loads = []
    original = memory._load
    monkeypatch.setattr(memory, "_load", lambda *args: loads.append(args) or original(*args))
    held_search(db, embedder, memory, tenant, assistant)
    for question in UNRELATED * 2:  # each unlike; the walk finds everything all the same
        nearest(db, embedder, tenant, assistant, question)
        assert memory.wait_idle(30)
    # _load(engine, key, asked, recheck, exact, may_nibble): the verdict, then two checks, none
    # exact
    assert [args[3:5] for args in loads] == [(False, False), (True, False), (True, False)]
    assert memory.held_bytes() == 0


def chunk_ids(db, document_id):
    return db.read(
        lambda s: (
            s.execute(
                text("SELECT id FROM chunks WHERE document_id = :d"), {"d": uuid.UUID(document_id)}
            )
            .scalars()
            .all()
        )
    )


def held(vectors, ids=None) -> HeldAssistant:
    vectors = np.asarray(vectors, np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    ids = ids or [uuid.uuid4() for _ in vectors]
    raw = np.frombuffer(b"".join(i.bytes for i in ids), np.uint8).reshape(-1, 16)
    codes, scales, offsets = vector_memory.encode(vectors)
    return HeldAssistant(Digest(0), raw, [vector_memory.scorer().block(codes)], scales, offsets)


def test_codes_keep_the_vectors_within_their_rounding():
    rng = np.random.default_rng(7)
    vectors = rng.standard_normal((500, 384)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    codes, scales, offsets = vector_memory.encode(vectors)
    assert codes.dtype == np.int8 and np.abs(codes).max() == 127
    assert np.abs(codes * scales[:, None] - vectors).max() <= scales.max() / 2 + 1e-7
    # The scores rank as the cosines do, give or take the rounding.
    query = rng.standard_normal(384).astype(np.float32)
    layout = vector_memory.scorer()
    score = layout.products([layout.block(codes)], offsets, query) * scales
    cosine = vectors @ (query / np.linalg.norm(query))
    assert np.corrcoef(score, cosine)[0, 1] > 0.999
    assert set(np.argsort(-cosine)[:10]) <= set(np.argsort(-score)[:20])


def test_the_candidates_are_the_nearest_by_cosine(monkeypatch):
    monkeypatch.setattr(vector_memory, "MIN_CANDIDATES", 1)
    ids = [uuid.uuid4() for _ in range(5)]
    copy = held([[1, 0], [0, 1], [1, 1], [-1, 0], [-1, -1]], ids)
    # CANDIDATES_PER_RESULT (2) per result; the query's length does not matter.
    assert set(copy.candidates(np.array([20.0, 0.0]), 1)) == {ids[0].hex, ids[2].hex}
    assert set(copy.candidates(np.array([0.0, 1.0]), 1)) == {ids[1].hex, ids[2].hex}
    # Asked for more than it holds: all of them.
    assert sorted(copy.candidates(np.array([1.0, 0.0]), 10)) == sorted(i.hex for i in ids)


@pytest.mark.parametrize("rows", [False, True], ids=["columns", "rows"])
def test_either_layout_gives_the_exact_products_block_by_block(rows):
    layout = vector_memory.Scorer(vector_memory._session(rows=rows), rows=rows)
    rng = np.random.default_rng(3)
    codes = rng.integers(-128, 128, size=(10, 8)).astype(np.int8)  # all of int8
    offsets = 128 * codes.sum(axis=1, dtype=np.int32)
    query = rng.standard_normal(8).astype(np.float32)
    step = np.abs(query).max() / 127
    want = codes.astype(np.int32) @ np.round(query / step).astype(np.int32)
    blocks = [layout.block(codes[:4]), layout.block(codes[4:])]
    assert layout.dim(blocks[0]) == 8
    assert np.array_equal(layout.products(blocks, offsets, query), want)
    assert np.array_equal(layout.products([layout.block(codes)], offsets, query), want)


@pytest.mark.parametrize("rows", [False, True], ids=["columns", "rows"])
def test_two_threads_give_the_products_one_gives(rows):
    one = vector_memory.Scorer(vector_memory._session(rows=rows), rows=rows)
    two = vector_memory.Scorer(vector_memory._session(rows=rows, threads=2), rows=rows)
    rng = np.random.default_rng(5)
    codes = rng.integers(-127, 128, size=(20_000, 384)).astype(np.int8)  # worth splitting
    offsets = 128 * codes.sum(axis=1, dtype=np.int32)
    query = rng.standard_normal(384).astype(np.float32)
    blocks = [one.block(codes[:16_384]), one.block(codes[16_384:])]
    want = one.products(blocks, offsets, query)
    assert np.array_equal(two.products(blocks, offsets, query), want)


class Counted:
    """An onnxruntime session that counts its runs."""

    def __init__(self, session):
        self.session = session
        self.runs = 0

    def run(self, *args):
        self.runs += 1
        return self.session.run(*args)


def test_only_a_large_copy_is_scored_on_the_wide_session(monkeypatch):
    monkeypatch.setattr(vector_memory, "WIDE_MIN_CHUNKS", 3)
    narrow = Counted(vector_memory._session(rows=True))
    wide = Counted(vector_memory._session(rows=True, threads=2))
    layout = vector_memory.Scorer(narrow, rows=True, wide=wide)
    codes = np.arange(-8, 8, dtype=np.int8).reshape(4, 4)
    offsets = 128 * codes.sum(axis=1, dtype=np.int32)
    query = np.ones(4, np.float32)
    layout.products([layout.block(codes[:2])], offsets[:2], query)
    assert (narrow.runs, wide.runs) == (1, 0)
    products = layout.products([layout.block(codes[:2]), layout.block(codes[2:])], offsets, query)
    assert (narrow.runs, wide.runs) == (1, 2)
    assert np.array_equal(products, codes.astype(np.int32).sum(axis=1) * 127)


class Slow:
    """An onnxruntime session that takes 50 ms longer to run."""

    def __init__(self, session):
        self.session = session

    def run(self, *args):
        time.sleep(0.05)
        return self.session.run(*args)


def test_the_layout_that_measures_faster_is_chosen():
    columns, rows = vector_memory._session(rows=False), vector_memory._session(rows=True)
    assert vector_memory._faster(Slow(columns), rows).rows is True
    assert vector_memory._faster(columns, Slow(rows)).rows is False


def unit_rows(rng, n, dim):
    vectors = rng.standard_normal((n, dim)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


@pytest.mark.parametrize("dim", [384, 100], ids=["whole blocks", "a padded block"])
def test_4_bit_codes_score_the_cosines_within_their_rounding(dim):
    rng = np.random.default_rng(11)
    vectors = unit_rows(rng, 3_000, dim)
    coded = vector_memory.Nibbles.of(vectors)
    assert coded.dim == dim and coded.codes.dtype == np.uint8
    blocks = -(-dim // vector_memory.NIBBLE_BLOCK)
    assert coded.codes.shape == (3_000, blocks, vector_memory.NIBBLE_BLOCK // 2)
    for query in unit_rows(rng, 20, dim):
        cosine = vectors @ query
        score = coded.scores(query)
        # Each component within half a step of its block (its largest is 7 steps), the
        # question within half of its own 8-bit step, and a little for float32's sums.
        steps = np.abs(vectors).max(axis=1) / 7
        bound = steps * np.abs(query).sum() / 2 + np.abs(query).max() / 254 * np.sqrt(dim)
        assert (np.abs(score - cosine) <= bound + 1e-3).all()
        assert set(np.argsort(-cosine)[:10]) <= set(np.argsort(-score)[:64])


def test_a_copy_in_4_bits_gives_the_candidates_the_codes_in_8_give():
    rng = np.random.default_rng(12)
    vectors = unit_rows(rng, 20_000, 384)
    ids = [uuid.uuid4() for _ in vectors]
    eight = held(vectors, ids)
    four = HeldAssistant(
        Digest(0),
        eight.ids,
        [],
        np.zeros(0, np.float32),
        np.zeros(0, np.int32),
        nibbles=vector_memory.Nibbles.of(vectors),
    )
    for query in unit_rows(rng, 20, 384):
        want = {ids[i].hex for i in np.argsort(-(vectors @ query))[:10]}
        assert want <= set(four.candidates(query, 32)) and want <= set(eight.candidates(query, 32))


def test_the_budget_of_a_copy_in_4_bits_is_what_it_holds():
    vectors = unit_rows(np.random.default_rng(13), 2_000, 384)
    coded = vector_memory.Nibbles.of(vectors)
    counted = vector_memory.copy_bytes(2_000, 384, nibbles=True)
    assert 2_000 * 16 + coded.nbytes <= counted <= 1.01 * (2_000 * 16 + coded.nbytes)
    assert vector_memory.copy_bytes(2_000, 384) == 2_000 * (384 + 24)


def test_a_copy_takes_4_bits_only_when_large_and_they_fit(monkeypatch):
    monkeypatch.setattr(vector_memory, "WIDE_MIN_CHUNKS", 1_000)
    eight, four = (vector_memory.copy_bytes(5_000, 384, nibbles=n) for n in (False, True))
    assert eight < four  # 4-bit codes take a little more, with their packed copy
    roomy = VectorMemory(four, searching.SEARCHABLE, searching.index_walk)
    tight = VectorMemory(eight, searching.SEARCHABLE, searching.index_walk)
    try:
        assert roomy.may_nibble(5_000, 384) and not roomy.may_nibble(999, 384)
        # Held in 8 bits rather than not at all.
        assert tight.fits(5_000, 384) and not tight.may_nibble(5_000, 384)
    finally:
        roomy.close()
        tight.close()


def test_4_bits_are_chosen_only_where_they_measure_faster(monkeypatch):
    chosen = vector_memory.Scorer(
        vector_memory._session(rows=True), rows=True, wide=vector_memory._session(rows=True)
    )
    assert vector_memory._nibbles_faster(replace(chosen, wide=Slow(chosen.wide))) is True
    scores = vector_memory.Nibbles.scores

    def slow(self, query):
        time.sleep(0.05)
        return scores(self, query)

    monkeypatch.setattr(vector_memory.Nibbles, "scores", slow)
    assert vector_memory._nibbles_faster(chosen) is False

    def failing(self, query):
        raise RuntimeError("no MatMulNBits here")

    monkeypatch.setattr(vector_memory.Nibbles, "scores", failing)
    assert vector_memory._nibbles_faster(chosen) is False  # and the 8-bit codes serve


def test_a_zero_question_vector_finds_without_failing():
    copy = held([[1, 0], [0, 1]])
    assert len(copy.candidates(np.zeros(2, np.float32), 1)) == 2
    assert held(np.ones((0, 2))).candidates(np.array([1.0, 0.0]), 1) == []


def test_questions_are_kept_for_the_most_recently_asked_assistants(monkeypatch):
    monkeypatch.setattr(vector_memory, "ASKING_ASSISTANTS", 2)
    memory = VectorMemory(0, searching.SEARCHABLE, searching.index_walk)  # loads nothing
    engine = type("Engine", (), {"url": "postgresql://db"})()
    try:
        for assistant in ("a", "b", "a", "c"):
            assert memory.get(engine, "t", assistant, 10**6, np.ones(4, np.float32)) is None
        assert [key[2] for key in memory._asked] == ["a", "c"]
        assert len(memory._asked[("postgresql://db", "t", "a")]) == 2
        assert set(memory._first_asked) == set(memory._asked)
    finally:
        memory.close()


def binary_copy(rows, dim_of=len) -> bytes:
    """(uuid, vector) rows as PostgreSQL's binary COPY sends them (None: a NULL vector)."""
    out = [vector_memory.COPY_HEADER.pack(vector_memory.COPY_SIGNATURE, 0, 0)]
    for chunk_id, vector in rows:
        out.append(struct.pack(">hi", 2, 16) + chunk_id.bytes)
        if vector is None:
            out.append(struct.pack(">i", -1))
        else:
            body = struct.pack(">hh", dim_of(vector), 0) + np.asarray(vector, ">f4").tobytes()
            out.append(struct.pack(">i", len(body)) + body)
    return b"".join(out) + struct.pack(">h", -1)


@pytest.mark.parametrize("piece", [1, 7, 4096, 10**6])
def test_a_binary_copy_is_read_in_batches_whatever_its_pieces(monkeypatch, piece):
    monkeypatch.setattr(vector_memory, "LOAD_BATCH_ROWS", 4)
    rng = np.random.default_rng(5)
    rows = [(uuid.uuid4(), rng.standard_normal(3).astype(np.float32)) for _ in range(10)]
    data = binary_copy(rows)
    batches = list(
        vector_memory.copied_rows(data[i : i + piece] for i in range(0, len(data), piece))
    )
    ids = np.concatenate([b[0] for b in batches])
    vectors = np.concatenate([b[1] for b in batches])
    assert [bytes(i) for i in ids] == [r[0].bytes for r in rows]
    assert np.array_equal(vectors, np.array([r[1] for r in rows]))
    # LOAD_BATCH_ROWS at a time as they come in, all at once when they come at once.
    assert [len(b[0]) for b in batches] == ([4, 4, 2] if piece < 42 else [10])
    assert list(vector_memory.copied_rows([binary_copy([])])) == []


@pytest.mark.parametrize(
    "rows",
    [
        [(uuid.uuid4(), [1.0, 0.0]), (uuid.uuid4(), None)],  # a NULL vector
        [(uuid.uuid4(), None), (uuid.uuid4(), [1.0, 0.0])],  # ... in the first row
        [(uuid.uuid4(), [1.0, 0.0]), (uuid.uuid4(), [1.0, 0.0, 0.0])],  # a second dimension
    ],
)
def test_a_binary_copy_of_another_shape_is_refused(rows):
    with pytest.raises(ValueError, match="unexpected shape"):
        list(vector_memory.copied_rows([binary_copy(rows)]))
