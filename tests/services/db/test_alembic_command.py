"""The standard alembic commands work from the repository root with FOOTNOTE_DATABASE_URL."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from services.db import migrate

ROOT = Path(__file__).resolve().parents[3]
ALEMBIC = Path(sys.executable).with_name("alembic")


def alembic(*args: str, database_url: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FOOTNOTE_")}
    if database_url is not None:
        env["FOOTNOTE_DATABASE_URL"] = database_url
    return subprocess.run(
        [str(ALEMBIC), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )


def test_alembic_current_reports_the_head_of_the_test_database(settings):
    head = migrate.current_revision(settings.database_url)
    assert head
    done = alembic("current", database_url=settings.database_url)
    assert done.returncode == 0, done.stderr
    assert f"{head} (head)" in done.stdout


def test_upgrade_head_is_a_no_op_on_an_up_to_date_database(settings):
    before = migrate.current_revision(settings.database_url)
    done = alembic("upgrade", "head", database_url=settings.database_url)
    assert done.returncode == 0, done.stderr
    assert migrate.current_revision(settings.database_url) == before


def test_history_lists_every_revision_without_a_database():
    done = alembic("history", database_url=None)
    assert done.returncode == 0, done.stderr
    versions = ROOT / "services" / "db" / "migrations" / "versions"
    revisions = sorted(p.name.split("_")[0] for p in versions.glob("[0-9]*.py"))
    assert revisions and all(rev in done.stdout for rev in revisions)


def test_a_missing_url_is_a_clear_error():
    done = alembic("current", database_url=None)
    assert done.returncode != 0
    assert "set FOOTNOTE_DATABASE_URL" in done.stderr
