"""Database without a ping per transaction: a connection the server dropped is replaced."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from sqlalchemy import text
from sqlalchemy.exc import OperationalError, ProgrammingError

from services.db.session import Database, fetch, make_engine


def backend_pid(db: Database) -> int:
    return db.transact(lambda s: s.execute(text("SELECT pg_backend_pid()")).scalar_one())


def terminate(db: Database, pid: int) -> None:
    db.transact(lambda s: s.execute(text("SELECT pg_terminate_backend(:p)"), {"p": pid}))


@pytest.fixture
def single(settings):
    database = Database(make_engine(settings.database_url or "", pool_size=1))
    yield database
    database.dispose()


def test_a_pooled_connection_the_server_dropped_is_retried_on_a_new_one(settings, db, single):
    dropped = backend_pid(single)  # the one pooled connection
    terminate(db, dropped)

    now = backend_pid(single)

    assert now != dropped
    assert single.transact(lambda s: s.execute(text("SELECT 1")).scalar_one()) == 1


def test_a_dead_connection_is_retried_once_and_then_reported(db, single):
    calls = []

    def work(s):
        calls.append(1)
        # Every attempt's connection dies inside its transaction: nothing was committed.
        terminate(db, s.execute(text("SELECT pg_backend_pid()")).scalar_one())
        s.execute(text("SELECT 1"))

    with pytest.raises(OperationalError):
        single.transact(work)
    assert len(calls) == 2  # the first attempt and one retry, no more


def test_read_commits_each_statement_on_its_own(db):
    def two_ids(s):
        return [s.execute(text("SELECT txid_current()")).scalar_one() for _ in range(2)]

    read = db.read(two_ids)
    transacted = db.transact(two_ids)
    assert read[0] != read[1]
    assert transacted[0] == transacted[1]


def test_read_replaces_a_pooled_connection_the_server_dropped(db, single):
    dropped = single.read(lambda s: s.execute(text("SELECT pg_backend_pid()")).scalar_one())
    terminate(db, dropped)

    now = single.read(lambda s: s.execute(text("SELECT pg_backend_pid()")).scalar_one())

    assert now != dropped


ROWS = text("SELECT n, n * 2 AS twice, :label AS label FROM generate_series(1, :count) AS n")


def test_fetch_gives_the_rows_session_execute_gives(db):
    params = {"label": "dés %s", "count": 3}

    fetched = db.read(lambda s: fetch(s, ROWS, params))
    executed = db.read(lambda s: s.execute(ROWS, params).all())

    assert [tuple(r) for r in fetched] == [tuple(r) for r in executed]
    assert [(r.n, r.twice, r.label) for r in fetched] == [
        (1, 2, "dés %s"),
        (2, 4, "dés %s"),
        (3, 6, "dés %s"),
    ]


def test_fetch_writes_in_the_transaction_it_runs_in(db):
    db.transact(lambda s: s.execute(text("CREATE TABLE IF NOT EXISTS fetch_probe (v text)")))
    write = text("INSERT INTO fetch_probe (v) VALUES (:v)")

    def fail(s):
        assert fetch(s, write, {"v": "rolled back"}) == []  # no rows: an INSERT returns none
        raise RuntimeError("after the insert")

    with pytest.raises(RuntimeError):
        db.transact(fail)
    db.transact(lambda s: fetch(s, write, {"v": "kept"}))

    kept = db.read(lambda s: s.execute(text("SELECT v FROM fetch_probe")).scalars().all())
    db.transact(lambda s: s.execute(text("DROP TABLE fetch_probe")))
    assert kept == ["kept"]


def test_fetch_raises_what_session_execute_raises(db):
    with pytest.raises(ProgrammingError):
        db.read(lambda s: fetch(s, text("SELECT * FROM no_such_table")))


def test_fetch_on_a_connection_the_server_dropped_is_retried_on_a_new_one(db, single):
    pid = text("SELECT pg_backend_pid() AS pid")
    dropped = single.read(lambda s: fetch(s, pid))[0].pid
    terminate(db, dropped)

    now = single.read(lambda s: fetch(s, pid))[0].pid

    assert now != dropped


def test_fetch_invalidates_a_dead_connection_and_says_so(db, single):
    def work(s):
        terminate(db, fetch(s, text("SELECT pg_backend_pid() AS pid"))[0].pid)
        with pytest.raises(OperationalError) as err:
            fetch(s, text("SELECT 1"))
        return err.value.connection_invalidated, s.connection().invalidated

    # Both, so that Database retries the work and the error boundary answers UNAVAILABLE.
    assert single.read(work) == (True, True)


def test_autocommit_commits_each_statement_on_its_own_and_replaces_a_dropped_connection(db, single):
    def two_ids(conn):
        return [conn.execute(text("SELECT txid_current()")).scalar_one() for _ in range(2)]

    first, second = single.autocommit(two_ids)
    assert first != second
    pid = text("SELECT pg_backend_pid() AS pid")
    dropped = single.autocommit(lambda conn: fetch(conn, pid))[0].pid
    terminate(db, dropped)
    assert single.autocommit(lambda conn: fetch(conn, pid))[0].pid != dropped


def test_sessions_read_timestamps_in_utc_whatever_the_server_default(db):
    moment = text(
        "SELECT timestamptz '2026-03-29 01:30:00+02' AS t, current_setting('TimeZone') AS tz"
    )

    row = db.autocommit(lambda conn: fetch(conn, moment))[0]

    assert row.tz == "UTC"
    assert row.t == datetime(2026, 3, 28, 23, 30, tzinfo=UTC)
    assert row.t.tzinfo is UTC
