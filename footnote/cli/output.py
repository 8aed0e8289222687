"""How API commands print: one JSON document, rich tables on a terminal, whole values when piped.

Piped (stdout not a terminal), tables and records are tab-separated lines with a header row,
and never cut a value short; tabs and newlines inside values are written as \\t and \\n.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from datetime import UTC
from typing import Any

from google.protobuf import json_format, timestamp_pb2
from google.protobuf.message import Message
from rich.console import Console
from rich.table import Table
from rich.text import Text


def stdout_is_terminal() -> bool:
    return sys.stdout.isatty()


def message_to_dict(message: Message) -> dict[str, Any]:
    """A proto message as JSON-ready data: proto field names, enum names, every plain field."""
    return json_format.MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )


def print_json(data: Message | dict[str, Any]) -> None:
    """Prints one JSON document on stdout."""
    if isinstance(data, Message):
        data = message_to_dict(data)
    sys.stdout.write(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
    sys.stdout.flush()


def print_deleted(kind: str, resource_id: str, as_json: bool) -> None:
    """What a delete command prints once the server has deleted the resource."""
    if as_json:
        print_json({"id": resource_id, "deleted": True})
    else:
        print(f"deleted {kind} {resource_id}")


def timestamp(ts: timestamp_pb2.Timestamp | None) -> str:
    """RFC 3339 in UTC to the second, or "" for an unset time."""
    if ts is None or (ts.seconds == 0 and ts.nanos == 0):
        return ""
    return ts.ToDatetime(tzinfo=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def escape_cell(value: str) -> str:
    return (
        value.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")
    )


def print_tsv(rows: Iterable[Sequence[str]]) -> None:
    for row in rows:
        sys.stdout.write("\t".join(escape_cell(cell) for cell in row) + "\n")
    sys.stdout.flush()


# Long free-text values fold inside their column; this much of one must fit on a line.
FOLDED_COLUMN_CHARS = 24


def print_table(
    columns: Sequence[str], rows: Sequence[Sequence[str]], *, whole: Sequence[str] = ("id",)
) -> None:
    """A rich table on a terminal, tab-separated lines otherwise.

    Columns named in `whole` (ids) are never wrapped or cut. On a terminal too narrow for the
    table, each row is shown as "field value" lines instead, so nothing is cut short.
    """
    if not stdout_is_terminal():
        print_tsv([columns, *rows])
        return
    console = Console(highlight=False)
    widths = [max([len(name), *(len(row[i]) for row in rows)]) for i, name in enumerate(columns)]
    needed = 1 + sum(
        (w if name in whole else min(w, FOLDED_COLUMN_CHARS)) + 3
        for name, w in zip(columns, widths, strict=True)
    )
    if needed > console.width:
        for i, row in enumerate(rows):
            if i:
                console.print()
            print_record(list(zip(columns, row, strict=True)), console)
        return
    table = Table(header_style="bold")
    for name, width in zip(columns, widths, strict=True):
        if name in whole:
            table.add_column(name, no_wrap=True, min_width=width)
        else:
            table.add_column(name, overflow="fold")
    for row in rows:
        # Text, not markup: a display name such as "[bold]x" is shown as written.
        table.add_row(*(Text(cell) for cell in row))
    console.print(table)


def print_record(fields: Sequence[tuple[str, str]], console: Console | None = None) -> None:
    """One resource as "field  value" lines: a two-column table on a terminal."""
    if not stdout_is_terminal():
        print_tsv([("field", "value"), *fields])
        return
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column("field", style="bold", no_wrap=True)
    table.add_column("value", overflow="fold")
    for name, value in fields:
        table.add_row(Text(name), Text(value))
    (console or Console(highlight=False)).print(table)


def text_console() -> Console:
    """For running text: styles on a terminal, nothing wrapped or interpreted as markup."""
    return Console(highlight=False, markup=False, soft_wrap=True, emoji=False)


def enum_name(enum: Any, value: int, prefix: str) -> str:
    """ "READY" for DOCUMENT_STATE_READY; the number when the server sent a newer value."""
    try:
        return str(enum.Name(value)).removeprefix(prefix)
    except ValueError:
        return str(value)
