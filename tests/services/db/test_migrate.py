"""Migrations run to head, and a second run changes nothing."""

from __future__ import annotations

from sqlalchemy import create_engine, inspect, text

from services.db import migrate
from services.db.session import normalize_url


def schema_snapshot(url: str) -> dict[str, list[str]]:
    engine = create_engine(normalize_url(url))
    try:
        insp = inspect(engine)
        return {t: sorted(c["name"] for c in insp.get_columns(t)) for t in insp.get_table_names()}
    finally:
        engine.dispose()


def test_migrate_twice_is_a_no_op(settings):
    url = settings.database_url
    before = schema_snapshot(url)
    assert {"api_keys", "assistants", "alembic_version"} <= set(before)
    head = migrate.current_revision(url)
    migrate.upgrade(url)
    assert migrate.current_revision(url) == head
    assert schema_snapshot(url) == before


def test_models_match_the_migrations(settings):
    """Autogenerate finds nothing to add: the models and the migration files agree."""
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    from services.db.models import Base

    engine = create_engine(normalize_url(settings.database_url))
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
            diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    finally:
        engine.dispose()
    assert diff == []
