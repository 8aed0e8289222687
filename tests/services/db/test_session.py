"""Database without a ping per transaction: a connection the server dropped is replaced."""

from __future__ import annotations

import pytest
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from services.db.session import Database, make_engine


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
