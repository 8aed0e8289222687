"""Engines and session factories; sessions are owned by the RPC or the task that opens them."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

from sqlalchemy import Engine, create_engine
from sqlalchemy.orm import Session, sessionmaker

T = TypeVar("T")


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
        pool_pre_ping=True,
        pool_recycle=1800,
        # A statement that hangs must not hold an RPC or a task forever.
        connect_args={"connect_timeout": 10, "options": "-c statement_timeout=60000"},
    )


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


class Database:
    """Runs short transactions; async callers get them on a worker thread, off the event loop."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.sessions = make_sessionmaker(engine)

    def transact(self, fn: Callable[[Session], T]) -> T:
        with self.sessions.begin() as s:
            return fn(s)

    async def run(self, fn: Callable[[Session], T]) -> T:
        return await asyncio.to_thread(self.transact, fn)

    def dispose(self) -> None:
        self.engine.dispose()
