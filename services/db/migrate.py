"""Runs the Alembic migrations to head; a second run is a no-op."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

from services.db.session import normalize_url

MIGRATIONS = Path(__file__).with_name("migrations")


def alembic_config(database_url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    # ConfigParser interpolation would choke on a % in a password.
    cfg.set_main_option("sqlalchemy.url", normalize_url(database_url).replace("%", "%%"))
    return cfg


def upgrade(database_url: str) -> None:
    command.upgrade(alembic_config(database_url), "head")


def current_revision(database_url: str) -> str | None:
    from alembic.runtime.migration import MigrationContext
    from sqlalchemy import create_engine

    engine = create_engine(normalize_url(database_url))
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()
