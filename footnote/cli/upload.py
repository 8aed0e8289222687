"""`footnote upload`: send files with a progress bar and wait for their ingestion."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import grpc
import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TransferSpeedColumn,
)

from footnote.cli.connection import ApiKeyOpt, ClientStateDirOpt, JsonOpt, TargetOpt, connect
from footnote.cli.documents import state_name
from footnote.cli.output import message_to_dict, print_json, print_table
from footnote.client import describe_rpc_error, error_field, upload_requests, wait_final
from footnote.v1 import documents_service_pb2 as dpb


def upload(
    files: Annotated[
        list[Path], typer.Argument(help="Files to upload.", exists=True, dir_okay=False)
    ],
    assistant: Annotated[
        str, typer.Option("--assistant", help="The assistant's id.", show_default=False)
    ],
    wait: Annotated[bool, typer.Option(help="Wait until each document is READY or FAILED.")] = True,
    as_json: JsonOpt = False,
    target: TargetOpt = None,
    api_key: ApiKeyOpt = None,
    state_dir: ClientStateDirOpt = None,
) -> None:
    """Upload documents with a progress bar, wait for ingestion, and print their states.

    Exits 1 when a file was rejected or its ingestion FAILED.
    """
    console = Console(stderr=True)
    results: list[tuple[Path, dpb.Document | None, grpc.RpcError | None]] = []
    with connect(target, api_key, state_dir) as client:
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
                    doc = client.documents.UploadDocument(
                        upload_requests(path, assistant, lambda n: progress.advance(total, n)),
                        metadata=client.metadata,
                    )
                    results.append((path, doc, None))
                except grpc.RpcError as err:
                    results.append((path, None, err))
        waiting = [i for i, (_, doc, _) in enumerate(results) if doc is not None]
        if wait and waiting:
            wait_columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
            with Progress(*wait_columns, console=console) as progress:
                ingest = progress.add_task("ingesting", total=len(waiting))
                for i in waiting:
                    path, doc, _ = results[i]
                    assert doc is not None
                    progress.update(ingest, description=f"ingesting {path.name}")
                    results[i] = (path, wait_final(client.documents, client.conn, doc.id), None)
                    progress.advance(ingest)
    failed = any(doc is None or doc.state == dpb.DOCUMENT_STATE_FAILED for _, doc, _ in results)
    if as_json:
        print_json({"uploads": [upload_result(path, doc, err) for path, doc, err in results]})
    else:
        rows = []
        for path, doc, err in results:
            if doc is None:
                rows.append((path.name, "-", "REJECTED", "-", "-", describe_rpc_error(err)))  # type: ignore[arg-type]
            else:
                rows.append(
                    (
                        path.name,
                        doc.id,
                        state_name(doc.state),
                        str(doc.chunk_count),
                        str(doc.page_count),
                        doc.error,
                    )
                )
        print_table(
            ("file", "document", "state", "chunks", "pages", "error"), rows, whole=("document",)
        )
    if failed:
        raise typer.Exit(1)


def upload_result(path: Path, doc: dpb.Document | None, err: grpc.RpcError | None) -> Any:
    """One file's outcome in --json: the Document, or the error that rejected the file."""
    if doc is not None:
        return {"file": str(path), "document": message_to_dict(doc)}
    assert err is not None
    code = err.code().name if isinstance(err, grpc.Call) else "UNKNOWN"
    error = {"code": code, "message": err.details() if isinstance(err, grpc.Call) else str(err)}
    if field := error_field(err):
        error["field"] = field
    return {"file": str(path), "error": error}
