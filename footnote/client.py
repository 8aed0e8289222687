"""Client-side helpers for the CLI: where the server is, and the calls the commands make."""

from __future__ import annotations

import collections
import json
import mimetypes
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc

from footnote.v1 import chat_service_pb2 as chat_pb2
from footnote.v1 import chat_service_pb2_grpc as chat_pb2_grpc
from footnote.v1 import citations_pb2
from footnote.v1 import documents_service_pb2 as dpb
from footnote.v1 import documents_service_pb2_grpc as dpb_grpc

CLIENT_FILE = "client.json"
UPLOAD_PIECE_BYTES = 256 * 1024


@dataclass(frozen=True)
class Connection:
    target: str
    api_key: str

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.api_key}"),)


def resolve_connection(
    target: str | None, api_key: str | None, state_dir: Path | None
) -> Connection:
    """Flags first, then FOOTNOTE_TARGET / FOOTNOTE_API_KEY, then a dev stack on state_dir."""
    target = target or os.environ.get("FOOTNOTE_TARGET")
    api_key = api_key or os.environ.get("FOOTNOTE_API_KEY")
    if state_dir is not None and not (target and api_key):
        path = state_dir / CLIENT_FILE
        if not path.exists():
            raise ValueError(f"no running footnote dev in {state_dir}")
        running = json.loads(path.read_text())
        target = target or running["target"]
        api_key = api_key or running["api_key"]
    if not target or not api_key:
        raise ValueError("say where the server is: --target and --api-key, or --state-dir")
    return Connection(target, api_key)


def upload_requests(
    path: Path, assistant_id: str, on_bytes: Callable[[int], None]
) -> Iterator[dpb.UploadDocumentRequest]:
    content_type = mimetypes.guess_type(path.name)[0] or ""
    yield dpb.UploadDocumentRequest(
        metadata=dpb.UploadDocumentMetadata(
            assistant_id=assistant_id, display_name=path.name, content_type=content_type
        )
    )
    with path.open("rb") as f:
        while piece := f.read(UPLOAD_PIECE_BYTES):
            yield dpb.UploadDocumentRequest(chunk=piece)
            on_bytes(len(piece))


def wait_final(stub: dpb_grpc.DocumentsServiceStub, conn: Connection, doc_id: str) -> dpb.Document:
    updates = stub.WatchDocument(dpb.WatchDocumentRequest(id=doc_id), metadata=conn.metadata)
    # The stream ends with the final state; only that one matters here.
    return collections.deque(updates, maxlen=1)[0]


def open_channel(conn: Connection) -> grpc.Channel:
    return grpc.insecure_channel(conn.target)


def describe_location(source: citations_pb2.CitationSource) -> str:
    loc = source.location
    parts = []
    if loc.page_start:
        pages = (
            loc.page_start
            if loc.page_end in (0, loc.page_start)
            else f"{loc.page_start}-{loc.page_end}"
        )
        parts.append(f"p. {pages}")
    if loc.start_line:
        parts.append(f"lines {loc.start_line}-{loc.end_line}")
    if loc.heading_path:
        parts.append("§" + " > ".join(loc.heading_path))
    return ", ".join(parts)


def stream_answer(
    stub: chat_pb2_grpc.ChatServiceStub,
    conn: Connection,
    request: chat_pb2.CompleteRequest,
    write: Callable[[str], None],
) -> chat_pb2.CompleteResponse:
    """Writes the answer as it streams in and returns the final message."""
    for event in stub.StreamComplete(request, metadata=conn.metadata):
        kind = event.WhichOneof("event")
        if kind == "delta":
            write(event.delta.content)
        elif kind == "complete":
            return event.complete
    raise RuntimeError("the stream ended without a complete message")


def cited_sources_lines(response: chat_pb2.CompleteResponse) -> list[str]:
    """One line per cited source: number, document, location, link."""
    if not response.HasField("citations"):
        return []
    cited = set(response.citations.referenced_indices)
    lines = []
    for source in response.citations.sources:
        if source.index not in cited:
            continue
        line = f"[{source.index}] {source.document_name}"
        where = describe_location(source)
        if where:
            line += f" ({where})"
        if source.download_url:
            line += f"\n    {source.download_url}"
        lines.append(line)
    return lines
