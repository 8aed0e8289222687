"""Table statistics: analysed when missing or outgrown; term shares re-read soon while missing.

Each test gets a schema of its own holding bare `chunks` and `documents` tables, so what the
session's other tests stored (and analysed) does not count.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import Connection, text
from sqlalchemy.orm import Session

from services.db.session import make_engine
from services.retrieval import table_stats


@pytest.fixture
def own_chunks(settings) -> Iterator[Connection]:
    """A connection whose search path finds new, empty `chunks` and `documents` tables first (an
    engine of its own: a pooled connection would keep that search path for the next test)."""
    schema = "stats_" + uuid.uuid4().hex[:8]
    engine = make_engine(settings.database_url, pool_size=1)
    try:
        with engine.connect() as conn:
            conn.execute(text(f"CREATE SCHEMA {schema}"))
            conn.execute(text(f"CREATE TABLE {schema}.chunks (tsv tsvector)"))
            conn.execute(text(f"CREATE TABLE {schema}.documents (name text)"))
            conn.execute(text(f"SET search_path = {schema}"))
            conn.commit()
            try:
                yield conn
            finally:
                conn.rollback()
                conn.execute(text(f"DROP SCHEMA {schema} CASCADE"))
                conn.commit()
    finally:
        engine.dispose()


def add_chunks(conn: Connection, count: int, words: str) -> None:
    conn.execute(
        text("INSERT INTO chunks SELECT to_tsvector('english', :w) FROM generate_series(1, :n)"),
        {"w": words, "n": count},
    )
    # Reported to the statistics system once this session is idle, not up to 10 s later.
    conn.execute(text("SELECT pg_stat_force_next_flush()"))
    conn.commit()


def wait_until(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not (outcome := predicate()) and time.monotonic() < deadline:
        time.sleep(0.1)
    return outcome


def add_documents(conn: Connection, count: int) -> None:
    conn.execute(
        text("INSERT INTO documents SELECT 'doc' || n FROM generate_series(1, :n) n"), {"n": count}
    )
    conn.commit()


def test_tables_are_analysed_when_new_and_when_doubled(own_chunks):
    conn = own_chunks
    add_documents(conn, 3)
    add_chunks(conn, 20, "annual leave requests")
    assert table_stats.analyze_when_grown(conn) == ["chunks", "documents"]  # never analysed
    assert table_stats.analyze_when_grown(conn) == []  # nothing changed since
    # Fewer new rows than it held: autovacuum's business (a tenth of the table, within a minute).
    add_chunks(conn, 10, "sick leave")
    time.sleep(0.3)
    assert table_stats.analyze_when_grown(conn) == []
    # As many changed rows as it held at its analysis: analysed again, with the new words.
    add_chunks(conn, 15, "sick leave")
    assert wait_until(lambda: table_stats.analyze_when_grown(conn)) == ["chunks"]
    terms = conn.execute(table_stats.TERM_STATS_SQL).one().terms
    assert "sick" in terms and "annual" in terms


def test_a_busy_table_is_left_for_later(own_chunks, db):
    add_documents(own_chunks, 3)
    add_chunks(own_chunks, 5, "leave")
    schema = own_chunks.execute(text("SELECT current_schema()")).scalar_one()
    own_chunks.commit()
    with db.engine.connect() as other:
        # What an index build or another ANALYZE holds until it ends.
        other.execute(text(f"LOCK TABLE {schema}.chunks IN SHARE UPDATE EXCLUSIVE MODE"))
        began = time.monotonic()
        assert table_stats.analyze_when_grown(own_chunks) == ["documents"]
        assert time.monotonic() - began < 5
        other.rollback()
    assert table_stats.analyze_when_grown(own_chunks) == ["chunks"]


def test_missing_statistics_are_read_again_within_seconds(own_chunks, monkeypatch):
    clock = [1_000.0]
    monkeypatch.setattr(table_stats.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(table_stats, "_term_stats", {})
    session = Session(bind=own_chunks)
    add_chunks(own_chunks, 10, "annual leave")
    assert table_stats.term_frequencies(session) == table_stats.TermShares({}, 0.0)
    assert table_stats.analyze_when_grown(own_chunks)
    clock[0] += table_stats.TERM_STATS_MISSING_SECONDS + 1
    stats = table_stats.term_frequencies(session)
    assert stats.shares["annual"] > 0 and stats.floor > 0
    # Statistics found are kept for longer: a new analysis is read TERM_STATS_SECONDS later.
    add_chunks(own_chunks, 20, "sick days")
    own_chunks.execute(text("ANALYZE chunks"))
    own_chunks.commit()
    clock[0] += table_stats.TERM_STATS_MISSING_SECONDS + 1
    assert table_stats.term_frequencies(session) == stats
    clock[0] += table_stats.TERM_STATS_SECONDS
    assert "sick" in table_stats.term_frequencies(session).shares


QUESTIONS = [
    "Xft uses these names: FT_Face, FT_Library, and SIMPLEQ_EMPTY entries",
    "gcloud alpha network-services tls-routes list --sort-by=NAME",
    "Which policies apply to the family's libraries, and to state-of-the-art skies?",
    "mail root@example.com or see https://example.org/a/b.html and /usr/local/bin",
    "version 1.2.3, -42.5e3 and 0x1F; dying, lying and ugly early singly",
    "Naïve café déjà vu: Über STRASSE",
    # Postgres stems these shorter than our Snowball ("organ", "intern", "interv") and splits
    # letters from the digits before them ("bsd").
    "Conforming to 4.3BSD, the organization's internal interval",
]


@pytest.mark.parametrize("question", QUESTIONS)
def test_the_shares_given_cover_every_lexeme_postgres_finds(db, question):
    lexemes = db.read(
        lambda s: s.execute(
            text("SELECT tsvector_to_array(to_tsvector('english', :q))"), {"q": question}
        ).scalar_one()
    )
    stats = table_stats.TermShares({**dict.fromkeys(lexemes, 0.1), "unrelated": 0.2}, 0.01)
    terms, shares = stats.of(question)
    assert set(terms) == set(lexemes)  # every one, and nothing the question cannot hold
    assert shares == [0.1] * len(terms)
