"""`footnote demo` (`make run`): the whole path from a fresh clone, then everything stops."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import grpc

from devstack.processes import terminate
from footnote.client import (
    Connection,
    cited_sources_lines,
    stream_answer,
    upload_requests,
    wait_final,
)
from footnote.v1 import assistants_service_pb2 as apb
from footnote.v1 import assistants_service_pb2_grpc as apb_grpc
from footnote.v1 import chat_service_pb2 as cpb
from footnote.v1 import chat_service_pb2_grpc as cpb_grpc
from footnote.v1 import documents_service_pb2 as dpb
from footnote.v1 import documents_service_pb2_grpc as dpb_grpc

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
READY = re.compile(r"^footnote: ready at (\S+)$")
KEY = re.compile(r"^footnote: api key (\S+)$")


def start_dev(state_dir: Path, llm: str | None) -> tuple[subprocess.Popen[str], Connection]:
    extra = ["--llm", llm] if llm else []
    proc = subprocess.Popen(
        [sys.executable, "-m", "footnote.cli", "dev", "--state-dir", str(state_dir), *extra],
        stdout=subprocess.PIPE,
        text=True,
        # The demo's own output is the story; the stack's logs stay in the state dir.
        env={**os.environ, "FOOTNOTE_LOG_LEVEL": "WARNING"},
    )
    target = key = None
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            if m := READY.match(line.strip()):
                target = m.group(1)
            elif m := KEY.match(line.strip()):
                key = m.group(1)
            if target and key:
                return proc, Connection(target, key)
    except BaseException:
        # Interrupted while the stack starts: it stops what it has started, then goes (after
        # Ctrl-C in a terminal it has had the signal already).
        terminate(proc)
        raise
    proc.wait()
    raise SystemExit(f"footnote dev exited with code {proc.returncode} before it was ready")


def run_demo(state_dir: Path | None, question: str, llm: str | None = None) -> None:
    owned = state_dir is None
    state = state_dir or Path(tempfile.mkdtemp(prefix="fndemo", dir="/tmp"))
    print(f"footnote demo: starting the embedded stack in {state}", flush=True)
    proc, conn = start_dev(state, llm)
    try:
        with grpc.insecure_channel(conn.target) as channel:
            assistant = apb_grpc.AssistantsServiceStub(channel).CreateAssistant(
                apb.CreateAssistantRequest(
                    assistant=apb.Assistant(
                        display_name="Company handbook",
                        settings=apb.AssistantSettings(
                            citation_link_mode=apb.CITATION_LINK_MODE_PUBLIC
                        ),
                    )
                ),
                metadata=conn.metadata,
            )
            docs = dpb_grpc.DocumentsServiceStub(channel)
            for path in sorted(p for p in EXAMPLES.iterdir() if p.is_file()):
                doc = docs.UploadDocument(
                    upload_requests(path, assistant.id, lambda n: None), metadata=conn.metadata
                )
                final = wait_final(docs, conn, doc.id)
                state_name = dpb.DocumentState.Name(final.state).removeprefix("DOCUMENT_STATE_")
                print(f"  {path.name}: {state_name}, {final.chunk_count} chunks", flush=True)
            print(f"\nQ: {question}\nA: ", end="", flush=True)
            response = stream_answer(
                cpb_grpc.ChatServiceStub(channel),
                conn,
                cpb.CompleteRequest(
                    assistant_id=assistant.id,
                    messages=[cpb.ChatMessage(role=cpb.ROLE_USER, content=question)],
                ),
                lambda text: print(text, end="", flush=True),
            )
            print("\n\nSources:")
            for line in cited_sources_lines(response):
                print(line)
    finally:
        terminate(proc)
        if owned:
            shutil.rmtree(state, ignore_errors=True)
    print("\nfootnote demo: done; every process of the stack has stopped", flush=True)
