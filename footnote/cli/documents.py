"""`footnote documents`: list, show, delete and download uploaded documents."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from enum import StrEnum
from pathlib import Path
from typing import IO, Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

from footnote.cli.connection import (
    ApiKeyOpt,
    ClientStateDirOpt,
    JsonOpt,
    PageSizeOpt,
    PageTokenOpt,
    TargetOpt,
    connect,
    fail,
)
from footnote.cli.output import (
    enum_name,
    message_to_dict,
    print_deleted,
    print_json,
    print_record,
    print_table,
    timestamp,
)
from footnote.client import download as download_bytes
from footnote.client import pages
from footnote.v1 import documents_service_pb2 as dpb

app = typer.Typer(
    help="List, show, watch, delete and download documents, and make download links "
    "(upload them with `footnote upload`).",
    no_args_is_help=True,
)

IdArg = Annotated[str, typer.Argument(metavar="ID", help="The document's id.", show_default=False)]


class State(StrEnum):
    pending = "pending"
    processing = "processing"
    ready = "ready"
    failed = "failed"


STATES = {
    State.pending: dpb.DOCUMENT_STATE_PENDING,
    State.processing: dpb.DOCUMENT_STATE_PROCESSING,
    State.ready: dpb.DOCUMENT_STATE_READY,
    State.failed: dpb.DOCUMENT_STATE_FAILED,
}


def state_name(value: int) -> str:
    return enum_name(dpb.DocumentState, value, "DOCUMENT_STATE_")


def document_fields(d: dpb.Document) -> list[tuple[str, str]]:
    return [
        ("id", d.id),
        ("assistant_id", d.assistant_id),
        ("display_name", d.display_name),
        ("content_type", d.content_type),
        ("size_bytes", str(d.size_bytes)),
        ("sha256", d.sha256),
        ("state", state_name(d.state)),
        ("error", d.error),
        ("chunk_count", str(d.chunk_count)),
        ("page_count", str(d.page_count)),
        ("create_time", timestamp(d.create_time)),
        ("update_time", timestamp(d.update_time)),
        ("indexed_time", timestamp(d.indexed_time)),
    ]


@app.command("list")
def list_(
    assistant: Annotated[
        str | None,
        typer.Option("--assistant", help="Only this assistant's documents.", show_default=False),
    ] = None,
    state: Annotated[
        State | None, typer.Option("--state", help="Only documents in this state.")
    ] = None,
    page_size: PageSizeOpt = None,
    page_token: PageTokenOpt = None,
    as_json: JsonOpt = False,
    target: TargetOpt = None,
    api_key: ApiKeyOpt = None,
    state_dir: ClientStateDirOpt = None,
) -> None:
    """List documents with their ingestion state: every page, or one with --page-size."""
    request = dpb.ListDocumentsRequest(
        assistant_id=assistant or "",
        state=STATES[state] if state else dpb.DOCUMENT_STATE_UNSPECIFIED,
        page_size=page_size or 0,
        page_token=page_token or "",
    )
    with connect(target, api_key, state_dir) as client:
        call = client.documents.ListDocuments
        if page_size or page_token:
            result = call(request, metadata=client.metadata)
        else:
            result = dpb.ListDocumentsResponse()
            for page in pages(call, request, client.metadata):
                result.documents.extend(page.documents)
    if as_json:
        print_json(result)
        return
    rows = [
        (
            d.id,
            d.display_name,
            state_name(d.state),
            str(d.size_bytes),
            str(d.chunk_count),
            str(d.page_count),
            d.assistant_id,
            timestamp(d.create_time),
        )
        for d in result.documents
    ]
    columns = ("id", "display_name", "state", "bytes", "chunks", "pages", "assistant_id")
    print_table((*columns, "create_time"), rows, whole=("id", "assistant_id"))
    if result.next_page_token:
        typer.echo(f"next page: --page-token {result.next_page_token}", err=True)


@app.command()
def get(
    document_id: IdArg,
    as_json: JsonOpt = False,
    target: TargetOpt = None,
    api_key: ApiKeyOpt = None,
    state_dir: ClientStateDirOpt = None,
) -> None:
    """Show one document: state, size, sha256, chunks, pages and times."""
    with connect(target, api_key, state_dir) as client:
        document = client.documents.GetDocument(
            dpb.GetDocumentRequest(id=document_id), metadata=client.metadata
        )
    if as_json:
        print_json(document)
    else:
        print_record(document_fields(document))


@app.command()
def delete(
    document_id: IdArg,
    as_json: JsonOpt = False,
    target: TargetOpt = None,
    api_key: ApiKeyOpt = None,
    state_dir: ClientStateDirOpt = None,
) -> None:
    """Delete a document: its chunks stop being retrievable at once, its bytes go soon after."""
    with connect(target, api_key, state_dir) as client:
        client.documents.DeleteDocument(
            dpb.DeleteDocumentRequest(id=document_id), metadata=client.metadata
        )
    print_deleted("document", document_id, as_json)


@app.command()
def download(
    document_id: IdArg,
    output: Annotated[
        Path | None,
        typer.Option(
            "--output",
            "-o",
            help="Write the bytes to this file instead of stdout.",
            dir_okay=False,
            show_default=False,
        ),
    ] = None,
    as_json: JsonOpt = False,
    target: TargetOpt = None,
    api_key: ApiKeyOpt = None,
    state_dir: ClientStateDirOpt = None,
) -> None:
    """Download a document's original bytes and check them against its sha256.

    A progress bar shows on a terminal. With -o the file appears only once the bytes are
    complete and match; --json needs -o and prints the document with where it was written.
    """
    if as_json and output is None:
        raise typer.BadParameter("--json prints the result on stdout: pass -o FILE for the bytes")
    with connect(target, api_key, state_dir) as client:
        document = client.documents.GetDocument(
            dpb.GetDocumentRequest(id=document_id), metadata=client.metadata
        )
        console = Console(stderr=True)
        with (
            Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                DownloadColumn(),
                TransferSpeedColumn(),
                console=console,
                disable=not console.is_terminal,
            ) as progress,
            open_sink(output) as (sink, finish),
        ):
            task = progress.add_task(
                f"downloading {document.display_name}", total=document.size_bytes or None
            )
            written, sha256 = download_bytes(
                client, document_id, sink, lambda n: progress.advance(task, n)
            )
            if sha256 != document.sha256:
                fail(
                    f"the downloaded bytes do not match the document: sha256 {sha256}, "
                    f"expected {document.sha256}"
                    + (f"; {output} was not written" if output else "")
                )
            finish()
    if as_json:
        print_json(
            {
                "document": message_to_dict(document),
                "path": str(output),
                "bytes_written": written,
                "sha256": sha256,
            }
        )
    elif output is not None:
        typer.echo(f"wrote {written} bytes to {output} (sha256 {sha256} verified)", err=True)


@contextlib.contextmanager
def open_sink(output: Path | None) -> Iterator[tuple[IO[bytes], Callable[[], None]]]:
    """Stdout, or a temporary file beside `output` that finish() renames into place; a
    download that fails or does not match leaves no file behind."""
    if output is None:
        yield sys.stdout.buffer, sys.stdout.buffer.flush
        return
    partial = output.with_name(f".{output.name}.part")
    try:
        sink: IO[bytes] = partial.open("wb")
    except OSError as err:
        fail(f"cannot write {output}: {err.strerror}")
    done = False

    def finish() -> None:
        nonlocal done
        sink.close()
        os.replace(partial, output)
        done = True

    try:
        yield sink, finish
    finally:
        if not done:
            sink.close()
            partial.unlink(missing_ok=True)


@app.command()
def watch(
    document_id: IdArg,
    as_json: JsonOpt = False,
    target: TargetOpt = None,
    api_key: ApiKeyOpt = None,
    state_dir: ClientStateDirOpt = None,
) -> None:
    """Print each state change of a document until it is READY or FAILED; exit 1 on FAILED.

    With --json, prints the final document once.
    """
    final = None
    with connect(target, api_key, state_dir) as client:
        request = dpb.WatchDocumentRequest(id=document_id)
        for document in client.documents.WatchDocument(request, metadata=client.metadata):
            final = document
            if not as_json:
                line = f"{timestamp(document.update_time)}\t{state_name(document.state)}"
                typer.echo(line + (f"\t{document.error}" if document.error else ""))
    if final is None:
        fail("the watch ended without a state")
    if as_json:
        print_json(final)
    if final.state == dpb.DOCUMENT_STATE_FAILED:
        raise typer.Exit(1)


@app.command()
def url(
    document_id: IdArg,
    ttl: Annotated[
        int,
        typer.Option("--ttl", min=1, help="Seconds the link stays valid, at most 604800 (7 days)."),
    ] = 3600,
    as_json: JsonOpt = False,
    target: TargetOpt = None,
    api_key: ApiKeyOpt = None,
    state_dir: ClientStateDirOpt = None,
) -> None:
    """Print a presigned URL that downloads the document without a key until it expires."""
    request = dpb.GetDownloadUrlRequest(document_id=document_id)
    request.ttl.FromSeconds(ttl)
    with connect(target, api_key, state_dir) as client:
        link = client.documents.GetDownloadUrl(request, metadata=client.metadata)
    if as_json:
        print_json(link)
    else:
        typer.echo(link.url)
        typer.echo(f"expires {timestamp(link.expire_time)}", err=True)
