"""Engines and session factories; sessions are owned by the RPC or the task that opens them."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import psycopg
from psycopg.pq import ExecStatus
from psycopg.rows import namedtuple_row
from sqlalchemy import Connection, Engine, TextClause, create_engine
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, sessionmaker

T = TypeVar("T")
# What the statements of a read run on: an ORM session, or a Core connection (Database.autocommit).
Reader = Session | Connection


def normalize_url(url: str) -> str:
    """Use psycopg 3 for plain postgresql:// URLs, so one driver serves the server and workers."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def make_engine(url: str, *, pool_size: int = 10) -> Engine:
    return create_engine(
        normalize_url(url),
        pool_size=pool_size,
        max_overflow=pool_size,
        # No ping before every transaction (a round trip each): a connection the server closed
        # fails its first statement instead, and Database retries that transaction once.
        # Recycling keeps connections younger than a proxy's or server's idle timeout.
        pool_pre_ping=False,
        pool_recycle=600,
        # A statement that hangs must not hold an RPC or a task forever. Sessions run in UTC,
        # whatever the server's default: psycopg then reads a timestamptz with the fixed UTC
        # offset instead of converting each through a zoneinfo zone (for 'Etc/UTC' that was
        # 2 us a value, half the cost of reading a search's candidate rows).
        connect_args={
            "connect_timeout": 10,
            "options": "-c statement_timeout=60000 -c TimeZone=UTC",
        },
    )


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


class Database:
    """Runs short transactions; async callers get them on a worker thread, off the event loop."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.sessions = make_sessionmaker(engine)

    def transact(self, fn: Callable[[Session], T]) -> T:
        ran = False
        try:
            with self.sessions.begin() as s:
                result = fn(s)
                ran = True
            return result
        except DBAPIError as err:
            # A pooled connection that turned out dead (the server restarted or dropped it)
            # fails on its first use; SQLAlchemy then discards it and every older pooled one,
            # and the transaction runs again once on a fresh connection. A failed COMMIT is
            # not retried: it may have taken effect.
            if ran or not err.connection_invalidated:
                raise
        with self.sessions.begin() as s:
            return fn(s)

    def read(self, fn: Callable[[Session], T]) -> T:
        """Runs fn with every statement committed on its own (autocommit), for reads only.

        No BEGIN and no COMMIT: two round trips fewer than `transact`, which is most of the
        cost of a one-statement read. Each statement sees its own snapshot, and SET LOCAL has
        no effect. A dead pooled connection is retried once, as in `transact`.
        """

        def in_session(conn: Connection) -> T:
            with Session(bind=conn) as s:
                return fn(s)

        return self.autocommit(in_session)

    def autocommit(self, fn: Callable[[Connection], T]) -> T:
        """Runs fn on a Core connection with every statement committed on its own.

        `read` without an ORM session, for the reads an answer starts with: a session took
        more CPU to open and close than a prepared statement took to run (0.07 of 0.18 ms per
        read of one row). A write belongs here only if it is one statement that may run twice,
        since a dead pooled connection is retried once, as in `transact`.
        """
        try:
            return self._autocommit(fn)
        except DBAPIError as err:
            if not err.connection_invalidated:
                raise
        return self._autocommit(fn)

    def _autocommit(self, fn: Callable[[Connection], T]) -> T:
        with self.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            return fn(conn)

    async def run(self, fn: Callable[[Session], T]) -> T:
        return await asyncio.to_thread(self.transact, fn)

    async def run_read(self, fn: Callable[[Session], T]) -> T:
        return await asyncio.to_thread(self.read, fn)

    async def run_autocommit(self, fn: Callable[[Connection], T]) -> T:
        return await asyncio.to_thread(self.autocommit, fn)

    def dispose(self) -> None:
        self.engine.dispose()


_compiled: dict[int, tuple[TextClause, str]] = {}
# Most statements are module constants; a few are made per assistant (search.assistant_text_sql),
# so the SQL kept is bounded.
_COMPILED_MAX = 4096


def _sql(statement: TextClause, dialect: Dialect) -> str:
    # Keyed by identity: each statement is kept alive beside its SQL.
    known = _compiled.get(id(statement))
    if known is None or known[0] is not statement:
        if len(_compiled) >= _COMPILED_MAX:
            _compiled.clear()
        known = (statement, str(statement.compile(dialect=dialect)))
        _compiled[id(statement)] = known
    return known[1]


def connection_of(s: Reader) -> Connection:
    """The Core connection a read runs on."""
    return s.connection() if isinstance(s, Session) else s


def fetch(
    s: Reader,
    statement: TextClause,
    params: Mapping[str, Any] | None = None,
    *,
    prepare: bool | None = None,
) -> list[Any]:
    """The rows of a text() statement as named tuples, run by psycopg on the read's connection.

    For the statements an answer runs: through Session.execute, a search's 64 candidate rows
    took 1.3 ms of CPU, 0.55 ms through psycopg's cursor; the difference is SQLAlchemy's work
    per statement and per row, held under the interpreter lock the event loop needs. Results
    come in Postgres's binary format, which psycopg reads in a third less time than text (a
    real, float4, comes as its exact binary value rather than its shortest decimal). The
    statement is compiled once (parameters become psycopg's %(name)s), and the parameters
    reach psycopg as given, as they do through Session.execute for text(). prepare is psycopg's:
    None prepares the statement on its connection once it has run there a few times, True at
    once, False never (see search.planned_once). Failures are raised
    as Session.execute raises them, a connection found dead invalidated first, so Database
    retries a dead pooled connection as before and the error boundary sees the same types.
    """
    conn = connection_of(s)
    sql = _sql(statement, conn.dialect)
    driver = conn.connection.driver_connection
    try:
        with driver.cursor(row_factory=namedtuple_row, binary=True) as cursor:
            cursor.execute(sql, params, prepare=prepare)
            # The status, not cursor.description: that builds an object for every column.
            result = cursor.pgresult
            return cursor.fetchall() if result and result.status == ExecStatus.TUPLES_OK else []
    except psycopg.Error as err:
        dead = conn.dialect.is_disconnect(err, driver, None)
        if dead:
            conn.invalidate(err)
        raise DBAPIError.instance(
            sql, params, err, psycopg.Error, connection_invalidated=dead, dialect=conn.dialect
        ) from err
