"""Alembic environment: online migrations only, serialised by an advisory lock."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine, pool, text

from services.db.models import Base

# Any constant works; it only has to be the same for every process that migrates.
MIGRATION_LOCK_ID = 0x466F6F74

config = context.config
target_metadata = Base.metadata


def run_migrations_online() -> None:
    engine = create_engine(config.get_main_option("sqlalchemy.url"), poolclass=pool.NullPool)
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


run_migrations_online()
