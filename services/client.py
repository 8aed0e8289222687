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
