"""Client-side helpers for the CLI: where the server is, and the calls the commands make."""

from __future__ import annotations

import collections
import hashlib
import json
import mimetypes
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol, TypeVar

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from footnote.v1 import assistants_service_pb2_grpc as apb_grpc
from footnote.v1 import chat_service_pb2 as chat_pb2
from footnote.v1 import chat_service_pb2_grpc as chat_pb2_grpc
from footnote.v1 import citations_pb2
from footnote.v1 import conversations_service_pb2_grpc as cvpb_grpc
from footnote.v1 import documents_service_pb2 as dpb
from footnote.v1 import documents_service_pb2_grpc as dpb_grpc

CLIENT_FILE = "client.json"
DEFAULT_STATE_DIR = Path("state")
UPLOAD_PIECE_BYTES = 256 * 1024
NO_SERVER = "no server: start `footnote dev` or pass --target and --api-key"


class NoServer(ValueError):
    """Nothing says where the server is, or the place named holds no running dev stack."""


@dataclass(frozen=True)
class Connection:
    target: str
    api_key: str

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.api_key}"),)


def read_client_file(state_dir: Path) -> dict[str, str] | None:
    """The target and key a running `footnote dev` wrote into state_dir, or None."""
    path = state_dir / CLIENT_FILE
    try:
        running = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        raise NoServer(f"cannot read {path}: {err}") from None
    if not isinstance(running, dict) or not {"target", "api_key"} <= running.keys():
        raise NoServer(f"{path} does not say where the server is; restart `footnote dev`")
    return running


def resolve_connection(
    target: str | None, api_key: str | None, state_dir: Path | None
) -> Connection:
    """Flags first, then FOOTNOTE_TARGET / FOOTNOTE_API_KEY, then a running `footnote dev`.

    The dev stack is looked for in state_dir when given; without it and without a target, in
    FOOTNOTE_STATE_DIR or ./state, where `footnote dev` runs by default.
    """
    target = target or os.environ.get("FOOTNOTE_TARGET")
    api_key = api_key or os.environ.get("FOOTNOTE_API_KEY")
    if target and api_key:
        return Connection(target, api_key)
    if state_dir is not None:
        running = read_client_file(state_dir)
        if running is None:
            raise NoServer(
                f"no running footnote dev in {state_dir}: start `footnote dev --state-dir "
                f"{state_dir}` or pass --target and --api-key"
            )
    elif not target:
        default = Path(os.environ.get("FOOTNOTE_STATE_DIR") or DEFAULT_STATE_DIR)
        running = read_client_file(default)
        if running is None:
            raise NoServer(NO_SERVER)
    else:
        raise NoServer("--target needs an API key: pass --api-key or set FOOTNOTE_API_KEY")
    return Connection(target or running["target"], api_key or running["api_key"])


class Client:
    """One channel to the server and a stub per service; use it as a context manager."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.channel = grpc.insecure_channel(conn.target)
        self.assistants = apb_grpc.AssistantsServiceStub(self.channel)
        self.documents = dpb_grpc.DocumentsServiceStub(self.channel)
        self.conversations = cvpb_grpc.ConversationsServiceStub(self.channel)
        self.chat = chat_pb2_grpc.ChatServiceStub(self.channel)

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        return self.conn.metadata

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Page(Protocol):
    next_page_token: str


R = TypeVar("R", bound=Page)


def pages(
    call: Callable[..., R], request: Any, metadata: tuple[tuple[str, str], ...]
) -> Iterator[R]:
    """Every page of a List call, following next_page_token from request's page on."""
    while True:
        page = call(request, metadata=metadata)
        yield page
        if not page.next_page_token:
            return
        request.page_token = page.next_page_token


def describe_rpc_error(err: grpc.RpcError) -> str:
    """'CODE: message', with the field an INVALID_ARGUMENT names when its ErrorInfo says."""
    code = err.code() if isinstance(err, grpc.Call) else None
    text = f"{code.name if code else 'UNKNOWN'}: {err.details() if code else err}"
    field = error_field(err)
    if field:
        text += f" (field {field})"
    return text


def error_field(err: grpc.RpcError) -> str:
    if not isinstance(err, grpc.Call):
        return ""
    try:
        status = rpc_status.from_call(err)
    except ValueError:  # a status whose details disagree with the call's code or message
        return ""
    for detail in status.details if status else ():
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            return info.metadata.get("field", "")
    return ""


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


def download(
    client: Client, doc_id: str, sink: IO[bytes], on_bytes: Callable[[int], None]
) -> tuple[int, str]:
    """Streams a document's bytes into sink; returns how many were written and their sha256."""
    digest = hashlib.sha256()
    written = 0
    request = dpb.DownloadDocumentRequest(id=doc_id)
    for response in client.documents.DownloadDocument(request, metadata=client.metadata):
        sink.write(response.chunk)
        digest.update(response.chunk)
        written += len(response.chunk)
        on_bytes(len(response.chunk))
    return written, digest.hexdigest()


def location_parts(loc: citations_pb2.SourceLocation) -> list[str]:
    """What is known of where a passage sits: pages, lines, paragraphs, "§Heading > Sub"."""
    parts = []
    if loc.page_start:
        parts.append(f"p. {_range(loc.page_start, loc.page_end)}")
    if loc.start_line:
        word = "line" if loc.end_line in (0, loc.start_line) else "lines"
        parts.append(f"{word} {_range(loc.start_line, loc.end_line)}")
    if loc.paragraph_start:
        parts.append(f"¶ {_range(loc.paragraph_start, loc.paragraph_end)}")
    if loc.heading_path or loc.heading:
        parts.append("§" + (" > ".join(loc.heading_path) or loc.heading))
    return parts


def _range(start: int, end: int) -> str:
    return str(start) if end in (0, start) else f"{start}-{end}"


def describe_location(source: citations_pb2.CitationSource) -> str:
    return ", ".join(location_parts(source.location))


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


def cited_sources(citations: citations_pb2.Citations) -> list[citations_pb2.CitationSource]:
    cited = set(citations.referenced_indices)
    return [source for source in citations.sources if source.index in cited]


def cited_sources_lines(response: chat_pb2.CompleteResponse) -> list[str]:
    """One line per cited source: number, document, location, link."""
    if not response.HasField("citations"):
        return []
    return source_lines(response.citations)


def source_lines(citations: citations_pb2.Citations) -> list[str]:
    """One line per cited source: number, document, location, staleness, link."""
    lines = []
    for source in cited_sources(citations):
        line = f"[{source.index}] {source.document_name}"
        where = describe_location(source)
        if where:
            line += f" ({where})"
        if source.stale:
            line += " (changed since)"
        if source.download_url:
            line += f"\n    {source.download_url}"
        lines.append(line)
    return lines


def styled_sources_lines(citations: citations_pb2.Citations) -> list[str]:
    """Each cited source as the server rendered it in the requested style (`formatted`),
    then where it sits and its link when the style leaves them out."""
    lines = []
    for source in cited_sources(citations):
        line = f"[{source.index}] {source.formatted or source.document_name}"
        # The style may already say where the source sits or link to it; say the rest.
        where = [part for part in location_parts(source.location) if part not in source.formatted]
        if where:
            line += "\n    " + ", ".join(where)
        if source.stale:
            line += "\n    (changed since)"
        if source.download_url and source.download_url not in source.formatted:
            line += f"\n    {source.download_url}"
        lines.append(line)
    return lines
