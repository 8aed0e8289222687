"""The worker that makes a new deployment's first document READY analyses chunks and documents.

Autovacuum analyses a table only once 50 rows and a tenth of it have changed, at most once a
minute: a deployment's first few documents would be searched without full-text statistics,
and planned without counts (services/retrieval/table_stats.py). The test needs a database no
one has analysed, so it makes one, with a worker of its own on a broker of its own.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine, text

from services.db import migrate
from services.db.session import Database, make_engine, normalize_url
from services.retrieval import table_stats
from tests.conftest import kill_group, start_worker, wait_worker_ready, worker_env
from tests.support import stored_document
from tests.workers.test_failures import document, send_ingest, wait_for


@pytest.fixture
def new_database(settings) -> Iterator[str]:
    name = "fnstats_" + uuid.uuid4().hex[:8]
    admin = create_engine(normalize_url(settings.database_url), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f"CREATE DATABASE {name}"))
    url = settings.database_url.rsplit("/", 1)[0] + "/" + name
    migrate.upgrade(url)
    try:
        yield url
    finally:
        with admin.connect() as conn:
            conn.execute(text(f"DROP DATABASE {name} WITH (FORCE)"))
        admin.dispose()


def test_the_first_ready_document_leaves_statistics_of_chunks_and_documents(
    new_database, settings, storage, private_broker, tmp_path
):
    db = Database(make_engine(new_database, pool_size=1))
    env = worker_env(settings, FOOTNOTE_BROKER_URL=private_broker)
    env["FOOTNOTE_DATABASE_URL"] = new_database
    worker = start_worker(env, tmp_path / "worker.log", queues="ingest")
    try:
        wait_worker_ready(private_broker)
        text_of_note = b"# Leave\n\nSick leave is ten days a year. Annual leave is 25 days.\n"
        doc_id = stored_document(db, storage, "stats", text_of_note, "leave.md")
        send_ingest(private_broker, doc_id)
        ready = wait_for(
            lambda: (d := document(db, doc_id)).state in ("READY", "FAILED") and d, 60, "READY"
        )
        assert ready.state == "READY", ready.error

        def analysed() -> set[str]:
            return db.read(
                lambda s: set(
                    s.execute(
                        text(
                            "SELECT DISTINCT tablename FROM pg_stats"
                            " WHERE schemaname = current_schema()"
                        )
                    ).scalars()
                )
            )

        # Far fewer chunks than autovacuum waits for: the task analyses them after READY.
        wait_for(lambda: {"chunks", "documents"} <= analysed(), 30, "statistics of both tables")
        stats = db.read(lambda s: s.execute(table_stats.TERM_STATS_SQL).first())
    finally:
        kill_group(worker)
        db.dispose()
    assert ready.chunk_count < 50
    assert stats is not None and "leav" in stats.terms
