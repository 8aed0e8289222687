"""The options every API command shares, and the one place its gRPC errors are reported."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, NoReturn

import grpc
import typer

from footnote.client import Client, NoServer, describe_rpc_error, resolve_connection

CONNECTION_PANEL = "Connection"

TargetOpt = Annotated[
    str | None,
    typer.Option(
        "--target",
        help="HOST:PORT of the server (or FOOTNOTE_TARGET).",
        rich_help_panel=CONNECTION_PANEL,
    ),
]
ApiKeyOpt = Annotated[
    str | None,
    typer.Option(
        "--api-key",
        help="API key (or FOOTNOTE_API_KEY).",
        rich_help_panel=CONNECTION_PANEL,
    ),
]
ClientStateDirOpt = Annotated[
    Path | None,
    typer.Option(
        "--state-dir",
        help="State dir of a running `footnote dev`; ./state is tried when no target is given.",
        rich_help_panel=CONNECTION_PANEL,
    ),
]
JsonOpt = Annotated[
    bool, typer.Option("--json", help="Print one JSON document on stdout instead of text.")
]
PageSizeOpt = Annotated[
    int | None,
    typer.Option(
        "--page-size", min=1, max=100, help="Fetch one page of this size instead of all pages."
    ),
]
PageTokenOpt = Annotated[
    str | None,
    typer.Option("--page-token", help="Fetch the page after an earlier next_page_token."),
]


def fail(message: str, code: int = 1) -> NoReturn:
    typer.echo(f"footnote: {message}", err=True)
    raise typer.Exit(code)


@contextmanager
def connect(target: str | None, api_key: str | None, state_dir: Path | None) -> Iterator[Client]:
    """A client for the server the options name; a failed call ends the command with exit 1
    and `footnote: CODE: message` on stderr, never a traceback."""
    try:
        conn = resolve_connection(target, api_key, state_dir)
    except NoServer as err:
        fail(str(err))
    client = Client(conn)
    try:
        yield client
    except grpc.RpcError as err:
        fail(describe_rpc_error(err))
    except KeyboardInterrupt:
        fail("interrupted", 130)
    finally:
        client.close()
