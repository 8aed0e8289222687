"""Alembic environment: online migrations only, serialised by an advisory lock.

Two ways in: `footnote migrate` (and the server and workers at start) pass the URL in the
config; the `alembic` command with the repository's alembic.ini leaves it empty, and the URL
comes from FOOTNOTE_DATABASE_URL.
"""

from __future__ import annotations

import os
from logging.config import fileConfig

from alembic import context
from sqlalchemy import create_engine, pool, text

from services.db.models import Base
from services.db.session import normalize_url

# Any constant works; it only has to be the same for every process that migrates.
MIGRATION_LOCK_ID = 0x466F6F74

config = context.config
target_metadata = Base.metadata


def database_url() -> str:
    url = config.get_main_option("sqlalchemy.url") or os.environ.get("FOOTNOTE_DATABASE_URL", "")
    if not url:
        raise SystemExit("set FOOTNOTE_DATABASE_URL to the database to migrate")
    return normalize_url(url)


def run_migrations_online() -> None:
    engine = create_engine(database_url(), poolclass=pool.NullPool)
    with engine.connect() as connection:
        # The server and the workers migrate at start; the lock stops them racing.
        connection.execute(text("SELECT pg_advisory_lock(:id)"), {"id": MIGRATION_LOCK_ID})
        connection.commit()
        try:
            context.configure(connection=connection, target_metadata=target_metadata)
            with context.begin_transaction():
                context.run_migrations()
            connection.commit()
        finally:
            connection.execute(text("SELECT pg_advisory_unlock(:id)"), {"id": MIGRATION_LOCK_ID})
            connection.commit()


if config.config_file_name is not None:
    # Only the alembic command has an ini file; a server or worker keeps its own logging.
    fileConfig(config.config_file_name, disable_existing_loggers=False)
run_migrations_online()
