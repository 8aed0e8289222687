"""Hybrid search over chunks indexed by the real pipeline."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import text

from footnote.v1 import assistants_service_pb2 as apb
from footnote.v1 import assistants_service_pb2_grpc as apb_grpc
from footnote.v1 import documents_service_pb2 as pb
from footnote.v1 import documents_service_pb2_grpc as pb_grpc
from services.assistants.domain import get_settings
from services.citations import ScoreKind
from services.db.session import Database, make_engine
from services.retrieval import indexes
from services.retrieval import search as searching
from services.retrieval.embeddings import create_embedder
from services.retrieval.fusion import fuse
from services.retrieval.search import hybrid_search, start_search
from services.retrieval.table_stats import TermShares
from tests.support import bearer, ingest

pytestmark = pytest.mark.usefixtures("worker")

LEAVE = b"""# Leave policy

## Annual leave
Everyone gets 25 days of paid annual leave each year. Unused days expire in March.

## Sick leave
Tell your manager before 10:00 on the first day you are sick.
"""
COFFEE = b"""# Kitchen

The espresso machine is descaled every Friday. Oat milk is on the second shelf.
"""


@pytest.fixture(scope="module")
def embedder():
    return create_embedder()


async def make_assistant(channel, key: str) -> str:
    stub = apb_grpc.AssistantsServiceStub(channel)
    made = await stub.CreateAssistant(
        apb.CreateAssistantRequest(assistant=apb.Assistant(display_name="search")),
        metadata=bearer(key),
    )
    return made.id


def search(db, embedder, tenant, assistant_id, query, top_k=5, threshold=0.0):
    vector = embedder.embed_query(query)
    return db.transact(
        lambda s: hybrid_search(
            s,
            tenant_id=tenant,
            assistant_id=assistant_id,
            query=query,
            query_vector=vector,
            top_k=top_k,
            score_threshold=threshold,
        )
    )


def test_ties_are_broken_by_the_tie_key_read_for_tied_items_only():
    score = {"a": 1, "b": 2, "c": 2, "d": 3, "e": 3, "f": 3}.__getitem__
    names = {"a": "z", "b": "y", "c": "x", "d": "m", "e": "o", "f": "n"}
    read = []

    def tie_key(item):
        read.append(item)
        return names[item]

    ranked = sorted("abcdef", key=score)
    assert searching.ties_broken(ranked, score, tie_key) == ["a", "c", "b", "d", "f", "e"]
    assert sorted(read) == ["b", "c", "d", "e", "f"]  # "a" has no tie


def test_fuse_rewards_agreement():
    a, b, c = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    scores = fuse([[a, b], [b, c]], k=60)
    assert scores[b] == pytest.approx(1 / 62 + 1 / 61)
    assert scores[b] > scores[a] > scores[c]


async def test_search_finds_the_right_chunk_with_provenance(channel, make_key, db, embedder):
    tenant = "search-" + uuid.uuid4().hex[:6]
    key = make_key(tenant)
    assistant = await make_assistant(channel, key)
    docs = pb_grpc.DocumentsServiceStub(channel)
    leave = await ingest(docs, key, assistant, "leave.md", LEAVE)
    await ingest(docs, key, assistant, "kitchen.md", COFFEE)

    hits = search(db, embedder, tenant, assistant, "How many vacation days do I get per year?")
    assert hits, "nothing found"
    best = hits[0]
    assert best.document_id == leave.id and "25 days" in best.text
    assert best.score_kind == ScoreKind.FUSED
    assert best.location.heading.endswith("Annual leave")
    assert best.location.start_line >= 1 and best.document_sha256 == leave.sha256
    assert 0.3 < best.score <= 1.0
    scores = [h.score for h in hits]
    assert scores == sorted(scores, reverse=True)

    assert len(search(db, embedder, tenant, assistant, "espresso", top_k=1)) == 1
    # score_threshold 1.0 needs a chunk ranked first in both lists.
    strict = search(db, embedder, tenant, assistant, "espresso machine descaled", threshold=1.0)
    assert [h.text for h in strict] and all("espresso" in h.text for h in strict)


async def test_search_is_scoped_to_tenant_and_assistant(channel, make_key, db, embedder):
    tenant = "scope-" + uuid.uuid4().hex[:6]
    key = make_key(tenant)
    mine, other = await make_assistant(channel, key), await make_assistant(channel, key)
    docs = pb_grpc.DocumentsServiceStub(channel)
    await ingest(docs, key, other, "leave.md", LEAVE)
    assert search(db, embedder, tenant, mine, "annual leave days") == []
    assert search(db, embedder, "someone-else", other, "annual leave days") == []
    assert search(db, embedder, tenant, other, "annual leave days") != []


async def test_deleted_document_is_not_found_by_search(channel, make_key, db, embedder):
    tenant = "del-" + uuid.uuid4().hex[:6]
    key = make_key(tenant)
    assistant = await make_assistant(channel, key)
    docs = pb_grpc.DocumentsServiceStub(channel)
    leave = await ingest(docs, key, assistant, "leave.md", LEAVE)
    assert search(db, embedder, tenant, assistant, "sick leave manager")
    await docs.DeleteDocument(pb.DeleteDocumentRequest(id=leave.id), metadata=bearer(key))
    assert search(db, embedder, tenant, assistant, "sick leave manager") == []


THIRD = b"""# Travel

Book trains through the travel portal. Flights over 500 EUR need approval.
"""


async def test_the_same_bytes_uploaded_twice_appear_once(channel, make_key, db, embedder):
    tenant = "dup-" + uuid.uuid4().hex[:6]
    key = make_key(tenant)
    assistant = await make_assistant(channel, key)
    docs = pb_grpc.DocumentsServiceStub(channel)
    first = await ingest(docs, key, assistant, "leave.md", LEAVE)
    copy = await ingest(docs, key, assistant, "leave (1).md", LEAVE)
    await ingest(docs, key, assistant, "kitchen.md", COFFEE)
    assert copy.state == pb.DOCUMENT_STATE_READY and copy.id != first.id

    hits = search(db, embedder, tenant, assistant, "How many days of annual leave?", top_k=8)
    texts = [h.text for h in hits]
    assert len(texts) == len(set(texts)), "a passage appears twice among the sources"
    assert {h.document_id for h in hits if "25 days" in h.text} == {first.id}

    # Both uploads stay documents of their own; deleting one leaves the other searchable.
    await docs.DeleteDocument(pb.DeleteDocumentRequest(id=first.id), metadata=bearer(key))
    hits = search(db, embedder, tenant, assistant, "How many days of annual leave?", top_k=8)
    assert {h.document_id for h in hits if "25 days" in h.text} == {copy.id}


async def test_copies_that_fill_the_best_text_matches_leave_room_for_others(channel, make_key, db):
    # Five uploads of the same file tie for the best full-text rank; only the first is
    # servable. Full text looks up the documents of its leading matches only, and when the
    # filters leave too few of those, it filters every ranked match instead: the other file
    # must still be found, as ranking every servable match finds it.
    tenant = "copies-" + uuid.uuid4().hex[:6]
    key = make_key(tenant)
    assistant = await make_assistant(channel, key)
    docs = pb_grpc.DocumentsServiceStub(channel)
    for n in range(5):
        await ingest(docs, key, assistant, f"leave ({n}).txt", b"Annual leave is 25 days.")
    await ingest(docs, key, assistant, "kitchen.md", COFFEE)

    def names(limit):
        question = "annual leave on Friday"  # two terms of the copies, one of the kitchen's
        rows = db.read(lambda s: searching.text_candidates(s, tenant, assistant, question, limit))
        return [r.display_name for r in rows]

    assert names(2) == ["leave (0).txt", "kitchen.md"]
    assert names(20) == ["leave (0).txt", "kitchen.md"]


async def test_leading_matches_none_of_them_servable_leave_room_for_others(channel, make_key, db):
    # The two best full-text matches are in documents deleted and not yet purged. Full text
    # filters its leading matches only; when none of those is servable, it must still return
    # the next servable match, as ranking every match finds it.
    tenant = "unservable-" + uuid.uuid4().hex[:6]
    key = make_key(tenant)
    assistant = await make_assistant(channel, key)
    docs = pb_grpc.DocumentsServiceStub(channel)
    gone = [
        (await ingest(docs, key, assistant, f"leave {n}.txt", f"Annual leave: {n}.".encode())).id
        for n in range(2)
    ]
    await ingest(docs, key, assistant, "kitchen.md", COFFEE)
    db.transact(
        lambda s: s.execute(
            text("UPDATE documents SET delete_time = now() WHERE id = ANY(CAST(:ids AS uuid[]))"),
            {"ids": gone},
        )
    )

    def names(limit):
        question = "annual leave on Friday"  # two terms of the deleted files, one of the kitchen's
        rows = db.read(lambda s: searching.text_candidates(s, tenant, assistant, question, limit))
        return [r.display_name for r in rows]

    assert names(1) == ["kitchen.md"]
    assert names(20) == ["kitchen.md"]


async def test_ranking_does_not_depend_on_upload_order_or_ids(channel, make_key, db, embedder):
    tenant = "order-" + uuid.uuid4().hex[:6]
    key = make_key(tenant)
    docs = pb_grpc.DocumentsServiceStub(channel)
    rankings = []
    for files in (
        [("leave.md", LEAVE), ("kitchen.md", COFFEE), ("travel.md", THIRD)],
        [("travel.md", THIRD), ("kitchen.md", COFFEE), ("leave.md", LEAVE)],
    ):
        assistant = await make_assistant(channel, key)
        for name, data in files:
            await ingest(docs, key, assistant, name, data)
        rankings.append(
            [
                [(h.document_name, h.chunk_index, h.score) for h in search(db, embedder, tenant,
                                                                            assistant, q, 8)]
                for q in ("leave days", "who approves flights", "milk", "the")
            ]
        )  # fmt: skip
    assert rankings[0] == rankings[1]
    assert all(rankings[0][:3])


async def test_titles_and_headings_are_searched_but_never_quoted(channel, make_key, db):
    from sqlalchemy import text

    tenant = "tsv-" + uuid.uuid4().hex[:6]
    key = make_key(tenant)
    assistant = await make_assistant(channel, key)
    docs = pb_grpc.DocumentsServiceStub(channel)
    body = ("Access ends when the agreement lapses. " * 60).encode()
    doc = await ingest(
        docs, key, assistant, "contract.md", b"# Contract\n\n## Termination\n\n" + body
    )
    rows = db.transact(
        lambda s: s.execute(
            text(
                "SELECT chunk_index, text, context, tsv::text AS tsv FROM chunks "
                "WHERE document_id = :d ORDER BY chunk_index"
            ),
            {"d": uuid.UUID(doc.id)},
        ).all()
    )
    assert len(rows) > 1
    later = rows[-1]
    assert "Termination" not in later.text and "Contract" not in later.text
    assert later.context == "contract > Contract > Termination"
    # The heading's term is weighted A in a chunk whose own text never says it.
    assert "'termin':" in later.tsv and "A" in later.tsv.split("'termin':")[1].split(" ")[0]
    assert "'access':" in later.tsv


QUESTIONS = ("How many vacation days?", "espresso machine", "sick leave")


async def assert_both_searches_agree(channel, make_key, db, embedder, tenant, questions):
    """The concurrent search outside a transaction finds what the one-transaction search does."""
    key = make_key(tenant)
    assistant = await make_assistant(channel, key)
    docs = pb_grpc.DocumentsServiceStub(channel)
    await ingest(docs, key, assistant, "leave.md", LEAVE)
    await ingest(docs, key, assistant, "kitchen.md", COFFEE)
    for question in questions:
        sequential = search(db, embedder, tenant, assistant, question)

        async def vector(q=question):
            return embedder.embed_query(q)

        started = start_search(
            db,
            tenant_id=tenant,
            assistant_id=assistant,
            query=question,
            query_vector=vector(),
            top_k=5,
        )
        concurrent = await started.chunks
        assert concurrent == sequential
        assert concurrent, question
        # The full-text statement read the assistant's row as the settings' read does, and
        # no answer is stored for a request without a request_id.
        read = db.read(lambda s: get_settings(s, tenant, assistant))
        seen = started.text.result()
        assert seen.assistant_version == read.version and not seen.answered


async def test_concurrent_search_returns_what_sequential_search_returns(
    channel, make_key, db, embedder
):
    tenant = "conc-" + uuid.uuid4().hex[:6]
    await assert_both_searches_agree(
        channel, make_key, db, embedder, tenant, (*QUESTIONS, "zzz qqq")
    )


async def test_hnsw_search_outside_a_transaction_matches_the_transaction(
    channel, make_key, db, embedder, monkeypatch
):
    # Every assistant searched through HNSW: the settings are then set per connection by
    # `search` and per transaction by `hybrid_search`, and both must find the same chunks.
    monkeypatch.setattr(searching, "EXACT_MAX_CHUNKS", -1)
    monkeypatch.setattr(indexes, "MAX_SHARE", 0.0)  # no index of its own: the shared one
    tenant = "hnsw-" + uuid.uuid4().hex[:6]
    await assert_both_searches_agree(channel, make_key, db, embedder, tenant, QUESTIONS)


def test_search_settings_outside_a_transaction_stay_with_the_connection(settings):
    single = Database(make_engine(settings.database_url or "", pool_size=1))

    def shown(s):
        # current_setting(..., true): hnsw.* is unknown until pgvector is loaded in the session.
        return tuple(
            s.execute(
                text(
                    "SELECT current_setting('hnsw.ef_search', true),"
                    " current_setting('hnsw.iterative_scan', true)"
                )
            ).one()
        )

    wanted = (str(searching.EF_SEARCH), searching.ITERATIVE_SCAN)

    def vector_settings(s):
        searching.use_search_settings(s, searching.EF_SEARCH)

    try:
        assert single.read(shown) != wanted
        in_transaction = single.transact(lambda s: (vector_settings(s), shown(s)))
        assert in_transaction[1] == wanted
        assert single.read(shown) != wanted  # a transaction's settings end with it
        single.read(vector_settings)
        assert single.read(shown) == wanted
        assert single.transact(shown) == wanted
        # FOOTNOTE_HNSW_EF_SEARCH: a connection that remembers the old value takes the new.
        searching.configure(ef_search=250)
        single.read(vector_settings)
        assert single.read(shown) == ("250", searching.ITERATIVE_SCAN)
    finally:
        searching.configure(ef_search=int(wanted[0]))
        single.dispose()


def prepared(db: Database) -> list[str]:
    """The statements prepared on the database's one pooled connection."""
    return db.read(
        lambda s: list(s.execute(text("SELECT statement FROM pg_prepared_statements")).scalars())
    )


async def test_only_a_small_assistant_s_searches_share_a_plan(
    channel, make_key, settings, embedder, monkeypatch
):
    tenant = "plans-" + uuid.uuid4().hex[:6]
    key = make_key(tenant)
    assistant = await make_assistant(channel, key)
    await ingest(pb_grpc.DocumentsServiceStub(channel), key, assistant, "leave.md", LEAVE)
    single = Database(make_engine(settings.database_url or "", pool_size=1))
    vector = embedder.embed_query("annual leave")

    def search(s):
        return searching.hybrid_search(
            s, tenant_id=tenant, assistant_id=assistant, query="annual leave",
            query_vector=vector, top_k=4,
        )  # fmt: skip

    try:
        small = single.read(search)
        assert any("ts_rank" in sql for sql in prepared(single))
        assert any("<=>" in sql for sql in prepared(single))
        single.read(lambda s: s.execute(text("DEALLOCATE ALL")))
        single.dispose()  # psycopg forgets what it prepared with the connection
        # Searched through HNSW: each vector statement planned for its own values, never
        # prepared; the full-text statement prepared for this assistant alone, which Postgres
        # then plans once.
        monkeypatch.setattr(searching, "EXACT_MAX_CHUNKS", -1)
        monkeypatch.setattr(searching, "_sizes", {})
        large = single.read(search)
        assert not any("<=>" in sql for sql in prepared(single))
        (full_text,) = [sql for sql in prepared(single) if "ts_rank" in sql]
        assert f"CAST('{assistant}' AS uuid)" in full_text
        assert [c.chunk_id for c in large] == [c.chunk_id for c in small]
        for _ in range(6):  # Postgres weighs a generic plan after five planned for the values
            assert [c.chunk_id for c in single.read(search)] == [c.chunk_id for c in small]
        plans = single.read(
            lambda s: s.execute(
                text("SELECT generic_plans FROM pg_prepared_statements WHERE statement LIKE :own"),
                {"own": f"%CAST('{assistant}' AS uuid)%"},
            ).scalar_one()
        )
        assert plans > 0
    finally:
        single.dispose()


def test_a_walk_of_a_large_index_is_wider(monkeypatch):
    assert searching.ef_search_for(10_000) == searching.EF_SEARCH
    assert searching.ef_search_for(searching.LARGE_CHUNKS) == searching.EF_SEARCH
    assert searching.ef_search_for(searching.LARGE_CHUNKS + 1) == searching.LARGE_EF_SEARCH
    # The operator's setting still rules when it asks for more.
    monkeypatch.setattr(searching, "EF_SEARCH", 500)
    assert searching.ef_search_for(searching.LARGE_CHUNKS + 1) == 500


async def test_the_vector_query_walks_as_wide_as_its_index_needs(
    channel, make_key, db, embedder, monkeypatch
):
    tenant = "wide-" + uuid.uuid4().hex[:6]
    key = make_key(tenant)
    assistant = await make_assistant(channel, key)
    await ingest(pb_grpc.DocumentsServiceStub(channel), key, assistant, "leave.md", LEAVE)
    vector = embedder.embed_query("annual leave")

    def walked(s):
        searching._sizes.clear()
        searching.vector_candidates(s, tenant, assistant, vector, 5)
        return s.execute(text("SHOW hnsw.ef_search")).scalar()

    assert db.read(walked) == str(searching.EF_SEARCH)
    monkeypatch.setattr(searching, "LARGE_CHUNKS", 0)  # any index is a large one
    assert db.read(walked) == str(searching.EF_SEARCH)  # searched exactly: no index walked
    # On the index over every chunk (as a large assistant is), it walks wider.
    monkeypatch.setattr(searching, "EXACT_MAX_CHUNKS", -1)
    monkeypatch.setattr(indexes, "MAX_SHARE", 0.0)
    assert db.read(walked) == str(searching.LARGE_EF_SEARCH)


def choose(db, query, common, shares, floor, chunks, budget):
    params = {
        "query": query,
        "common": "{" + ",".join(common) + "}",
        "shares": "{" + ",".join(map(str, shares)) + "}",
        "floor": floor,
        "chunks": chunks,
        "budget": budget,
        "rank_terms": searching.TEXT_RANK_TERMS,
        "rank_share": searching.TEXT_RANK_MAX_SHARE,
    }
    return db.read(lambda s: s.execute(searching.CHOSEN_TERMS_SQL, params).scalar_one())


def test_the_rarest_terms_are_kept_within_the_budget(db):
    common, shares = ["common", "leav", "annual"], [0.9, 0.3, 0.05]
    question = "The common annual leave, sick leave"  # "the" is a stop word
    # 1,000 chunks: "sick" (unknown, so rarer than all listed) 10, "annual" 50, "leav" 300.
    assert choose(db, question, common, shares, 0.01, 1000, 100) == "'sick' | 'annual'"
    assert choose(db, question, common, shares, 0.01, 1000, 400) == ("'sick' | 'annual' | 'leav'")
    # A small assistant keeps every term; a huge one still keeps the rarest.
    assert choose(db, question, common, shares, 0.01, 50, 100) == (
        "'sick' | 'annual' | 'leav' | 'common'"
    )
    assert choose(db, question, common, shares, 0.01, 10**7, 100) == "'sick'"
    assert choose(db, "the and of", common, shares, 0.01, 1000, 100) is None


def test_candidates_are_ranked_by_at_most_the_rarest_rank_terms(db, monkeypatch):
    # A question pasted with a page of text ranks by its rarest terms only: ts_rank looks
    # every ranking term up in every candidate.
    words = [f"k{i:02d}x" for i in range(40)]  # words with digits are not stemmed
    common = words[:8]  # listed as common, so the other 32 are the rarest
    params = {
        "query": " ".join(words),
        "common": "{" + ",".join(common) + "}",
        "shares": "{" + ",".join("0.5" for _ in common) + "}",
        "floor": 0.01,
        "chunks": 1000,
        "budget": 1000,
        "rank_terms": 32,
        "rank_share": 1.0,
    }
    every = text(f"WITH {searching.CHOSEN_TERMS} SELECT CAST(every AS text) FROM chosen")
    ranking = db.read(lambda s: s.execute(every, params).scalar_one()).split(" | ")
    assert sorted(t.strip("'") for t in ranking) == sorted(words[8:])
    # The search passes the module's cap.
    monkeypatch.setattr(searching, "term_frequencies", lambda s: TermShares({}))
    monkeypatch.setattr(searching, "assistant_chunks", lambda s, t, a: 1000)
    chosen = searching.term_choice(None, "t", "a", "q")
    assert chosen["rank_terms"] == searching.TEXT_RANK_TERMS
    assert chosen["rank_share"] == searching.TEXT_RANK_MAX_SHARE


def test_terms_in_many_chunks_do_not_rank(db):
    # "leav" is in half the chunks, "annual" in 5%, "sick" unknown (rarer than all listed).
    every = text(f"WITH {searching.CHOSEN_TERMS} SELECT CAST(every AS text) FROM chosen")
    params = {
        "common": "{leav,annual}",
        "shares": "{0.5,0.05}",
        "floor": 0.001,
        "chunks": 1000,
        "budget": 10,
        "rank_terms": 32,
        "rank_share": 0.1,
    }

    def ranking(query):
        return db.read(lambda s: s.execute(every, {**params, "query": query}).scalar_one())

    assert ranking("sick annual leave") == "'sick' | 'annual'"
    # The rarest term of the question ranks however common it is.
    assert ranking("leave") == "'leav'"


def test_a_smaller_assistant_ranks_at_most_half_its_chunks(monkeypatch):
    monkeypatch.setattr(searching, "term_frequencies", lambda s: TermShares({}))
    for chunks, budget in ((40, 64), (1000, 500), (10**6, searching.TEXT_BUDGET_ROWS)):
        monkeypatch.setattr(searching, "assistant_chunks", lambda s, t, a, n=chunks: n)
        assert searching.term_choice(None, "t", "a", "leave")["budget"] == budget


async def test_terms_left_out_of_the_candidates_still_rank_them(channel, make_key, db, monkeypatch):
    # In 10,000 chunks "leave" and "day" are expected in 950 each, over the row budget, so only
    # "sick" chooses the candidates; but they are in under a tenth of the chunks, so they rank,
    # and the candidate that also says "leave" and "days" is the better match.
    # (Ranked by the chosen term alone, the two tie and the names decide: a.txt first.)
    tenant = "rank-" + uuid.uuid4().hex[:6]
    key = make_key(tenant)
    assistant = await make_assistant(channel, key)
    docs = pb_grpc.DocumentsServiceStub(channel)
    await ingest(docs, key, assistant, "a.txt", b"Sick notes go to the office.")
    await ingest(docs, key, assistant, "b.txt", b"Sick leave is ten days a year.")
    await ingest(docs, key, assistant, "c.txt", b"Annual leave is 25 days.")
    stats = TermShares({"leav": 0.095, "day": 0.095}, 0.01)
    monkeypatch.setattr(searching, "term_frequencies", lambda s: stats)
    size = searching.AssistantSize(10_000, exact=False, index_chunks=10_000)
    monkeypatch.setattr(searching, "assistant_size", lambda s, t, a: size)
    question = "sick leave days"
    assert choose(db, question, ["leav", "day"], [0.095, 0.095], 0.01, 10_000, 1000) == "'sick'"
    rows = db.read(lambda s: searching.text_candidates(s, tenant, assistant, question, 20))
    assert [r.display_name for r in rows] == ["b.txt", "a.txt"]


def test_terms_are_quoted_for_tsquery(db):
    # Lexemes with characters that tsquery input would read as syntax, or split again.
    question = "e-mail a@b.example /usr/local v1.2.3 o'neil x:y back\\slash (and) !not"
    chosen = choose(db, question, [], [], 0.01, 10, 10**6)
    lexemes = db.read(
        lambda s: s.execute(
            text("SELECT tsvector_to_array(to_tsvector('english', :q))"), {"q": question}
        ).scalar_one()
    )
    parsed = db.read(
        lambda s: s.execute(
            text("SELECT querytree(CAST(:c AS tsquery))"), {"c": chosen}
        ).scalar_one()
    )
    assert parsed == chosen
    assert sorted(chosen.split(" | ")) == sorted(
        "'" + t.replace("\\", "\\\\").replace("'", "''") + "'" for t in lexemes
    )


def test_a_vector_sent_in_binary_is_the_vector_written_as_text(db, embedder):
    vectors = [
        embedder.embed_query("annual leave"),
        [-1.0, 0.0, 1e-30, 3.4e38, -2.5e-7, 0.1, 1 / 3, 2**-149] + [0.0] * 376,
    ]

    def both(s, vector):
        sql = text("SELECT CAST(:q AS vector)::text")
        binary = s.execute(sql, {"q": searching.vector_parameter(s, vector)}).scalar()
        written = s.execute(sql, {"q": searching.vector_literal(vector)}).scalar()
        return binary, written

    for vector in vectors:
        binary, written = db.read(lambda s, v=vector: both(s, v))
        assert binary == written
        assert binary.count(",") == len(vector) - 1
